#!/usr/bin/python3
"""A node drain of one pod of a 2-pod Indexed Job, measured: the manifest's
train container (deploy/kubernetes/train-indexed.yaml) run as
tests/integration/test_kubernetes.py runs it, with the manifest's torchrun
(one gloo worker per node, Debian's torch, CPU) and a real S3 store; SIGTERM
to pod 1's spotd only, then the time until each spotd exited. Printed per
trial, and against the budgets a drained pod gets: GKE's spot shutdown
(15 s for the pods, then 15 s for system pods) and Kubernetes' default
terminationGracePeriodSeconds (30 s).

    set -a; . S3_ENV; set +a
    SPOTD=... SPOTCTL=... SPOT_SRCDIR=. SPOT_BUILDDIR=.build \\
        /usr/bin/python3 bench/drain_bench.py [--trials 3]
"""
import argparse
import os
import signal
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import spotlib as sl  # noqa: E402
import test_kubernetes as tk  # noqa: E402

GKE_S, K8S_DEFAULT_S = 15, 30


def trial(wd, store, k):
    uid = str(uuid.uuid4())
    log = os.path.join(wd, "ddp-%d.log" % k)
    port = sl.free_port()
    pods = []
    for r in range(2):
        down = {"JOB_COMPLETION_INDEX": str(r),
                "metadata.labels['batch.kubernetes.io/controller-uid']": uid,
                "metadata.annotations['batch.kubernetes.io/job-index-failure-count']": "0",
                "metadata.annotations['batch.kubernetes.io/job-index-ignored-failure-count']": "0"}
        pods.append(tk.Pod(os.path.join(wd, "t%d-%d" % (k, r)),
                           "train-indexed.yaml", store, "bench-%d" % k,
                           {"provider": "none", "poll-interval": "500ms"}, [],
                           down, env_over={"SPOTD_TERMINATION_GRACE": str(GKE_S)},
                           cmd=lambda t: tk.torchrun_of(t, port, log)))
    end = time.time() + 120
    while time.time() < end and not all(
            len(tk.ddp_events(log, r, "step")) >= 20 for r in range(2)):
        time.sleep(0.2)
    t0 = time.time()
    pods[1].send(signal.SIGTERM)
    gone = [None, None]
    while None in gone and time.time() < t0 + 120:
        for r, p in enumerate(pods):
            if gone[r] is None and p.p.poll() is not None:
                gone[r] = time.time() - t0
        time.sleep(0.05)
    return [(p.wait_exit(10), g if g is not None else float("nan"))
            for p, g in zip(pods, gone)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    a = ap.parse_args()
    _, bucket = sl.daemon_env()
    prefix = "bench-drain/%d-%d" % (os.getpid(), int(time.time() * 1000))
    store = "s3://%s/%s" % (bucket, prefix)
    rows = []
    with tempfile.TemporaryDirectory(prefix="spotd-drain-bench-") as wd:
        try:
            for k in range(a.trials):
                rows.append(trial(wd, store, k))
        finally:
            sl.kill_started()
            sl.s3_cleanup(prefix + "/")
    print("\ntrial  exits    rank 0 gone  rank 1 gone  all gone  within %d s  "
          "within %d s" % (GKE_S, K8S_DEFAULT_S))
    for k, r in enumerate(rows):
        worst = max(t for _, t in r)
        print("%-6d %-8s %9.1f s  %9.1f s  %6.1f s  %-11s %s" % (
            k + 1, "/".join(str(rc) for rc, _ in r), r[0][1], r[1][1], worst,
            "yes" if worst <= GKE_S else "no",
            "yes" if worst <= K8S_DEFAULT_S else "no"))


if __name__ == "__main__":
    main()
