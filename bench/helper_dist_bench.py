#!/usr/bin/python3
"""What spotd.checkpoint_requested() costs per call under torch.distributed
with nothing pending: two ranks (gloo, CPU, loopback) started here, each
calling it N times in a loop, with a pause between two calls standing for
the training step (0 ms: back to back), R rounds; the best round's time
spent inside the calls, in microseconds per call (wall,
time.perf_counter_ns). Compared with a blocking all_reduce of
the same flag on the default group followed by .item() (what the helper
did before: every call waited for the slowest rank, and with NCCL it was
a device-to-host synchronisation each step). Also: one call of each while
the other rank is 1 s late (the agreement's call returns at once; the
blocking one waits out the late rank).

    /usr/bin/python3 bench/helper_dist_bench.py [--calls 2000] [--rounds 5]
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(HERE, "..", "python")

CHILD = r"""
import sys, time
import spotd
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
n, rounds, step = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])

def blocking():
    t = torch.tensor([0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item()) > 0

out = {}
for name, f in (("agree", spotd.checkpoint_requested), ("blocking", blocking)):
    f()
    best = None
    for _ in range(rounds):
        dist.barrier()
        spent = 0
        for _ in range(n):
            if step:
                time.sleep(step)  # the training step between two calls
            t = time.perf_counter_ns()
            f()
            spent += time.perf_counter_ns() - t
        dt = spent / n / 1000
        best = dt if best is None or dt < best else best
    dist.barrier()
    if r == 1:
        time.sleep(1.0)  # rank 1 is late for this call
    t = time.perf_counter_ns()
    f()
    late = (time.perf_counter_ns() - t) / 1e9
    out[name] = (best, late)
    dist.barrier()
if r == 0:
    for name, (best, late) in out.items():
        print("%s %.1f %.3f" % (name, best, late), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--step-ms", type=float, action="append",
                    help="time between two calls (a training step); "
                    "repeatable; default 0 and 2")
    a = ap.parse_args()
    steps = a.step_ms or [0.0, 2.0]
    print("| per call, nothing pending (2 gloo ranks, CPU, best of %d x %d "
          "calls) | step between calls | inside the call | one call, the "
          "other rank 1 s late |" % (a.rounds, a.calls))
    print("|---|---|---|---|")
    names = {"agree": "checkpoint_requested(): flag reduced in the "
             "background, read at the next call",
             "blocking": "blocking all_reduce + .item() (before)"}
    for ms in steps:
        for line in run(a, ms / 1000.0).strip().splitlines():
            name, best, late = line.split()
            print("| %s | %g ms | %s µs | %s s |" % (names[name], ms, best,
                                                    late), flush=True)


def run(a, step):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        procs = []
        for r in (0, 1):
            env = dict(os.environ, PYTHONPATH=PYDIR, RANK=str(r),
                       WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port)
            for k in ("SPOTD_REQUEST_FILE", "SPOTD_SOCKET", "LOCAL_RANK"):
                env.pop(k, None)
            procs.append(subprocess.Popen(
                [sys.executable, script, str(a.calls), str(a.rounds),
                 str(step)], env=env, stdout=subprocess.PIPE, text=True))
        out = procs[0].communicate(timeout=600)[0]
        procs[1].wait(timeout=60)
    if procs[0].returncode or procs[1].returncode:
        sys.exit("a rank failed")
    return out


if __name__ == "__main__":
    main()
