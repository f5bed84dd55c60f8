"""A lease holder that cannot confirm its renewal stops its trainer by its
own deadline, against the real Ceph.

Node A runs spotd through a proxy (faultproxy.py) with --lease-ttl 3; once
its trainer steps, the proxy stalls every request (no byte moves, for
minutes), so A's renewal hangs in flight. Node B, straight to Ceph, waits
for the lease and takes it over once A's lease expired beyond the grace,
as designed. A's local deadline timer fires while the renewal is still in
flight: A freezes (SIGSTOP) and kills its trainer and exits 73. The check
is on the order of events, not on durations: A's trainer takes no step
after B's trainer started (before, A's trainer kept stepping for about two
minutes, until the stalled request gave up).
"""
import os
import sys
import signal
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402


def main():
    endpoint, _ = sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("leasedeadline")
    px = FaultProxy(endpoint, seed=1)
    with sl.cleaned_up(prefix, px.close):
        with tempfile.TemporaryDirectory(prefix="spotd-leasedl-") as wd:
            a = sl.Daemon(os.path.join(wd, "a"), store, job,
                          trainer=["--step-sleep", 0.05],
                          args=["--lease-ttl", 3],
                          env={"AWS_ENDPOINT_URL": px.url})
            started = a.wait_event("start", 60)
            c.check(started is not None, "A: the trainer started")
            c.check(a.wait_event("step", 30, lambda e: e["step"] >= 5)
                    is not None, "A: the trainer steps")
            # A's path to S3 stalls: nothing moves, for minutes
            px.configure(stall=1.0, stall_s=600, max_per_request=1000)
            b = sl.Daemon(os.path.join(wd, "b"), store, job,
                          trainer=["--step-sleep", 0.05],
                          args=["--lease-ttl", 3])
            b_start = b.wait_event("start", 120)
            c.check(b_start is not None, "B: took the lease, its trainer "
                    "started")
            lost = a.wait_log(r"lost: not renewed before its local "
                              r"deadline", 60)
            c.check(lost is not None, "A: the lease is lost at its local "
                    "deadline while the renewal is in flight",
                    a.log()[-1500:])
            rc = a.wait_exit(60)
            c.check(rc == 73, "A: spotd exits 73", "rc=%s" % rc)
            a_steps = [e for e in a.events() if e["ev"] == "step"]
            after = [e for e in a_steps
                     if b_start is not None and e["t"] > b_start["t"]]
            c.check(b_start is not None and a_steps and not after,
                    "A's trainer took no step after B's trainer started",
                    "%d of A's steps after B started (first at %s, B at %s)"
                    % (len(after), after[0]["t"] if after else "-",
                       b_start["t"] if b_start else "-"))
            b.p.terminate()
            b.wait_exit(60)
            for d in (a, b):
                for pid in d.trainer_pids():
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
    c.finish()


if __name__ == "__main__":
    main()
