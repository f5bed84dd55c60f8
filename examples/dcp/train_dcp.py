#!/usr/bin/env python3
"""torch.distributed.checkpoint (DCP) under spotd and torchrun: every rank
writes its own shard files into one checkpoint folder, and the folder is
marked complete once all of them are written.

    spotd run --job J --store s3://B/P -- \\
        torchrun --nproc_per_node 2 examples/dcp/train_dcp.py --steps 500

With --fsdp (and CUDA) the model is wrapped in FSDP and the optimizer and
model state are sharded: each rank saves only its shards. Without it the
model is DDP (gloo on CPU, nccl on GPUs) and DCP writes each replicated
tensor once.

The lines that make it a spotd job:

- spotd.checkpoint_requested() after each optimizer step, on every rank
  (a collective: the ranks agree on the step).
- spotd.dcp.save(state, step=step) on every rank: a new folder
  SPOTD_CKPT_DIR/step-NNNNNN, each rank's shards and DCP's metadata in it,
  then one SPOTD_COMPLETE per node after every rank is done.
- spotd.dcp.load(state) at start: loads from spotd.resume_dir() in place
  when spotd restored a checkpoint.
- With --staged, spotd.dcp.stage(state, step=step) in place of save():
  each rank copies its state into host buffers and trains on; a thread
  writes the same folder and marks it once every rank has written (wait
  for it before destroy_process_group()).

Several nodes: DCP's checkpoint is one folder for all ranks, so
SPOTD_CKPT_DIR should be on storage every node sees. Needs torch 2.2 or
newer (get_state_dict/set_state_dict).
"""
import argparse
import os
import sys

try:
    import spotd
except ImportError:  # run from a source tree, not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "..", "..", "python"))
    import spotd
import spotd.dcp

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (get_state_dict,
                                                     set_state_dict)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--staged", action="store_true",
                   help="staged saves (spotd.dcp.stage)")
    a = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    dev = torch.device("cuda", spotd.local_rank()) if cuda else \
        torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    torch.manual_seed(a.seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256)).to(dev)
    if a.fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dev.index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    step = 0
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": 0}
    if spotd.dcp.load(state):  # in place, from spotd.resume_dir()
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        step = state["step"]
        if rank == 0:
            print("resumed from %s at step %d" % (spotd.resume_dir(), step),
                  flush=True)
    while step < a.steps:
        g = torch.Generator().manual_seed(a.seed * 1000003 + step * 97 + rank)
        x = torch.randn(32, 256, generator=g).to(dev)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0:
            spotd.report_step(step)
            if step % 50 == 0:
                print("step %d loss %.6f" % (step, loss.item()), flush=True)
        if spotd.checkpoint_requested():  # every rank, same answer
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd, "step": step}
            if a.staged:  # a copy; written and marked in the background
                path = spotd.dcp.stage(state, step=step).path
            else:
                path = spotd.dcp.save(state, step=step)
            if rank == 0:
                print("%s %s at step %d" % ("staged" if a.staged else "saved",
                                            os.path.basename(path), step),
                      flush=True)
    if a.staged:
        spotd.dcp.default_saver().wait()  # the persist in flight
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
