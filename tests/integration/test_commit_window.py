"""No lost commit between the manifest and LATEST, against the real Ceph.

spotd commits step-000010. The next spotd resumes from it and is killed
exactly between writing step-000020's MANIFEST.json and moving LATEST (the
fault point "after-manifest", SPOTD_FAULT, compiled into test builds
only): the store then holds a committed step-000020 that LATEST does not
name. The spotd started next on the same node finds its own journaled
push, sees the manifest is its own (its attempt's objects), publishes it
instead of refusing it as "already committed", and restores it: the
trainer resumes from step 20, not 10.
"""
import os
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def kill_trainer(d):
    for pid in d.trainer_pids():
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, KeyError):
            pass


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("window")
    with sl.cleaned_up(prefix):
        with tempfile.TemporaryDirectory(prefix="spotd-window-") as wd:
            m = os.path.join(wd, "node")
            d1 = sl.Daemon(m, store, job, trainer=[
                "--every", 10, "--exit-at", 15, "--step-sleep", 0.03])
            rc = d1.wait_exit(90)
            c.check(rc == 0 and sl.latest(prefix) == "step-000010",
                    "first: step-000010 committed",
                    "rc=%s latest=%r" % (rc, sl.latest(prefix)))

            d2 = sl.Daemon(m, store, job, trainer=[
                "--every", 10, "--exit-at", 25, "--step-sleep", 0.03],
                env={"SPOTD_FAULT": "after-manifest"})
            rc = d2.wait_exit(90)
            kill_trainer(d2)
            c.check(rc == -signal.SIGKILL,
                    "second: spotd killed at the fault point after the "
                    "manifest", "rc=%s" % rc)
            keys = sl.s3_keys(prefix)
            c.check(prefix + "checkpoints/step-000020/MANIFEST.json" in keys
                    and sl.latest(prefix) == "step-000010",
                    "second: step-000020's manifest is written, LATEST "
                    "still names step-000010", "latest=%r" % sl.latest(prefix))

            d3 = sl.Daemon(m, store, job, trainer=[
                "--exit-at", 22, "--step-sleep", 0.03])
            rc = d3.wait_exit(90)
            c.check(rc == 0, "third: spotd exits 0", "rc=%s" % rc)
            c.check(d3.err.wait(r"push name=step-000020: an earlier run "
                                r"committed its manifest", 0)[1] is not None,
                    "third: it finds its own unpublished commit")
            c.check(d3.err.wait(r"already committed", 0)[1] is None,
                    "third: no \"already committed\" refusal")
            starts = d3.events("start")
            c.check(len(starts) == 1 and starts[0]["step"] == 20,
                    "third: the trainer resumed at step 20 (not 10)",
                    repr(starts[:1]))
            c.check(sl.latest(prefix) == "step-000020",
                    "third: LATEST names step-000020",
                    repr(sl.latest(prefix)))
    c.finish()


if __name__ == "__main__":
    main()
