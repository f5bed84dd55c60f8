"""A small torch.distributed run saving with spotd.dcp, for the framework
tests (test_fw_dcp.py), run as spotd would run it under torchrun:

    torchrun --nproc_per_node 2 fw_dcp_trainer.py --steps N [--sleep S]
        [--staged] [--persist-late] [--sync-at K]

A Linear-ReLU-Linear model in DDP (gloo, CPU), SGD with momentum. Each
step's batch comes from a generator seeded with the step and the rank.
The state saved (spotd.dcp.save when spotd.checkpoint_requested()) and
loaded in place at start (spotd.dcp.load from spotd.resume_dir()): the
weights, the momentum buffers and the step, the same keys on every rank
(replicated). Every rank prints after each step

    step G rank R batch SEED loss HEX

and at the end `final rank R SHA256` of the weights.

--staged: the request's save is spotd.dcp.StagedSaver.stage() (every
rank), then training goes on at once (SGD changes the weights and
momentum in place while the persist runs); it prints `staged step N rank
R hash H` (the state's hash at stage() time), `state step N rank R hash
H` after every step, and on resume `resumed from DIR at step N hash H`
(the loaded state's). --persist-late (a knob of this trainer, not of the
library): its DCP storage writer (in the persist's thread) writes only
once the training has gone past the staged step (at most 60 s), and
prints `writing step N rank R at step M` then: the steps surely change
the state in place during the persist. At the end it waits for the
persist in flight. --sync-at K: a save of its own after step K, with the
synchronous spotd.dcp.save() (every rank), whatever --staged says;
rank 0 then prints `saved step-K files F...` (the folder's files)."""
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


def digest(state):
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode() + state[k].numpy().tobytes())
    return h.hexdigest()


def late_writer(live, rank):
    """A DCP FileSystemWriter that writes step-N once live() > N."""
    dcp = spotd.dcp._dcp()

    class Late(dcp.FileSystemWriter):
        def write_data(self, plan, planner):
            n = int(str(self.path).rsplit("-", 1)[-1])
            end = time.monotonic() + 60
            while live() <= n and time.monotonic() < end:
                time.sleep(0.02)
            say("writing step %d rank %d at step %d" % (n, rank, live()))
            return super().write_data(plan, planner)
    return Late


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--staged", action="store_true")
    ap.add_argument("--persist-late", action="store_true")
    ap.add_argument("--sync-at", type=int, default=0)
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
            say("resumed from %s at step %d hash %s" % (
                spotd.resume_dir(), int(step), digest(state)))
    saver = None
    if a.staged:
        saver = spotd.dcp.StagedSaver(storage_writer=late_writer(
            lambda: int(step), rank) if a.persist_late else None)
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
        if saver is not None:
            say("state step %d rank %d hash %s" % (int(step), rank,
                                                   digest(state)))
        if a.sleep:
            time.sleep(a.sleep)
        if int(step) == a.sync_at:
            path = spotd.dcp.save(state, step=int(step))
            if rank == 0:  # the marker is rank 0's: written on return
                say("saved %s files %s" % (os.path.basename(path),
                                           " ".join(sorted(os.listdir(path)))))
        if spotd.checkpoint_requested():  # every rank, same answer
            if saver is None:
                spotd.dcp.save(state, step=int(step))
            else:
                h = digest(state)
                saver.stage(state, step=int(step))
                say("staged step %d rank %d hash %s" % (int(step), rank, h))
    if saver is not None:
        saver.wait()  # before the process group goes
    h = hashlib.sha256()
    for k, v in sorted(net.state_dict().items()):
        h.update(k.encode() + v.numpy().tobytes())
    say("final rank %d %s" % (rank, h.hexdigest()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
