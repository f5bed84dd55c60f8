"""A small torch.distributed run saving with spotd.dcp, for the framework
tests (test_fw_dcp.py), run as spotd would run it under torchrun:

    torchrun --nproc_per_node 2 fw_dcp_trainer.py --steps N [--sleep S]

A Linear-ReLU-Linear model in DDP (gloo, CPU), SGD with momentum. Each
step's batch comes from a generator seeded with the step and the rank.
The state saved (spotd.dcp.save when spotd.checkpoint_requested()) and
loaded in place at start (spotd.dcp.load from spotd.resume_dir()): the
weights, the momentum buffers and the step, the same keys on every rank
(replicated). Every rank prints after each step

    step G rank R batch SEED loss HEX

and at the end `final rank R SHA256` of the weights."""
import argparse
import hashlib
import os
import sys
import time

import spotd
import spotd.dcp
import torch
import torch.distributed as dist


def say(line):
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--sleep", type=float, default=0.0)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(7)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 1))
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
    for p in net.parameters():  # the buffers exist before the first step
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    step = torch.zeros((), dtype=torch.int64)
    state = {"model.%s" % k: v for k, v in net.state_dict().items()}
    for i, p in enumerate(net.parameters()):
        state["momentum.%d" % i] = opt.state[p]["momentum_buffer"]
    state["step"] = step
    if spotd.dcp.load(state):  # in place, from spotd.resume_dir()
        if rank == 0:
            say("resumed from %s at step %d" % (spotd.resume_dir(),
                                                int(step)))
    while int(step) < a.steps:
        seed = 1000 * (int(step) + 1) + rank
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        say("step %d rank %d batch %d loss %s" % (int(step), rank, seed,
                                                  float(loss).hex()))
        if a.sleep:
            time.sleep(a.sleep)
        if spotd.checkpoint_requested():  # every rank, same answer
            spotd.dcp.save(state, step=int(step))
    h = hashlib.sha256()
    for k, v in sorted(net.state_dict().items()):
        h.update(k.encode() + v.numpy().tobytes())
    say("final rank %d %s" % (rank, h.hexdigest()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
