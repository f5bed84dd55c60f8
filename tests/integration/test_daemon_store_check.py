"""spotd checks the store before the trainer starts (write, read and
delete a probe object under the job root) and refuses to start with one
clear line and exit 69 (the store is not available) otherwise:

  bucket:   a bucket that does not exist (real Ceph when it is up, and the
            fake S3): NoSuchBucket.
  denied:   the server refuses the probe's PUT: AccessDenied.
  endpoint: nothing listens at --endpoint.
  ok:       a usable store: the trainer starts, no probe object is left."""
import os
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def refused(c, tag, d, pattern):
    rc = d.wait_exit(30)
    c.check(rc == 69, tag + "spotd refuses to start: exit 69 (%s)" % rc)
    c.check(not d.events("start"), tag + "the trainer never started")
    lines = d.err.matching(r"error: the store .* cannot be used")
    c.check(len(lines) == 1 and pattern in lines[0],
            tag + "one line says why (%s)" % pattern, "\n".join(lines))


def fake_cases(c, wd):
    s3, store, job, prefix = sl.fake_store("check")
    try:
        tag = "bucket (fake): "
        d = sl.Daemon(os.path.join(wd, "bucket"), "s3://no-such-bucket/x", job,
                      env=s3.env())
        refused(c, tag, d, "NoSuchBucket")

        tag = "denied: "
        s3.fail = lambda m, k: (403, "AccessDenied") if ".spotd-probe" in k else None
        d = sl.Daemon(os.path.join(wd, "denied"), store, job, env=s3.env())
        refused(c, tag, d, "AccessDenied")
        s3.fail = lambda m, k: None

        tag = "endpoint: "
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed again: nothing listens
        d = sl.Daemon(os.path.join(wd, "endpoint"), store, job, env=s3.env(),
                      args=["--endpoint", "http://127.0.0.1:%d" % port])
        refused(c, tag, d, "endpoint")

        tag = "ok: "
        d = sl.Daemon(os.path.join(wd, "ok"), store, job, env=s3.env(),
                      trainer=["--step-sleep", 0.02])
        c.check(d.wait_event("step", 20) is not None, tag + "the trainer runs")
        c.check(not [k for k in s3.objects if ".spotd-probe" in k],
                tag + "no probe object left")
        d.send(15)
        d.wait_exit(20)
    finally:
        sl.kill_started()
        s3.close()


def ceph_case(c, wd):
    if not os.environ.get("SPOT_TEST_S3_ENDPOINT") or \
            os.environ.get("SPOT_TEST_FAKE_S3") == "1":
        print("(no Ceph: the real-server case is skipped)")
        return
    sl.daemon_env()
    d = sl.Daemon(wd, "s3://no-such-bucket-%d/x" % os.getpid(), "job")
    refused(c, "bucket (Ceph): ", d, "NoSuchBucket")
    sl.kill_started()


def main():
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-check-") as wd:
        fake_cases(c, wd)
        ceph_case(c, os.path.join(wd, "ceph"))
    c.finish()


if __name__ == "__main__":
    main()
