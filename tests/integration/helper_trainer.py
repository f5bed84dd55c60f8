#!/usr/bin/python3
"""A torch.distributed (gloo, CPU) worker that uses the spotd helper, for
the launcher tests (launcher_standin.py starts it as torchrun would).

    helper_trainer.py --log BASE [--steps N] [--sleep SEC] [--slow-rank0 SEC]

Resumes from spotd.resume_dir() (trainer.json: step, weight); sleeps
--slow-rank0 seconds on rank 0 before init_process_group, so that the
other ranks wait in their rendezvous; then trains: one all_reduce per
step, spotd.checkpoint_requested() once per step on every rank, and when
it is true saves inside spotd.checkpoint(step=step) (local rank 0 writes
trainer.json, every rank rank-K.pt). --steps 0 runs until stopped.

Appends JSON lines to BASE.rank-R: start (pid, ppid, pgid, sid, resumed
step and folder, the request file it maps), rendezvous, joined, step,
checkpoint (name, step), done."""
import argparse
import datetime
import json
import os
import sys
import time

try:
    import spotd
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "..", "..", "python"))
    import spotd

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--sleep", type=float, default=0.05)
    ap.add_argument("--slow-rank0", type=float, default=0.0)
    a = ap.parse_args()
    rank = int(os.environ["RANK"])
    log = open("%s.rank-%d" % (a.log, rank), "a", buffering=1)

    def emit(ev, **kw):
        kw.update(ev=ev, t=time.time(), rank=rank)
        log.write(json.dumps(kw) + "\n")

    step, w = 0, 0.0
    resume = spotd.resume_dir()
    if resume:
        with open(os.path.join(resume, "trainer.json")) as f:
            st = json.load(f)
        step, w = st["step"], st["w"]
    emit("start", pid=os.getpid(), ppid=os.getppid(), pgid=os.getpgrp(),
         sid=os.getsid(0), step=step,
         resume=os.path.basename(resume) if resume else None,
         channel=spotd.request_channel())
    if rank == 0 and a.slow_rank0 > 0:
        time.sleep(a.slow_rank0)
    emit("rendezvous")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    emit("joined")
    while a.steps == 0 or step < a.steps:
        t = torch.tensor([1.0 + rank])
        dist.all_reduce(t)
        w += 0.001 * float(t.item())
        step += 1
        if rank == 0:
            spotd.report_step(step)
        emit("step", step=step)
        if spotd.checkpoint_requested():
            with spotd.checkpoint(step=step) as ck:
                if ck.writer:
                    with ck.open("trainer.json") as f:
                        f.write(json.dumps({"step": step, "w": w}).encode())
                with ck.open("rank-%d.pt" % rank) as f:
                    torch.save({"step": step, "w": w, "rank": rank}, f)
            emit("checkpoint", name=ck.name, step=step)
        time.sleep(a.sleep)
    emit("done", step=step)
    log.close()
    # torch 1.13 can hang at interpreter exit after gloo: leave at once.
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
