"""The generated unit (build/systemd/spotd.service): `systemd-analyze
verify` exits 0 with an EMPTY stderr (it exits 0 even for "ignoring"
warnings), the offline security exposure is at most 3.0, the directives
README "Running as a service" relies on are there, `meson install` puts
the unit, the sysusers entry and the config example where systemd looks,
and the sysusers entry creates the spotd user (dry run)."""
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

MAX_EXPOSURE = 3.0


def directives(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;[" or "=" not in line:
            continue
        k, v = line.split("=", 1)
        out.setdefault(k.strip(), []).append(v.strip())
    return out


def seconds(v):
    m = re.fullmatch(r"(\d+)\s*(s|sec|min|m)?", v)
    if not m:
        return -1
    return int(m.group(1)) * (60 if m.group(2) in ("min", "m") else 1)


def main():
    if shutil.which("systemd-analyze") is None:
        sl.skip("systemd-analyze is not installed")
    c = sl.Checks()
    unit = sl.builddir_path("systemd", "spotd.service")
    spotd = sl.spotd_exe()
    with open(unit) as f:
        text = f.read()
    d = directives(text)
    with tempfile.TemporaryDirectory(prefix="spotd-unit-") as wd:
        # verify needs ExecStart's binary: a copy of the unit naming the
        # build's spotd (the installed path is checked below)
        m = re.search(r"(?m)^ExecStart=(\S+)", text)
        c.check(m is not None and m.group(1).endswith("/bin/spotd"),
                "ExecStart runs BINDIR/spotd", m.group(0) if m else text[:200])
        copy = os.path.join(wd, "spotd.service")
        with open(copy, "w") as f:
            f.write(re.sub(r"(?m)^ExecStart=\S+", "ExecStart=" + spotd, text))
        cp = sl.run(["systemd-analyze", "verify", copy], timeout=60)
        c.check(cp.returncode == 0 and cp.stderr == "" and cp.stdout == "",
                "systemd-analyze verify: exit 0, no output",
                "rc=%d\n%s%s" % (cp.returncode, cp.stdout, cp.stderr))

        cp = sl.run(["systemd-analyze", "security", "--offline=true", copy],
                    timeout=60)
        m = re.search(r"Overall exposure level for spotd.service: ([0-9.]+)",
                      cp.stdout)
        score = float(m.group(1)) if m else 99.0
        print("exposure score: %.1f" % score)
        c.check(m is not None and score <= MAX_EXPOSURE,
                "systemd-analyze security --offline: exposure %.1f <= %.1f" %
                (score, MAX_EXPOSURE), cp.stdout[-2000:] + cp.stderr)

        # what README "Running as a service" relies on
        want = {"Type": "notify", "NotifyAccess": "main",
                "ProtectSystem": "strict", "PrivateTmp": "yes",
                "NoNewPrivileges": "yes", "StateDirectory": "spotd",
                "RuntimeDirectory": "spotd", "ConfigurationDirectory": "spotd",
                "User": "spotd"}
        for k, v in want.items():
            c.check(d.get(k) == [v], "%s=%s" % (k, v), repr(d.get(k)))
        wds = seconds(d.get("WatchdogSec", ["-"])[0])
        c.check(0 < wds <= 300, "WatchdogSec=%s" % d.get("WatchdogSec"))
        # spotd's own SIGTERM drain is 90 s (engine.c SIGTERM_DRAIN_MS); the
        # stop timeout must leave room for it
        tss = seconds(d.get("TimeoutStopSec", ["-"])[0])
        c.check(tss > 90, "TimeoutStopSec=%s is above the 90 s drain" %
                d.get("TimeoutStopSec"))
        c.check("75" in " ".join(d.get("SuccessExitStatus", [])),
                "SuccessExitStatus=75 (a handled preemption)")
        c.check(d.get("KillMode") == ["mixed"],
                "KillMode=mixed (spotd stops its trainer itself)")
        c.check("ExecReload" not in d,
                "no ExecReload (reload is not supported)")

        # meson install: unit, sysusers, config example
        dest = os.path.join(wd, "dest")
        cp = sl.run(["meson", "install", "-C", sl.BUILDDIR, "--no-rebuild",
                     "--destdir", dest], timeout=120)
        c.check(cp.returncode == 0, "meson install --destdir", cp.stdout[-1000:]
                + cp.stderr[-1000:])
        found = {}
        for root, _, files in os.walk(dest):
            for n in files:
                found[os.path.relpath(os.path.join(root, n), dest)] = \
                    os.path.join(root, n)
        inst_unit = [p for p in found if p.endswith(
            "lib/systemd/system/spotd.service")]
        inst_sysusers = [p for p in found if p.endswith("lib/sysusers.d/spotd.conf")]
        inst_conf = [p for p in found if p.endswith("etc/spotd/spotd.conf")]
        c.check(len(inst_unit) == 1 and open(found[inst_unit[0]]).read() == text,
                "the unit is installed: %s" % inst_unit)
        c.check(len(inst_sysusers) == 1, "sysusers entry installed: %s" %
                inst_sysusers)
        c.check(len(inst_conf) == 1 and
                (os.stat(found[inst_conf[0]]).st_mode & 0o777) == 0o640,
                "config example installed mode 0640: %s" % inst_conf)
        for doc in re.findall(r"(?m)^Documentation=(.*)$", text):
            for url in doc.split():
                if url.startswith("file://"):
                    path = url[len("file://"):]
                    c.check(path.lstrip("/") in found,
                            "Documentation=%s is installed" % url,
                            repr(sorted(found)))
        exec_path = re.search(r"(?m)^ExecStart=(\S+)", text).group(1)
        c.check("/" + exec_path.lstrip("/") in ["/" + p for p in found],
                "ExecStart=%s is where meson installs spotd" % exec_path,
                repr(sorted(found)))

        # the sysusers entry creates user and group spotd
        if shutil.which("systemd-sysusers"):
            root = os.path.join(wd, "root")
            os.makedirs(os.path.join(root, "etc"))
            cp = sl.run(["systemd-sysusers", "--root", root,
                         found[inst_sysusers[0]]] if inst_sysusers else
                        ["false"], timeout=60)
            passwd = ""
            if os.path.exists(os.path.join(root, "etc", "passwd")):
                passwd = open(os.path.join(root, "etc", "passwd")).read()
            c.check(cp.returncode == 0 and re.search(
                r"(?m)^spotd:x:\d+:\d+:[^:]*:/var/lib/spotd:", passwd),
                "systemd-sysusers creates spotd with home /var/lib/spotd",
                cp.stderr + passwd)
    c.finish()


if __name__ == "__main__":
    main()
