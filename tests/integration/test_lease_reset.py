"""A safe lease reset, against the real Ceph.

1. Deleting the LEASE object no longer breaks every later commit: spotd
   commits, the lease object is deleted (what an operator did after a
   damaged-lease message), the next spotd creates the lease again at an
   epoch past the one LATEST's commit carries, so its commits move LATEST
   instead of being refused as "backwards", and the trainer's work since
   is kept.
2. A damaged lease: the error names `spotctl lease ... --reset`; --reset
   deletes it; the next holder's epoch continues past LATEST's and its
   LATEST update goes through.
3. --reset never deletes a lease that is held (exit 3, still there).
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def epoch_of(out):
    m = re.search(r"acquired owner=\S+ epoch=(\d+)", out)
    return int(m.group(1)) if m else -1


def daemon_after_delete(c, wd, store, job, prefix):
    m = os.path.join(wd, "node")
    d1 = sl.Daemon(m, store, job, trainer=["--every", 10, "--exit-at", 25,
                                          "--step-sleep", 0.03])
    rc = d1.wait_exit(90)
    c.check(rc == 0 and sl.latest(prefix) == "step-000020",
            "first: step-000020 committed", "rc=%s latest=%r" %
            (rc, sl.latest(prefix)))
    sl.s3().delete_object(Bucket=os.environ["SPOT_TEST_S3_BUCKET"],
                          Key=prefix + "LEASE")
    d2 = sl.Daemon(m, store, job, trainer=["--every", 10, "--exit-at", 45,
                                          "--step-sleep", 0.03])
    rc = d2.wait_exit(90)
    c.check(rc == 0, "after the lease was deleted: spotd exits 0",
            "rc=%s" % rc)
    c.check(sl.latest(prefix) == "step-000040",
            "after the lease was deleted: its commits move LATEST to "
            "step-000040", repr(sl.latest(prefix)))
    c.check(d2.err.wait(r"LATEST not moved|not moving LATEST backwards",
                        0)[1] is None,
            "after the lease was deleted: no commit refused as backwards")


def damaged(c, wd):
    url, prefix = sl.unique_job("lease-reset")
    try:
        for owner, name in (("node-a", "step-000010"),
                            ("node-b", "step-000020")):
            cp = sl.spotctl("lease", url, "--owner", owner, "--no-wait",
                            "--set-latest", name, "--seq", "1", "--release")
            c.check(cp.returncode == 0, "%s commits %s" % (owner, name),
                    cp.stdout + cp.stderr)
        sl.s3_put(prefix + "LEASE", b"{garbage")
        cp = sl.spotctl("lease", url, "--owner", "node-c", "--no-wait")
        c.check(cp.returncode != 0 and
                ("spotctl lease %s --reset" % url) in cp.stderr,
                "a damaged lease: the error points to spotctl lease --reset",
                cp.stderr)
        cp = sl.spotctl("lease", url, "--reset")
        c.check(cp.returncode == 0 and
                prefix + "LEASE" not in sl.s3_keys(prefix),
                "--reset deletes the damaged lease",
                "rc=%d %s%s" % (cp.returncode, cp.stdout, cp.stderr))
        cp = sl.spotctl("lease", url, "--owner", "node-c", "--no-wait",
                        "--set-latest", "step-000030", "--seq", "1",
                        "--release")
        out = cp.stdout + cp.stderr
        c.check(cp.returncode == 0 and epoch_of(out) == 3 and
                sl.latest(prefix) == "step-000030",
                "after the reset: epoch 3 (past LATEST's 2), LATEST moves",
                "rc=%d latest=%r %s" % (cp.returncode, sl.latest(prefix), out))
        # a held lease is never reset
        cp = sl.spotctl("lease", url, "--owner", "node-d", "--no-wait",
                        "--ttl", "120")
        c.check(cp.returncode == 0, "node-d holds the lease", cp.stderr)
        cp = sl.spotctl("lease", url, "--reset")
        c.check(cp.returncode == 3 and "held by node-d" in cp.stderr and
                prefix + "LEASE" in sl.s3_keys(prefix),
                "--reset of a held lease: exit 3, the lease stays",
                "rc=%d %s" % (cp.returncode, cp.stderr))
    finally:
        sl.s3_cleanup(prefix)


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("leasereset")
    with sl.cleaned_up(prefix):
        with tempfile.TemporaryDirectory(prefix="spotd-leasereset-") as wd:
            daemon_after_delete(c, wd, store, job, prefix)
            damaged(c, wd)
    c.finish()


if __name__ == "__main__":
    main()
