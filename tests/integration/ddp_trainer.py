#!/usr/bin/python3
"""A tiny torch.distributed (gloo, CPU) trainer for the torchrun tests,
following the trainer contract with no wrapper: each worker counts the
checkpoint signals it got; every step the ranks agree on the highest count
with one all-reduce (MAX) and save when it is above the count already
served, so all save at the same step into SPOTD_CKPT_DIR/step-N (rank-R.pt
each); after a barrier rank 0 writes SPOTD_COMPLETE. A count, not a flag
cleared after the save: spotd signals the process group once, and a rank
whose Python handler runs late (after the all-reduce that already made the
others save) must not ask for a second checkpoint.

Each worker appends JSON lines to LOG.rank-R: start (pid, step), step
(--report: after each optimizer step, also told to spotd with
spotd.report_step), checkpoint. With SPOTD_RESUME_DIR set, each worker
resumes from its rank-R.pt there. Multi-node (torchrun --nnodes N), each
node's local rank 0 writes the node's SPOTD_COMPLETE."""
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

GOT = {"n": 0}


def resume_state(rank):
    """The state in SPOTD_RESUME_DIR's rank-R.pt, or None."""
    rd = os.environ.get("SPOTD_RESUME_DIR")
    if not rd:
        return None
    for root, _, files in os.walk(rd):
        if "rank-%d.pt" % rank in files:
            with open(os.path.join(root, "rank-%d.pt" % rank), "rb") as f:
                return torch.load(f)
    return None


def reporter():
    try:
        import spotd
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
            __file__)), "..", "..", "python"))
        import spotd
    return spotd.report_step


def main():
    log_base = sys.argv[1]
    report = reporter() if "--report" in sys.argv[2:] else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log = open("%s.rank-%d" % (log_base, rank), "a", buffering=1)

    def emit(ev, **kw):
        kw.update(ev=ev, t=time.time())
        log.write(json.dumps(kw) + "\n")

    signal.signal(int(os.environ.get("SPOTD_SIGNAL") or signal.SIGUSR1),
                  lambda s, f: GOT.update(n=GOT["n"] + 1))
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    step = 0
    state = resume_state(rank)
    if state is not None:
        model.load_state_dict(state["model"])
        step = state["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    emit("start", pid=os.getpid(), pgid=os.getpgrp(), step=step)
    ckpt_dir = os.environ["SPOTD_CKPT_DIR"]
    served = 0
    while True:
        x = torch.randn(8, 16)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if report is not None:
            report(step, force=True)
            emit("step", step=step)
        asked = torch.tensor([GOT["n"]])
        dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        if asked.item() > served:
            served = asked.item()
            path = os.path.join(ckpt_dir, "step-%06d" % step)
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "rank-%d.pt" % rank), "wb") as f:
                torch.save({"model": model.state_dict(), "step": step}, f)
            dist.barrier()
            if int(os.environ.get("LOCAL_RANK", rank)) == 0:
                open(os.path.join(path, "SPOTD_COMPLETE"), "w").close()
            emit("checkpoint", name=os.path.basename(path), step=step)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
