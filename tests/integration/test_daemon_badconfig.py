"""spotd's configuration at the door: `spotd --config FILE -n` on good and
bad files (errors read `file:line: message`, every error reported), the
command line beating the file, missing --job/--store, no command, unknown
options, `spotd --help` / `--version`, a world-writable file refused,
the exit statuses (64 a bad command line, 78 a bad config file or value,
never the 1 or 2 a trainer may exit with), and the shipped example (systemd/spotd.conf) parsing. Nothing here
starts a trainer or needs S3."""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

GOOD = """# a comment
[spotd]
job = train-1
store = s3://bucket/prefix
command = /usr/bin/python3 train.py --lr 0.1
provider = none
interval = 5m
keep = 2
"""

# (file text, [(line, regex of the message)])
BAD = [
    ("[spotd]\njob = a\nstore = s3://bkt/p\ncolour = blue\n",
     [(4, r"unknown key 'colour'")]),
    ("[spotd]\njob = a\nstore = s3://bkt/p\nprovider = mars\n",
     [(4, r"provider")]),
    ("[spotd]\njob = a\nstore = http://b/p\n", [(3, r"store")]),
    ("[spotd]\njob = a\nstore = s3://bkt/p\ninterval = soon\n",
     [(4, r"interval")]),
    ("job = a\n[spotd]\nstore = s3://bkt/p\n",
     [(1, r"before the \[spotd\] section")]),
    ("[spotd]\njob = a\nstore = s3://bkt/p\njust words\n",
     [(4, r"expected 'key = value'")]),
    ("[spotd]\njob = a\njob = b\nstore = s3://bkt/p\n",
     [(3, r"duplicate key 'job'")]),
    ("[other]\njob = a\n", [(1, r"unknown section")]),
    ("[spotd]\njob = a\nstore = s3://bkt/p\naws_secret_access_key = x\n",
     [(4, r"credentials are never read")]),
    # two errors: both reported
    ("[spotd]\njob = a\nstore = s3://bkt/p\nkeep = many\nsignal = KILL\n",
     [(4, r"keep"), (5, r"signal")]),
]


# spotd's statuses for a bad command line and a bad config (sysexits
# EX_USAGE, EX_CONFIG): a wrapper tells them from a trainer's 1 or 2.
USAGE = 64
CONFIG = 78


def spotd(*args, timeout=20):
    return sl.run([sl.spotd_exe()] + [str(a) for a in args], timeout=timeout,
                  env={"AWS_EC2_METADATA_DISABLED": "true"})


def main():
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-config-") as wd:
        good = os.path.join(wd, "good.conf")
        with open(good, "w") as f:
            f.write(GOOD)
        os.chmod(good, 0o640)
        for flag in ("-n", "--check-config"):
            cp = spotd("--config", good, flag)
            c.check(cp.returncode == 0 and "configuration OK" in cp.stdout and
                    cp.stderr == "", "good file: %s says OK" % flag,
                    cp.stdout + cp.stderr)

        # the Kubernetes ConfigMap's file: the pod gives the command
        # after '--', so the file has none; docs/kubernetes.md checks it
        # the way the pod runs it
        import yaml
        with open(sl.srcdir_path("deploy", "kubernetes", "config.yaml")) as f:
            cm = [d for d in yaml.safe_load_all(f)
                  if d and d.get("kind") == "ConfigMap"][0]
        k8s = os.path.join(wd, "k8s.conf")
        with open(k8s, "w") as f:
            f.write(cm["data"]["spotd.conf"])
        os.chmod(k8s, 0o640)
        cp = spotd("run", "--config", k8s, "--check-config", "--", "true")
        c.check(cp.returncode == 0 and cp.stdout.strip() ==
                "configuration OK", "spotd run --config FILE --check-config "
                "-- CMD says OK", cp.stdout + cp.stderr)

        for i, (text, errs) in enumerate(BAD):
            path = os.path.join(wd, "bad%d.conf" % i)
            with open(path, "w") as f:
                f.write(text)
            cp = spotd("--config", path, "-n")
            lines = [l for l in cp.stderr.splitlines() if l.strip()]
            ok = cp.returncode == CONFIG and "configuration OK" not in cp.stdout
            for line, rx in errs:
                ok = ok and any(l.startswith("%s:%d: " % (path, line)) and
                                re.search(rx, l) for l in lines)
            c.check(ok, "bad file %d: %s" % (i, "; ".join(
                "line %d /%s/" % e for e in errs)),
                "rc=%d stderr=%r" % (cp.returncode, cp.stderr))

        # the command line beats the file
        cp = spotd("--config", good, "--provider", "mars", "-n")
        c.check(cp.returncode == CONFIG and "provider" in cp.stderr,
                "a bad option value on the command line", cp.stderr)
        cp = spotd("--config", good, "--job", "other-job", "-n")
        c.check(cp.returncode == 0, "an option overrides the file", cp.stderr)

        # missing --job / --store / command
        cp = spotd("run", "--store", "s3://bkt/p", "--provider", "none", "--",
                   "/bin/true")
        c.check(cp.returncode == CONFIG and re.search(r"job", cp.stderr) and
                not os.path.exists("spotd.sock"),
                "missing --job: refused before anything starts", cp.stderr)
        cp = spotd("run", "--job", "a", "--provider", "none", "--", "/bin/true")
        c.check(cp.returncode == CONFIG and re.search(r"store", cp.stderr),
                "missing --store: refused", cp.stderr)
        cp = spotd("run", "--job", "a/b", "--store", "s3://bkt/p", "-n", "--",
                   "/bin/true")
        c.check(cp.returncode == CONFIG and "job" in cp.stderr,
                "a job id with '/': refused", cp.stderr)
        noc = os.path.join(wd, "nocmd.conf")
        with open(noc, "w") as f:
            f.write("[spotd]\njob = a\nstore = s3://bkt/p\n")
        cp = spotd("--config", noc, "--provider", "none")
        c.check(cp.returncode == USAGE and "no training command" in cp.stderr,
                "no command: refused with a hint", cp.stderr)
        cp = spotd("--config", noc, "-n")
        c.check(cp.returncode == CONFIG and "command is required" in cp.stderr,
                "-n: a service config without a command is incomplete",
                cp.stderr)
        cp = spotd("run", "--config", noc, "-n", "--", "/bin/true")
        c.check(cp.returncode == 0, "-n with spotd run -- CMD: OK", cp.stderr)
        cp = spotd("--frobnicate")
        c.check(cp.returncode == USAGE and "unknown option" in cp.stderr and
                "spotd --help" in cp.stderr, "an unknown option", cp.stderr)
        cp = spotd("run", "--provider", "none", "--job")
        c.check(cp.returncode == USAGE and "missing value" in cp.stderr,
                "an option without its value: a usage error", cp.stderr)
        cp = spotd("--config", good, "stray")
        c.check(cp.returncode == USAGE and "unexpected argument" in cp.stderr,
                "a stray argument: a usage error", cp.stderr)
        cp = spotd("--config", os.path.join(wd, "missing.conf"), "-n")
        c.check(cp.returncode == CONFIG and "missing.conf" in cp.stderr,
                "a missing config file", cp.stderr)

        # help and version
        cp = spotd("--help")
        c.check(cp.returncode == 0 and cp.stdout.startswith("Usage: spotd run")
                and "--job" in cp.stdout and "SPOTD_RESUME_DIR" in cp.stdout and
                cp.stderr == "", "spotd --help", cp.stderr)
        cp = spotd("--version")
        c.check(cp.returncode == 0 and re.match(r"spotd \d+\.\d+", cp.stdout),
                "spotd --version: %s" % cp.stdout.strip())

        # a world-writable config is refused
        ww = os.path.join(wd, "ww.conf")
        with open(ww, "w") as f:
            f.write(GOOD)
        os.chmod(ww, 0o666)
        cp = spotd("--config", ww, "-n")
        c.check(cp.returncode == CONFIG and "world-writable" in cp.stderr,
                "a world-writable config file is refused", cp.stderr)

        # the shipped example parses (job/store are commented out there)
        ex = sl.srcdir_path("systemd", "spotd.conf")
        cp = spotd("--config", ex, "--job", "j", "--store", "s3://bkt/p",
                   "--command", "/bin/true", "-n")
        c.check(cp.returncode == 0, "systemd/spotd.conf parses", cp.stderr)
        cp = spotd("--print-config-example")
        with open(ex) as f:
            c.check(cp.returncode == 0 and cp.stdout == f.read(),
                    "systemd/spotd.conf is what --print-config-example prints")
    c.finish()


if __name__ == "__main__":
    main()
