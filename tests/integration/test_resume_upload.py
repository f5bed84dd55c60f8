#!/usr/bin/python3
"""A push killed with SIGKILL mid-upload, then started again, resumes the
multipart upload it had journaled instead of starting over; without its
journal it aborts the old upload cleanly and starts over.

Every request goes through faultproxy.py (no faults, a bandwidth cap so
the first push is still running when it is killed), whose request counts
are the evidence: the second push sends only the parts the first did not
store. Three cases:
  1. spotctl push --journal: killed, rerun: resumes.
  2. the journal deleted before the rerun: every part is sent again, and
     the first push's multipart upload is aborted (none left).
  3. spotd killed mid-upload (SIGKILL), restarted: it resumes the upload
     before restoring, commits it, and the trainer resumes from it."""
import os
import re
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402

endpoint, bucket = spotlib.store_env()
c = spotlib.Checks()
PART = 8 << 20
NPARTS = 16
SIZE = NPARTS * PART  # random bytes: every part is a full part
BANDWIDTH = 12 * 1000 * 1000  # ~1 s per part with 1 in flight


def wait_parts(px, n, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if px.stats()["requests"].get("part", 0) >= n:
            return True
        time.sleep(0.05)
    return False


def push_env(px):
    env = dict(os.environ)
    env["AWS_ENDPOINT_URL"] = px.url
    return env


def killed_push(px, url, src, journal):
    """Starts a push through the proxy and SIGKILLs it once 5 parts were
    sent. Returns nothing; the push is dead afterwards."""
    px.configure(bandwidth=BANDWIDTH)
    px.reset_stats()
    p = spotlib.spotctl_popen("push", src, url, "--journal", journal,
                              "--part-size", "8M",
                              "--parallel", "1", "--workers", "1",
                              env=push_env(px), stdout=subprocess_devnull(),
                              stderr=subprocess_devnull())
    ok = wait_parts(px, 5)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    c.check(ok, "the first push sent 5 parts before it was killed")


def subprocess_devnull():
    return open(os.devnull, "wb")


def rerun(px, url, src, journal):
    px.configure()  # no cap: the second push runs at full speed
    px.reset_stats()
    cp = spotlib.run([spotlib.spotctl_exe(), "push", src, url, "--journal",
                      journal, "--part-size", "8M"], timeout=120,
                     env=push_env(px))
    print(cp.stdout.strip())
    if cp.returncode != 0:
        print(cp.stderr)
    return cp, px.stats()["requests"].get("part", 0)


with tempfile.TemporaryDirectory(prefix="spotd-resume-") as tmp:
    src = os.path.join(tmp, "step-1")
    os.makedirs(src)
    spotlib.write_random(os.path.join(src, "weights.bin"), SIZE)
    px = FaultProxy(endpoint, seed=1)
    try:
        # 1. resume through the journal
        url, root = spotlib.unique_job("resume")
        journal = os.path.join(tmp, "journal")
        os.makedirs(journal)
        killed_push(px, url, src, journal)
        c.check(len(os.listdir(journal)) == 1, "the killed push left its journal")
        c.check(len(spotlib.s3_uploads(root)) == 1,
                "the killed push left one multipart upload")
        cp, sent = rerun(px, url, src, journal)
        c.check(cp.returncode == 0, "the second push commits")
        m = re.search(r"resumed (\d+) parts", cp.stdout)
        resumed = int(m.group(1)) if m else 0
        print("resumed %d parts, sent %d more, of %d" % (resumed, sent, NPARTS))
        c.check(resumed >= 4, "at least 4 parts were resumed (%d)" % resumed)
        c.check(resumed + sent == NPARTS,
                "the proxy saw only the missing parts (%d + %d == %d)" %
                (resumed, sent, NPARTS))
        c.check(os.listdir(journal) == [], "the journal is gone after the commit")
        c.check(spotlib.s3_uploads(root) == [], "no multipart upload is left")
        spotlib.check_restore(c, url, src, os.path.join(tmp, "restored-1"),
                              "the resumed checkpoint restores identical")

        # 2. the journal lost: start over, abort the old upload
        url, root = spotlib.unique_job("resume-lost")
        journal = os.path.join(tmp, "journal-lost")
        os.makedirs(journal)
        killed_push(px, url, src, journal)
        for f in os.listdir(journal):
            os.unlink(os.path.join(journal, f))
        old = spotlib.s3_uploads(root)
        c.check(len(old) == 1, "the killed push left one multipart upload")
        cp, sent = rerun(px, url, src, journal)
        c.check(cp.returncode == 0, "the push without a journal commits")
        c.check(sent == NPARTS, "without a journal every part is sent (%d)" % sent)
        # Without its journal the killed push is another attempt: its upload
        # may belong to a live writer, so it is left until it is
        # older than the stale bound (retention, 1 hour for spotctl push).
        c.check(px.stats()["requests"].get("abort", 0) == 0,
                "another attempt's young upload was not aborted")
        c.check([u[0] for u in spotlib.s3_uploads(root)] == [u[0] for u in old],
                "only the killed attempt's upload is left")
        for k, uid, _ in spotlib.s3_uploads(root):
            spotlib.s3().abort_multipart_upload(
                Bucket=os.environ["SPOT_TEST_S3_BUCKET"], Key=k, UploadId=uid)
        spotlib.check_restore(c, url, src, os.path.join(tmp, "restored-2"),
                              "the checkpoint restores identical")

        # 3. spotd killed mid-upload and restarted
        store, job, root = spotlib.daemon_job("resume")
        work = os.path.join(tmp, "node")
        px.configure(bandwidth=BANDWIDTH)
        px.reset_stats()
        env = {"AWS_ENDPOINT_URL": px.url}
        d = spotlib.Daemon(work, store, job, env=env,
                           trainer=["--bytes", str(SIZE), "--random"],
                           args=["--part-size", "8M", "--parallel", "1"])
        c.check(d.wait_event("start", 30) is not None,
                "spotd started the trainer")
        cp = d.spotctl("checkpoint")
        c.check(cp.returncode == 0, "checkpoint requested")
        ok = wait_parts(px, 5, 120)
        c.check(ok, "spotd sent 5 parts")
        os.kill(d.pid, signal.SIGKILL)
        d.wait_exit(10)
        # The trainer runs in its own session: spotd's death leaves it
        # orphaned. Kill it (and its group) by the pid it logged.
        for e in d.events("start"):
            for kill in (lambda: os.killpg(e["pgid"], signal.SIGKILL),
                         lambda: os.kill(e["pid"], signal.SIGKILL)):
                try:
                    kill()
                except (OSError, KeyError):
                    pass
        jdir = os.path.join(d.ckpt_dir, ".spotd-journal")
        c.check(len(os.listdir(jdir)) == 1, "spotd left its journal")
        px.configure()
        px.reset_stats()
        seen = os.path.join(tmp, "resume-dir.txt")
        d2 = spotlib.Daemon(work, store, job, env=env,
                            cmd=["/bin/sh", "-c",
                                 'echo "$SPOTD_RESUME_DIR" > ' + seen],
                            args=["--part-size", "8M"])
        rc = d2.wait_exit(120)
        log = d2.log()
        m = re.search(r"\((\d+) parts were already stored\)", log)
        resumed = int(m.group(1)) if m else 0
        sent = px.stats()["requests"].get("part", 0)
        print("spotd resumed %d parts, sent %d more" % (resumed, sent))
        c.check(rc == 0, "the restarted spotd exits 0 (%s)" % rc)
        c.check(resumed >= 4, "the restarted spotd resumed the upload")
        c.check(resumed + sent == NPARTS,
                "it sent only the missing parts (%d + %d == %d)" %
                (resumed, sent, NPARTS))
        c.check(re.search(r"restored checkpoint step-\d+", log) is not None,
                "then it restored the resumed checkpoint")
        try:
            resumed_from = open(seen).read().strip()
        except OSError:
            resumed_from = ""
        c.check(re.search(r"/ckpt/step-\d+$", resumed_from) is not None,
                "the trainer got SPOTD_RESUME_DIR of it (%r)" % resumed_from)
        c.check(spotlib.s3_uploads(root) == [], "no multipart upload is left")
    finally:
        spotlib.kill_started()
        px.close()

c.finish()
