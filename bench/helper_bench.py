#!/usr/bin/python3
"""What spotd.checkpoint_requested() costs per call with nothing pending,
outside torch.distributed: the request channel (a request file made here as
spotd makes it) and, for comparison, the signal fallback (no request file:
a flag read). Each case runs in a fresh interpreter; N calls are timed
with time.perf_counter_ns (wall) and time.process_time_ns (CPU, steadier
on a loaded machine); the best of R rounds is printed in ns per call.
With --torch, also with torch imported (not initialised).

    /usr/bin/python3 bench/helper_bench.py [--calls 1000000] [--rounds 5]
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(HERE, "..", "python")

CHILD = r"""
import sys, time
if sys.argv[3] == "1":
    import torch  # noqa: F401
import spotd
n, rounds = int(sys.argv[1]), int(sys.argv[2])
f = spotd.checkpoint_requested
best, cpu = None, None
for _ in range(rounds):
    t, c = time.perf_counter_ns(), time.process_time_ns()
    for _ in range(n):
        f()
    dt = (time.perf_counter_ns() - t) / n
    dc = (time.process_time_ns() - c) / n
    best = dt if best is None or dt < best else best
    cpu = dc if cpu is None or dc < cpu else cpu
print("%.0f %.0f %s" % (best, cpu, spotd.request_channel() is not None))
"""


def run(calls, rounds, req, with_torch):
    env = dict(os.environ, PYTHONPATH=PYDIR)
    for k in ("SPOTD_REQUEST_FILE", "SPOTD_SIGNAL", "RANK", "WORLD_SIZE"):
        env.pop(k, None)
    if req:
        env["SPOTD_REQUEST_FILE"] = req
    cp = subprocess.run([sys.executable, "-c", CHILD, str(calls), str(rounds),
                         "1" if with_torch else "0"], env=env,
                        capture_output=True, text=True, check=True)
    ns, cpu, chan = cp.stdout.split()
    if (chan == "True") != bool(req):
        sys.exit("the helper did not take the expected path: " + cp.stderr)
    return float(ns), float(cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=1000000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--torch", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotd-helper-bench-") as d:
        req = os.path.join(d, "spotd.sock.req")
        with open(req, "wb") as f:  # seq 0, served 0: nothing pending
            f.write(b"SPOTDREQ" + struct.pack("<IIQQQ", 2, 0, 0, 0, 0) +
                    b"\0" * (4096 - 40))
        print("python %s, %d calls, best of %d rounds" % (
            sys.version.split()[0], a.calls, a.rounds))
        cases = [("request channel", req, False),
                 ("signal flag (fallback)", None, False)]
        if a.torch:
            cases += [("request channel, torch imported", req, True),
                      ("signal flag, torch imported", None, True)]
        print("%-34s %8s %8s" % ("ns per call", "wall", "CPU"))
        for what, r, t in cases:
            print("%-34s %8.0f %8.0f" % ((what,) + run(a.calls, a.rounds, r, t)),
                  flush=True)


if __name__ == "__main__":
    main()
