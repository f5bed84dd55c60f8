"""Progress never goes backwards, against the real Ceph: LATEST never moves
to a checkpoint older by the trainer's step, whoever commits it.

1. Same-node restart: spotd commits step-000010..30 and exits; an older
   complete folder (step-000005) is left in --ckpt-dir, as after a crash.
   The next spotd on the same folder restores step-000030 and does not
   upload the leftover: LATEST stays step-000030, the restored folder is
   not deleted, the leftover is kept, and a log line says why. A third
   run resumes from step 30.
2. `spotctl push` of an older step (by its name, then by --step) is
   refused with "not moving LATEST back in training"; a newer one moves
   it.
3. A lease holder at a higher epoch (a new node) cannot move LATEST back
   to an older step either (`spotctl lease --set-latest`).
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def same_node(c, wd, store, job, prefix):
    m = os.path.join(wd, "node")
    d1 = sl.Daemon(m, store, job, trainer=["--every", 10, "--exit-at", 35,
                                          "--step-sleep", 0.03])
    rc = d1.wait_exit(90)
    c.check(rc == 0, "first: spotd exits 0", "rc=%s" % rc)
    c.check(sl.latest(prefix) == "step-000030", "first: LATEST is step-000030",
            repr(sl.latest(prefix)))
    # a complete folder an earlier process left behind, older than LATEST
    old = os.path.join(d1.ckpt_dir, "step-000005")
    shutil.copytree(os.path.join(d1.ckpt_dir, "step-000030"), old)
    d2 = sl.Daemon(m, store, job, trainer=["--exit-at", 33,
                                          "--step-sleep", 0.03])
    rc = d2.wait_exit(90)
    c.check(rc == 0, "second: spotd exits 0", "rc=%s" % rc)
    c.check(sl.latest(prefix) == "step-000030",
            "second: LATEST still step-000030 (not the leftover step-000005)",
            repr(sl.latest(prefix)))
    c.check(d2.err.wait(r"not uploading checkpoint step-000005 \(step 5\): "
                        r"step-000030 \(step 30\) is newer", 0)[1] is not None,
            "second: a log line says the leftover is older and kept")
    c.check(os.path.isdir(os.path.join(d2.ckpt_dir, "step-000030")),
            "second: the restored step-000030 is still on disk",
            repr(sorted(os.listdir(d2.ckpt_dir))))
    c.check(os.path.isdir(old), "second: the leftover folder is kept",
            repr(sorted(os.listdir(d2.ckpt_dir))))
    c.check(not any("step-000005" in k for k in sl.s3_keys(prefix)),
            "second: nothing of step-000005 was uploaded",
            repr([k for k in sl.s3_keys(prefix) if "000005" in k]))
    d3 = sl.Daemon(m, store, job, trainer=["--exit-at", 31,
                                          "--step-sleep", 0.03])
    rc = d3.wait_exit(90)
    starts = d3.events("start")
    c.check(rc == 0 and len(starts) == 1 and starts[0]["step"] == 30,
            "third: the trainer resumed at step 30",
            "rc=%s %r" % (rc, starts[:1]))


def push(c, wd):
    url, prefix = sl.unique_job("order-push")
    src = os.path.join(wd, "src")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "w.bin"), "wb") as f:
        f.write(b"weights" * 100)
    try:
        cp = sl.spotctl("push", src, url, "--name", "step-000079")
        c.check(cp.returncode == 0, "push step-000079", cp.stderr)
        cp = sl.spotctl("push", src, url, "--name", "step-000042")
        c.check(cp.returncode != 0 and
                "not moving LATEST back in training" in cp.stderr and
                sl.latest(prefix) == "step-000079",
                "push of the older step-000042: refused, LATEST stays",
                "rc=%d latest=%r %s" % (cp.returncode, sl.latest(prefix),
                                        cp.stderr))
        cp = sl.spotctl("push", src, url, "--name", "final-a", "--step", "50")
        c.check(cp.returncode != 0 and sl.latest(prefix) == "step-000079",
                "push --step 50 (older): refused, LATEST stays",
                "rc=%d latest=%r %s" % (cp.returncode, sl.latest(prefix),
                                        cp.stderr))
        cp = sl.spotctl("push", src, url, "--name", "final-b", "--step", "80")
        c.check(cp.returncode == 0 and sl.latest(prefix) == "final-b",
                "push --step 80 (newer): LATEST moves",
                "rc=%d latest=%r %s" % (cp.returncode, sl.latest(prefix),
                                        cp.stderr))
        # the step travels with LATEST, so a name without one compares too
        cp = sl.spotctl("push", src, url, "--name", "step-000079-b")
        c.check(cp.returncode != 0 and sl.latest(prefix) == "final-b",
                "push of step 79 after final-b (step 80 in LATEST's "
                "metadata): refused", "rc=%d latest=%r %s" % (
                    cp.returncode, sl.latest(prefix), cp.stderr))
    finally:
        sl.s3_cleanup(prefix)


def lease_epoch(c, wd):
    url, prefix = sl.unique_job("order-lease")
    try:
        cp = sl.spotctl("lease", url, "--owner", "node-a", "--no-wait",
                        "--set-latest", "step-000079", "--seq", "1",
                        "--release")
        c.check(cp.returncode == 0 and sl.latest(prefix) == "step-000079",
                "node-a (epoch 1) moves LATEST to step-000079",
                cp.stdout + cp.stderr)
        cp = sl.spotctl("lease", url, "--owner", "node-b", "--no-wait",
                        "--set-latest", "step-000042", "--seq", "1",
                        "--release")
        c.check(cp.returncode != 0 and sl.latest(prefix) == "step-000079" and
                "not moving LATEST back in training" in cp.stderr,
                "node-b (epoch 2) cannot move LATEST back to step-000042",
                "rc=%d %s%s" % (cp.returncode, cp.stdout, cp.stderr))
    finally:
        sl.s3_cleanup(prefix)


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("order")
    with sl.cleaned_up(prefix):
        with tempfile.TemporaryDirectory(prefix="spotd-order-") as wd:
            same_node(c, wd, store, job, prefix)
            push(c, wd)
            lease_epoch(c, wd)
    c.finish()


if __name__ == "__main__":
    main()
