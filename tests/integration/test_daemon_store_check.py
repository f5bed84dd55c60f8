"""spotd checks the store before the trainer starts (write, read and
delete a probe object under the job root) and refuses to start with one
clear line and exit 69 (the store is not available) otherwise:

  bucket:   a bucket that does not exist (real Ceph when it is up, and the
            fake S3): NoSuchBucket.
  denied:   the server refuses the probe's PUT: AccessDenied.
  endpoint: nothing listens at --endpoint.
  ok:       a usable store: the trainer starts, no probe object is left.
  Ceph:     a wrong secret (SignatureDoesNotMatch) and an unknown key id
            (InvalidAccessKeyId): the line says the credentials are wrong,
            not that permissions are missing; no credentials at all: exit
            69 too; a restore that fails on the network (the checkpoint's
            objects reset by a proxy, the probe passing): exit 69, not
            71."""
import os
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402


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
    endpoint, _ = sl.daemon_env()
    d = sl.Daemon(wd, "s3://no-such-bucket-%d/x" % os.getpid(), "job")
    refused(c, "bucket (Ceph): ", d, "NoSuchBucket")
    sl.kill_started()
    store, job, prefix = sl.daemon_job("check")
    with sl.cleaned_up(prefix):
        for tag, env, code in [
                ("wrong secret: ",
                 {"AWS_SECRET_ACCESS_KEY": "not-the-secret-0123456789"},
                 "SignatureDoesNotMatch"),
                ("unknown key id: ",
                 {"AWS_ACCESS_KEY_ID": "SPOTDNOSUCHKEY000001"},
                 "InvalidAccessKeyId")]:
            d = sl.Daemon(os.path.join(wd, tag.split(":")[0].replace(" ", "-")),
                          store, job, env=env)
            refused(c, tag, d, code)
            line = "".join(d.err.matching(r"error: the store"))
            c.check("credentials are wrong" in line and
                    "s3:PutObject" not in line,
                    tag + "the line says the credentials are wrong, not "
                    "which permissions to grant", line)
        home = os.path.join(wd, "home")
        os.makedirs(home)
        d = sl.Daemon(os.path.join(wd, "nocreds"), store, job,
                      env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
                           "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
                           "HOME": home, "AWS_SHARED_CREDENTIALS_FILE": "",
                           "AWS_CONFIG_FILE": "",
                           "AWS_EC2_METADATA_DISABLED": "true"})
        rc = d.wait_exit(30)
        c.check(rc == 69 and d.err.matching(r"error: no AWS credentials"),
                "no credentials: exit 69 with one line (%s)" % rc, d.log())
        # a committed checkpoint, then a restore whose object GETs fail
        src = os.path.join(wd, "src")
        os.makedirs(src)
        with open(os.path.join(src, "step"), "w") as f:
            f.write("3\n")
        cp = sl.spotctl("push", src, store + "/" + job, "--name", "step-3")
        c.check(cp.returncode == 0, "network: a checkpoint is committed",
                cp.stderr)
        px = FaultProxy(endpoint, seed=5)
        try:
            px.configure(reset_resp=1.0, kinds={"get"}, match="/checkpoints/",
                         max_per_request=1000)
            d = sl.Daemon(os.path.join(wd, "network"), store, job,
                          args=["--endpoint", px.url])
            rc = d.wait_exit(120)
            c.check(rc == 69 and d.err.matching(r"error: restore failed") and
                    not d.events("start"),
                    "network: a restore that fails on the network exits 69 "
                    "(%s), the trainer never started" % rc, d.log()[-1500:])
        finally:
            px.close()
            sl.kill_started()


def main():
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-check-") as wd:
        fake_cases(c, wd)
        ceph_case(c, os.path.join(wd, "ceph"))
    c.finish()


if __name__ == "__main__":
    main()
