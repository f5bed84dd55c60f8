#!/usr/bin/python3
"""The trainer's stall per checkpoint: a staged save (spotd.StagedSaver:
a copy into reused host buffers, the persist in the background) against
torch.save + spotd.done() (the plain helper: spotd.checkpoint(), which
fsyncs before the marker), of the same CPU state, side by side in one
process, in alternating rounds; and the time of the whole interval
between two checkpoints (the checkpoint, then STEPS training-like steps
that change the state in place, then until the staged persist is marked)
against the same steps without a checkpoint: the background persist
shares the cores with the steps, so its cost shows there, not in the
stall.

    /usr/bin/python3 bench/staged_bench.py [--gib 1] [--rounds 5]
        [--steps 40] [--dir /tmp] [--markdown]

The state: fp32 tensors of 64 MiB (a third "model", two thirds "Adam
moments") plus a few plain objects, --gib GiB in all. Each round runs
the three cases (sync, staged, none) in a rotating order; medians are
printed, with the ratios. The first stage() allocates and touches the
buffers (reported apart, not in the medians). No spotd is needed (done()
writes the marker; with $SPOTD_SOCKET unset it tells nobody).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
os.environ.pop("SPOTD_SOCKET", None)
os.environ.pop("SPOTD_REQUEST_FILE", None)

import torch  # noqa: E402

import spotd  # noqa: E402

CHUNK = 16 << 20  # fp32 elements: 64 MiB per tensor


def make_state(gib):
    n = max(3, -(-int(gib * (1 << 30)) // (CHUNK * 4)))  # at least gib
    pairs = -(-(n - -(-n // 3)) // 2)
    k = n - 2 * pairs
    g = torch.Generator().manual_seed(1)
    ts = [torch.randn(CHUNK, generator=g) for _ in range(n)]
    return {"model": {"w%d" % i: ts[i] for i in range(k)},
            "optim": {"state": {i: {"exp_avg": ts[k + 2 * i],
                                    "exp_avg_sq": ts[k + 2 * i + 1]}
                                for i in range(pairs)},
                      "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999)}]},
            "rng": torch.get_rng_state(), "step": 0}


def tensors(state):
    out = list(state["model"].values())
    for s in state["optim"]["state"].values():
        out += [s["exp_avg"], s["exp_avg_sq"]]
    return out


def steps(state, k, a, b):
    """k training-like steps: a matmul (compute) and an in-place update of
    a sixteenth of the state (the optimizer, memory)."""
    ts = tensors(state)
    for i in range(k):
        torch.mm(a, b)
        t = ts[i % len(ts)]
        t.mul_(0.999).add_(1e-3)


def sync_save(state, step):
    t0 = time.perf_counter()
    with spotd.checkpoint(step=step) as ck:
        with ck.open(spotd.staged.FILENAME) as f:
            torch.save(state, f)
    return time.perf_counter() - t0, ck.path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="staged-bench-", dir=a.dir)
    os.environ["SPOTD_CKPT_DIR"] = root
    state = make_state(a.gib)
    size = sum(t.numel() * t.element_size() for t in tensors(state))
    ma, mb = torch.randn(768, 768), torch.randn(768, 768)
    saver = spotd.StagedSaver(limit=2 * size + (64 << 20))
    step = [0]

    def next_step():
        step[0] += 1
        state["step"] = step[0]
        return step[0]

    t0 = time.perf_counter()
    h = saver.stage(state, step=next_step())
    first = time.perf_counter() - t0
    h.wait()
    shutil.rmtree(h.path)
    res = {"sync": [], "staged": [], "none": []}
    inter = {"sync": [], "staged": [], "none": []}
    persist = []
    order = ["sync", "staged", "none"]
    for r in range(a.rounds):
        for case in order[r % 3:] + order[:r % 3]:
            t0 = time.perf_counter()
            path = None
            if case == "sync":
                stall, path = sync_save(state, next_step())
            elif case == "staged":
                h = saver.stage(state, step=next_step())
                stall = time.perf_counter() - t0
                path = h.path
            else:
                stall = 0.0
            steps(state, a.steps, ma, mb)
            if case == "staged":
                h.wait()
                persist.append(h.seconds)
            inter[case].append(time.perf_counter() - t0)
            res[case].append(stall)
            if path:
                shutil.rmtree(path)
            print("round %d %-6s stall %.3f s, interval %.3f s" % (
                r + 1, case, stall, inter[case][-1]), file=sys.stderr,
                flush=True)
    shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    mint = {k: statistics.median(v) for k, v in inter.items()}
    rows = [
        ("state", "%.2f GiB (%d tensors of 64 MiB)" % (
            size / float(1 << 30), len(tensors(state)))),
        ("torch threads", str(torch.get_num_threads())),
        ("cores (os.cpu_count)", str(os.cpu_count())),
        ("rounds", str(a.rounds)),
        ("stall, torch.save + done()", "%.3f s" % med["sync"]),
        ("stall, staged (stage())", "%.3f s" % med["staged"]),
        ("stall ratio staged / sync", "%.3f" % (med["staged"] / med["sync"])),
        ("first stage() (allocates the buffers)", "%.3f s" % first),
        ("staged persist in the background", "%.3f s" %
         statistics.median(persist)),
        ("interval, no checkpoint (%d steps)" % a.steps, "%.3f s" %
         mint["none"]),
        ("interval, torch.save + done()", "%.3f s (+%.0f %%)" % (
            mint["sync"], 100 * (mint["sync"] / mint["none"] - 1))),
        ("interval, staged (until marked)", "%.3f s (+%.0f %%)" % (
            mint["staged"], 100 * (mint["staged"] / mint["none"] - 1))),
    ]
    if a.markdown:
        print("| measure | value |\n|---|---|")
        for k, v in rows:
            print("| %s | %s |" % (k, v))
    else:
        for k, v in rows:
            print("%-42s %s" % (k, v))
    print("stalls (s): sync %s; staged %s" % (
        " ".join("%.3f" % x for x in res["sync"]),
        " ".join("%.3f" % x for x in res["staged"])))


if __name__ == "__main__":
    main()
