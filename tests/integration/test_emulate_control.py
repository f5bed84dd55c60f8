"""`spotctl emulate`'s runtime notice control does what its --help says:
post a notice (/__emulate/notice), withdraw it (/__emulate/cancel?notice=1),
clear faults (/__emulate/fault?clear=1), against the AWS IMDSv2 endpoint
spotd polls. No S3, no daemon."""
import os
import sys
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


def main():
    c = sl.Checks()
    cp = sl.run([sl.spotctl_exe(), "emulate", "--help"], timeout=10)
    for what in ("/__emulate/notice?", "/__emulate/cancel?notice=1",
                 "clear=1", "/__emulate/state", "curl -X POST"):
        c.check(cp.returncode == 0 and what in cp.stdout,
                "emulate --help documents %s" % what)
    c.check(all(len(l) <= 80 for l in cp.stdout.splitlines()),
            "emulate --help fits 80 columns")

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
