"""SIGTERM to spotd (the machine is shutting down): the trainer is asked
for a final checkpoint, it is committed, the trainer is stopped with
SIGTERM, no relaunch, exit 0. A second SIGTERM stops at once: the upload
in progress is cancelled (nothing committed, no multipart upload left),
the trainer is killed, exit 143."""
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def gone(pid):
    """True when pid no longer runs (or is a zombie)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def drain(c, wd):
    tag = "drain: "
    store, job, prefix = sl.daemon_job("sigterm")
    with sl.cleaned_up(prefix):
        hook, hook_out = sl.relaunch_hook(os.path.dirname(wd))
        d = sl.Daemon(wd, store, job, args=["--relaunch", hook],
                      trainer=["--step-sleep", 0.05])
        c.check(d.wait_event("step", 20, lambda e: e["step"] >= 5) is not None,
                tag + "the trainer runs")
        d.send(signal.SIGTERM)
        rc = d.wait_exit(40)
        c.check(rc == 0, tag + "spotd exits 0", "rc=%s" % rc)
        made = d.events("checkpoint")
        name = made[0]["name"] if made else "?"
        c.check(len(made) == 1 and made[0]["why"] == "signal",
                tag + "the trainer made a final checkpoint %s" % name)
        c.check(sl.latest(prefix) == name and sl.committed(prefix) == [name],
                tag + "%s committed, LATEST" % name)
        order = [d.err.wait(p, 0)[0] for p in (
            r"signal 15: final checkpoint",
            r"checkpoint requested \(sigterm\)",
            r"committed checkpoint name=" + name,
            r"stopping trainer pid=\d+: SIGTERM",
            r"state \S+ -> exiting")]
        c.check(None not in order and order == sorted(order),
                tag + "signal, checkpoint, commit, SIGTERM to the trainer, exit",
                "indexes %s" % order)
        c.check(len(d.events("term")) == 1, tag + "the trainer got SIGTERM")
        c.check(not sl.read_jsonl(hook_out), tag + "no relaunch on SIGTERM")
        start = d.trainer_pids()
        c.check(start and gone(start[0]), tag + "the trainer is gone")


def twice(c, wd):
    tag = "twice: "
    store, job, prefix = sl.daemon_job("sigterm2")
    with sl.cleaned_up(prefix):
        # 96 MiB of random bytes: the upload takes a while
        # debug: to see the parts go out (the upload id is known then; a
        # cancel while CreateMultipartUpload is in flight cannot abort what
        # it never learnt of, and leaves that to the next push's retention)
        d = sl.Daemon(wd, store, job, args=["--parallel", 2,
                                            "--log-level", "debug"],
                      trainer=["--bytes", 96 << 20, "--random",
                               "--step-sleep", 0.05])
        c.check(d.wait_event("step", 20) is not None, tag + "the trainer runs")
        d.send(signal.SIGTERM)
        up = d.wait_log(r"s3 init -> sending op=\d+ MPU-PART ", 30)
        c.check(up is not None, tag + "the final checkpoint is uploading")
        t2 = time.time()
        d.send(signal.SIGTERM)
        rc = d.wait_exit(20)
        dt = time.time() - t2
        c.check(rc == 128 + 15, tag + "spotd exits 143", "rc=%s" % rc)
        c.check(dt < 5, tag + "the second SIGTERM stopped spotd in %.1f s" % dt)
        c.check(d.err.matching(r"signal 15: stopping now"),
                tag + "the log says it stops now")
        c.check(not d.err.matching(r"committed checkpoint name="),
                tag + "nothing committed")
        c.check(sl.latest(prefix) is None and sl.committed(prefix) == [],
                tag + "no LATEST, no manifest in the store")
        left = sl.s3_uploads(prefix)
        c.check(left == [], tag + "the multipart upload was aborted", repr(left))
        c.check(not d.err.matching(r"internal: "),
                tag + "every handle closed, loop empty at exit")
        start = d.trainer_pids()
        c.check(start and gone(start[0]), tag + "the trainer is gone")


def main():
    sl.daemon_env()
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-sigterm-") as wd:
        drain(c, os.path.join(wd, "drain"))
        twice(c, os.path.join(wd, "twice"))
    c.finish()


if __name__ == "__main__":
    main()
