#!/usr/bin/python3
"""The trainer's stall per DCP checkpoint: a staged save
(spotd.dcp.StagedSaver.stage(): a copy into reused host buffers on every
rank, DCP's write, the ranks' agreement and the marker in a background
thread) against the synchronous spotd.dcp.save() of the same state, side
by side in the same processes, in alternating rounds.

    PYTHONUSERBASE=... /usr/bin/python3 bench/dcp_staged_bench.py
        [--gib 1] [--ranks 2] [--rounds 5] [--steps 10] [--dir /tmp]
        [--markdown]

It starts --ranks processes itself (gloo on 127.0.0.1, no spotd: done()
writes the marker and tells nobody). The state is --gib GiB in all, as
ShardedTensors of 64 MiB per rank (each rank holds and writes its rows,
as FSDP's sharded state dict would; torch 1.13's prototype DCP writes a
plain tensor from rank 0 only) plus the step. Each round runs both cases
in a rotating order, each followed by --steps training-like steps (a
matmul and an in-place update of one 64 MiB shard per step); the staged
case then waits until its folder is marked. The stall is the call's wall
time on the slowest rank (the ranks go on together at their next
collective); medians over the rounds, and their ratio. The first stage()
allocates and touches the buffers and is reported apart. torch 1.13 has
DCP only as the prototype torch.distributed._shard.checkpoint, which
Debian's Python 3.11 imports with the frameworks archive's fix
(PYTHONUSERBASE).
"""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK_ROWS, CHUNK_COLS = 4096, 4096  # fp32: 64 MiB per rank and tensor


def launch(a):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
               WORLD_SIZE=str(a.ranks), LOCAL_WORLD_SIZE=str(a.ranks),
               PYTHONPATH=os.path.join(HERE, "..", "python"))
    for k in ("SPOTD_SOCKET", "SPOTD_REQUEST_FILE", "SPOTD_RESUME_DIR"):
        env.pop(k, None)
    procs = [subprocess.Popen([sys.executable] + sys.argv,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(a.ranks)]
    return max(p.wait() for p in procs)


def rank_main(a):
    import torch
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import (
        Shard, ShardMetadata, init_from_local_shards)
    import spotd
    import spotd.dcp
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    per = CHUNK_ROWS * CHUNK_COLS * 4
    k = max(1, -(-int(a.gib * (1 << 30)) // (per * n)))
    g = torch.Generator().manual_seed(r)
    state = {}
    shards = []
    for i in range(k):
        md = ShardMetadata(shard_offsets=[r * CHUNK_ROWS, 0],
                           shard_sizes=[CHUNK_ROWS, CHUNK_COLS],
                           placement="rank:%d/cpu" % r)
        t = torch.randn(CHUNK_ROWS, CHUNK_COLS, generator=g)
        shards.append(t)
        state["t%d" % i] = init_from_local_shards(
            [Shard(t, md)], n * CHUNK_ROWS, CHUNK_COLS)
    state["step"] = 0
    size = k * per * n
    root = None
    if r == 0:
        root = tempfile.mkdtemp(prefix="dcp-staged-bench-", dir=a.dir)
    box = [root]
    dist.broadcast_object_list(box, src=0)
    os.environ["SPOTD_CKPT_DIR"] = root = box[0]
    ma, mb = torch.randn(768, 768), torch.randn(768, 768)
    saver = spotd.dcp.StagedSaver(limit=2 * k * per + (64 << 20))
    step = [0]

    def next_step():
        step[0] += 1
        state["step"] = step[0]
        return step[0]

    def train(m):
        for i in range(m):
            torch.mm(ma, mb)
            shards[i % len(shards)].mul_(0.999).add_(1e-3)

    def clean(path):
        dist.barrier()
        if r == 0:
            shutil.rmtree(path)
        dist.barrier()

    t0 = time.perf_counter()
    h = saver.stage(state, step=next_step())
    first = time.perf_counter() - t0
    h.wait()
    clean(h.path)
    res = {"sync": [], "staged": []}
    persist = []
    order = ["sync", "staged"]
    for rnd in range(a.rounds):
        for case in order[rnd % 2:] + order[:rnd % 2]:
            dist.barrier()
            t0 = time.perf_counter()
            if case == "sync":
                path = spotd.dcp.save(state, step=next_step())
                stall = time.perf_counter() - t0
            else:
                h = saver.stage(state, step=next_step())
                stall = time.perf_counter() - t0
                path = h.path
            train(a.steps)
            if case == "staged":
                h.wait()
            every = [None] * n
            dist.all_gather_object(every, (stall, h.seconds
                                           if case == "staged" else None))
            res[case].append(max(x[0] for x in every))
            if case == "staged":
                persist.append(max(x[1] for x in every))
            if r == 0:
                print("round %d %-6s stall %.3f s (ranks: %s)" % (
                    rnd + 1, case, res[case][-1],
                    " ".join("%.3f" % x[0] for x in every)),
                    file=sys.stderr, flush=True)
            clean(path)
    saver.wait()
    if r == 0:
        shutil.rmtree(root, ignore_errors=True)
        med = {c: statistics.median(v) for c, v in res.items()}
        rows = [
            ("state", "%.2f GiB: %d ShardedTensors, %d rank(s) x 64 MiB "
             "each" % (size / float(1 << 30), k, n)),
            ("ranks (gloo, one machine)", str(n)),
            ("torch", torch.__version__),
            ("torch threads per rank", str(torch.get_num_threads())),
            ("cores (os.cpu_count)", str(os.cpu_count())),
            ("load average at the end", " ".join(
                "%.2f" % x for x in os.getloadavg())),
            ("rounds", str(a.rounds)),
            ("stall, spotd.dcp.save()", "%.3f s" % med["sync"]),
            ("stall, spotd.dcp.StagedSaver.stage()", "%.3f s" %
             med["staged"]),
            ("stall ratio staged / sync", "%.3f" % (med["staged"] /
                                                    med["sync"])),
            ("first stage() (allocates the buffers)", "%.3f s" % first),
            ("staged persist in the background (slowest rank)", "%.3f s" %
             statistics.median(persist)),
        ]
        if a.markdown:
            print("| measure | value |\n|---|---|")
            for key, v in rows:
                print("| %s | %s |" % (key, v))
        else:
            for key, v in rows:
                print("%-48s %s" % (key, v))
        print("stalls (s): sync %s; staged %s" % (
            " ".join("%.3f" % x for x in res["sync"]),
            " ".join("%.3f" % x for x in res["staged"])))
        print("paired by round (staged / sync): %s" % " ".join(
            "%.3f" % (b / s) for s, b in zip(res["sync"], res["staged"])))
        sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # the helper's and DCP's gloo groups: no teardown to wait on


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if "RANK" not in os.environ:
        sys.exit(launch(a))
    rank_main(a)


if __name__ == "__main__":
    main()
