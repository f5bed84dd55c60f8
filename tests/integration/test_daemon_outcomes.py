"""spotd's exit status says what was preserved (README "Exit status"),
against the loopback fake S3, which refuses checkpoint uploads on demand:

  finished: the trainer exits 0 but its checkpoint could not be committed:
            exit 69 (the store took no checkpoint), never 0 nor the
            trainer's usual 1.
  sigterm:  SIGTERM, the final upload fails: 143, never 0; SIGTERM with the
            final checkpoint committed: 0.
  previous: a notice, the final upload fails, an earlier checkpoint is
            committed: 75, and LATEST is still the earlier one.
  nothing:  a notice and no checkpoint could ever be committed: 76."""
import os
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

DENY = (403, "AccessDenied")


def deny_uploads(s3):
    s3.fail = lambda m, k: DENY if m in ("PUT", "POST") and "/checkpoints/" in k \
        else None


def finished(c, wd):
    tag = "finished: "
    s3, store, job, _ = sl.fake_store("finished")
    try:
        deny_uploads(s3)
        d = sl.Daemon(wd, store, job, env=s3.env(),
                      trainer=["--every", 5, "--exit-at", 8, "--step-sleep", 0.02])
        rc = d.wait_exit(30)
        c.check(d.events("checkpoint"), tag + "the trainer made a checkpoint")
        c.check(rc == 69, tag + "trainer exit 0, nothing committed: exit 69 (%s)" % rc)
    finally:
        sl.kill_started()
        s3.close()


def sigterm(c, wd, fail):
    tag = "sigterm%s: " % (" (upload fails)" if fail else "")
    s3, store, job, _ = sl.fake_store("sigterm%d" % fail)
    try:
        if fail:
            deny_uploads(s3)
        d = sl.Daemon(wd, store, job, env=s3.env(), trainer=["--step-sleep", 0.02])
        c.check(d.wait_event("step", 20) is not None, tag + "the trainer runs")
        d.send(signal.SIGTERM)
        rc = d.wait_exit(30)
        want = 128 + signal.SIGTERM if fail else 0
        c.check(rc == want, tag + "exit %d (%s)" % (want, rc))
    finally:
        sl.kill_started()
        s3.close()


def notice(c, wd, previous):
    tag = "previous: " if previous else "nothing: "
    s3, store, job, prefix = sl.fake_store("notice%d" % previous)
    emu = sl.EmulatorProc("aws")
    try:
        if not previous:
            deny_uploads(s3)
        d = sl.Daemon(wd, store, job, env=s3.env(), provider="aws",
                      metadata_url=emu.url, trainer=["--step-sleep", 0.02])
        c.check(d.wait_event("step", 20) is not None, tag + "the trainer runs")
        first = None
        if previous:
            cp = d.spotctl("checkpoint", "--wait", "--timeout", "20", timeout=30)
            st = d.status() or {}
            first = (st.get("last_commit") or {}).get("name")
            c.check(cp.returncode == 0 and first, tag + "a first checkpoint %s is "
                    "committed" % first, cp.stdout + cp.stderr)
            deny_uploads(s3)
        emu.control("notice", deadline=20)
        rc = d.wait_exit(30)
        want = 75 if previous else 76
        c.check(rc == want, tag + "exit %d (%s)" % (want, rc))
        if previous:
            latest = s3.objects.get(prefix + "LATEST", (b"",))[0].decode().strip()
            c.check(latest == first, tag + "LATEST is still %s (%s)" % (first, latest))
            c.check(d.err.matching(r"resumes from %s .*lost" % first),
                    tag + "the last line names %s and the work lost" % first)
    finally:
        emu.stop()
        sl.kill_started()
        s3.close()


def main():
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-outcomes-") as wd:
        finished(c, os.path.join(wd, "finished"))
        sigterm(c, os.path.join(wd, "sigterm-fail"), True)
        sigterm(c, os.path.join(wd, "sigterm-ok"), False)
        notice(c, os.path.join(wd, "previous"), True)
        notice(c, os.path.join(wd, "nothing"), False)
    c.finish()


if __name__ == "__main__":
    main()
