"""Clock skew is noticed, against the real Ceph: spotd and spotctl compare
their wall clock with S3's Date header (on spotd's store probe and on every
answer about the lease).

A node whose clock runs 50 s ahead (SPOTD_FAULT_CLOCK_MS, a test-build
fault point that shifts spotd's wall clock) sees a healthy holder's lease
as long expired. Before, it took the lease over and both trainers ran; now
it warns at the probe and refuses to take the lease with one line naming
the skew, and the holder keeps it. A node 3 s ahead with a 10 s grace is
warned about and goes on.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("clockskew")
    url = "%s/%s" % (store, job)
    holder = subprocess.Popen(
        [sl.spotctl_exe(), "lease", url, "--owner", "healthy-holder",
         "--ttl", "6", "--hold", "0"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    with sl.cleaned_up(prefix):
        try:
            first = holder.stdout.readline()
            c.check(first.startswith("acquired owner=healthy-holder"),
                    "a healthy holder takes the lease and renews it", first)
            with tempfile.TemporaryDirectory(prefix="spotd-skew-") as wd:
                d = sl.Daemon(os.path.join(wd, "ahead"), store, job,
                              trainer=["--exit-at", 5],
                              env={"SPOTD_FAULT_CLOCK_MS": "50000"})
                rc = d.wait_exit(60)
                log = d.log()
                c.check(rc == 69, "a node 50 s ahead: spotd exits 69 (the "
                        "lease is not available to it)",
                        "rc=%s" % rc)
                c.check(d.err.wait(r"clock: this node's clock is (49|50|51)"
                                   r"\.\d s ahead of S3's", 0)[1]
                        is not None, "the probe warns about the skew",
                        log[-1500:])
                refusals = [l for l in log.splitlines() if
                            "refusing to take the job lease: this node's "
                            "clock is" in l]
                c.check(len(refusals) == 1 and "ahead of S3's" in refusals[0]
                        and "grace of 2.0 s" in refusals[0],
                        "one line refuses the takeover and names the skew",
                        log[-1500:])
                c.check(not d.events("start"), "no trainer started there")
            cp = sl.spotctl("lease", url, "--show")
            c.check(cp.returncode == 0 and
                    "owner=healthy-holder" in cp.stdout and
                    "state=held" in cp.stdout,
                    "the healthy holder still holds the lease", cp.stdout)
        finally:
            holder.terminate()
            holder.wait(30)
        url2, prefix2 = sl.unique_job("clockskew-warn")
        try:
            env = dict(os.environ, SPOTD_FAULT_CLOCK_MS="3000")
            cp = sl.spotctl("lease", url2, "--owner", "slightly-off",
                            "--no-wait", "--grace", "10", env=env)
            c.check(cp.returncode == 0 and
                    "clock: this node's clock is" in cp.stderr and
                    "ahead of S3's" in cp.stderr,
                    "3 s ahead, 10 s grace: a warning, the lease is taken",
                    "rc=%d %s" % (cp.returncode, cp.stderr))
        finally:
            sl.s3_cleanup(prefix2)
    c.finish()


if __name__ == "__main__":
    main()
