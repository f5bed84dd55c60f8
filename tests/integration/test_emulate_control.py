"""spotd-emulate's runtime notice control does what its --help says:
post a notice (/__emulate/notice), withdraw it (/__emulate/cancel?notice=1),
clear faults (/__emulate/fault?clear=1), against the AWS IMDSv2 endpoint
spotd polls. And `spotctl emulate` is only a forwarder: spotctl links no
HTTP server, and runs the spotd-emulate installed beside it (or on PATH),
with one clear line when there is none. No S3, no daemon."""
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def imds_get(url, path):
    """(status, body) of an IMDSv2 GET (a fresh token each time)."""
    req = urllib.request.Request(
        url + "/latest/api/token", method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            tok = r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""  # a fault hits the token request too
    req = urllib.request.Request(url + "/latest/meta-data/" + path,
                                 headers={"X-aws-ec2-metadata-token": tok})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def forwarder_checks(c, help_text):
    """spotctl emulate: the same program through spotctl, found beside it
    or on PATH; none found is one line, exit 1."""
    if shutil.which("ldd"):
        cp = sl.run(["ldd", sl.spotctl_exe()], timeout=30)
        c.check(cp.returncode == 0 and "libmicrohttpd" not in cp.stdout,
                "spotctl does not link the HTTP server", cp.stdout)
    emu_dir = os.path.dirname(os.path.abspath(sl.spotd_emulate_exe()))
    on_path = dict(os.environ, PATH=emu_dir + os.pathsep +
                   os.environ.get("PATH", "/usr/bin:/bin"))
    cp = sl.run([sl.spotctl_exe(), "emulate", "--help"], env=on_path,
                timeout=10)
    c.check(cp.returncode == 0 and cp.stdout == help_text,
            "spotctl emulate --help: spotd-emulate's help, found on PATH",
            cp.stdout + cp.stderr)
    cp = sl.run([sl.spotctl_exe(), "emulate", "--provider", "aws", "--port",
                 "x"], env=on_path, timeout=10)
    c.check(cp.returncode == 2 and "spotd-emulate: bad --port 'x'" in
            cp.stderr, "spotctl emulate: the usage error and its status "
            "come through", "rc %d: %s" % (cp.returncode, cp.stderr))

    with tempfile.TemporaryDirectory() as tmp:
        # a spotctl installed alone, nothing on PATH: one clear line
        alone = os.path.join(tmp, "alone")
        os.makedirs(alone)
        shutil.copy2(sl.spotctl_exe(), alone)
        no_path = dict(os.environ, PATH=os.path.join(tmp, "nothing"))
        cp = sl.run([os.path.join(alone, "spotctl"), "emulate", "--provider",
                     "aws"], env=no_path, timeout=10)
        lines = cp.stderr.splitlines()
        c.check(cp.returncode == 1 and len(lines) == 1 and
                "spotd-emulate not found" in lines[0] and alone in lines[0] and
                cp.stdout == "",
                "spotctl emulate without spotd-emulate: exit 1, one line",
                "rc %d: %r" % (cp.returncode, cp.stderr))
        # installed side by side, nothing on PATH: spotctl runs its
        # neighbour, which serves and takes its controls
        both = os.path.join(tmp, "bin")
        os.makedirs(both)
        shutil.copy2(sl.spotctl_exe(), both)
        os.symlink(os.path.abspath(sl.spotd_emulate_exe()),
                   os.path.join(both, "spotd-emulate"))
        e = sl.EmulatorProc("aws", cmd=[os.path.join(both, "spotctl"),
                                        "emulate"], env=no_path)
        try:
            e.control("notice", deadline=60)
            st, body = imds_get(e.url, "spot/instance-action")
            c.check(st == 200 and '"action": "terminate"' in body,
                    "spotctl emulate beside spotd-emulate: serves the notice",
                    body)
        finally:
            rc = e.stop()
        c.check(rc == 0, "spotctl emulate: SIGTERM reaches the emulator "
                "(exit 0)", "rc %r" % rc)


def main():
    c = sl.Checks()
    cp = sl.run([sl.spotd_emulate_exe(), "--help"], timeout=10)
    for what in ("/__emulate/notice?", "/__emulate/cancel?notice=1",
                 "clear=1", "/__emulate/state", "curl -X POST"):
        c.check(cp.returncode == 0 and what in cp.stdout,
                "spotd-emulate --help documents %s" % what)
    c.check(all(len(l) <= 80 for l in cp.stdout.splitlines()),
            "spotd-emulate --help fits 80 columns")
    forwarder_checks(c, cp.stdout)

    e = sl.EmulatorProc("aws")
    try:
        st, _ = imds_get(e.url, "spot/instance-action")
        c.check(st == 404, "no notice at first: 404", "status %d" % st)
        e.control("notice", deadline=90)
        st, body = imds_get(e.url, "spot/instance-action")
        c.check(st == 200 and '"action": "terminate"' in body,
                "POST /__emulate/notice: the notice is served", body)
        e.control("cancel", notice=1)
        st, _ = imds_get(e.url, "spot/instance-action")
        c.check(st == 404, "POST /__emulate/cancel?notice=1: withdrawn (404)",
                "status %d" % st)
        e.control("fault", throttle=1)
        st, _ = imds_get(e.url, "instance-id")
        c.check(st == 503, "a fault is set: throttled (503)", "status %d" % st)
        e.control("fault", clear=1)
        st, _ = imds_get(e.url, "instance-id")
        c.check(st == 200, "POST /__emulate/fault?clear=1: cleared",
                "status %d" % st)
    finally:
        e.stop()
        sl.kill_started()
    c.finish()


if __name__ == "__main__":
    main()
