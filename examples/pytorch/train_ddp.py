#!/usr/bin/python3
"""A small DistributedDataParallel trainer (gloo, CPU) under torchrun, with
the `spotd` Python helper.

    spotd run --job J --store s3://B/P -- torchrun --standalone \\
        --nproc_per_node 2 examples/pytorch/train_ddp.py --steps 200

(Debian's torchrun 1.13 also needs `--redirects 1 --tee 1 --log_dir DIR`.)

What differs from train.py, the single-process example:

- spotd.checkpoint_requested() is a collective here: every rank calls it
  once per step and the ranks agree (one all_reduce), so all of them save
  at the same step even though spotd's request may reach them at
  different moments.
- In `with spotd.checkpoint(step=step) as ck`, ck.writer is local rank 0:
  DDP keeps the weights and the optimizer state identical on every rank,
  so that rank alone writes model.pt, optimizer.pt and trainer.pt; each
  rank writes its own RNG state (rng-rank{K}.pt). The marker comes after
  every rank has left the block.
- Each rank's batch is a function of (seed, step, rank): a resumed run
  sees exactly the batches it would have seen.

A run stopped by spotd and resumed ends byte-identical to an
uninterrupted one (tests/integration/test_pytorch_ddp.py). Output, from
rank 0 only (torchrun --tee prefixes it with "[default0]:"):
    start job=J restart=0 world=2 seed=0 steps=200
    resumed from step-000080 at step 80
    step 90 loss 2.301234
    saved step-000100 at step 100 (signal)
    done at step 200
"""
import argparse
import os
import signal
import sys

try:
    import spotd  # request file, or signal handler: before torch
except ImportError:  # run from a source tree, not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "..", "..", "python"))
    import spotd

D_IN, HIDDEN, CLASSES, BATCH = 32, 128, 10, 32


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="also checkpoint every N steps (0 = never)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--log-every", type=int, default=10, metavar="N")
    p.add_argument("--sleep-per-step", type=float, default=0.0, metavar="SEC")
    p.add_argument("--ckpt-dir", default=None,
                   help="default $SPOTD_CKPT_DIR, else ./checkpoints")
    return p.parse_args()


args = parse_args()
signal.signal(signal.SIGTERM, signal.SIG_DFL)

import time  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def log(msg):
    if dist.get_rank() == 0:
        print(msg, flush=True)


def batch_for(step, rank, teacher):
    g = torch.Generator().manual_seed((args.seed << 40) | (step << 8) | rank)
    x = torch.randn(BATCH, D_IN, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def interned(obj):
    """obj with every str interned (see train.py: pickle's bytes depend on
    which equal strings are the same object)."""
    if isinstance(obj, str):
        return sys.intern(obj)
    if isinstance(obj, dict):
        out = type(obj)((interned(k), interned(v)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)
        if meta is not None:
            out._metadata = interned(meta)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(interned(v) for v in obj)
    return obj


def save(root, step, model, optimizer, reason):
    with spotd.checkpoint(step=step, root=root) as ck:
        if ck.writer:  # replicated state: one copy per node
            parts = {"model.pt": model.module.state_dict(),
                     "optimizer.pt": optimizer.state_dict(),
                     "trainer.pt": {"step": step, "seed": args.seed,
                                    "world": dist.get_world_size()}}
            for fname, obj in parts.items():
                with ck.open(fname) as f:
                    torch.save(interned(obj), f)
        with ck.open("rng-rank%d.pt" % dist.get_rank()) as f:
            torch.save(torch.get_rng_state(), f)
    log("saved %s at step %d (%s)" % (ck.name, step, reason))


def resume(path, model, optimizer):
    def load(fname):
        with open(os.path.join(path, fname), "rb") as f:
            return torch.load(f, map_location="cpu")
    state = load("trainer.pt")
    if (state["seed"], state["world"]) != (args.seed, dist.get_world_size()):
        sys.exit("train_ddp.py: %s was made with --seed %d by %d ranks"
                 % (path, state["seed"], state["world"]))
    model.module.load_state_dict(load("model.pt"))
    optimizer.load_state_dict(load("optimizer.pt"))
    torch.set_rng_state(load("rng-rank%d.pt" % dist.get_rank()))
    return state["step"]


def warm_up(model, loss_fn):
    """One backward pass that changes nothing (no dropout, no RNG, no
    optimizer step): DDP lays out its gradient buckets after its first
    backward, so a fresh and a resumed run then sum gradients in the same
    order. With 3 or more ranks that order shows in the last bits of the
    weights (a + b + c is not c + a + b in floats); with 2 it does not."""
    model.eval()
    loss_fn(model(torch.zeros(1, D_IN)), torch.zeros(1, dtype=torch.long)
            ).backward()
    model.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    root = args.ckpt_dir or spotd.ckpt_root()
    model = DDP(nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(),
                              nn.Dropout(0.1), nn.Linear(HIDDEN, CLASSES)))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    teacher = torch.randn(D_IN, CLASSES,
                          generator=torch.Generator().manual_seed(args.seed))
    loss_fn = nn.CrossEntropyLoss()
    log("start job=%s restart=%d world=%d seed=%d steps=%d"
        % (os.environ.get("SPOTD_JOB", "-"), spotd.restart_count(),
           dist.get_world_size(), args.seed, args.steps))
    torch.manual_seed(args.seed * 1000 + dist.get_rank())  # dropout, per rank

    step = 0
    if spotd.resume_dir():
        step = resume(spotd.resume_dir(), model, optimizer)
        log("resumed from %s at step %d"
            % (os.path.basename(spotd.resume_dir()), step))
    warm_up(model, loss_fn)
    saved_at = None
    model.train()
    while step < args.steps:
        x, y = batch_for(step, dist.get_rank(), teacher)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP averages the gradients over the ranks
        optimizer.step()
        step += 1
        if step % args.log_every == 0:
            log("step %d loss %.6f" % (step, loss.item()))
        # The safe point, on every rank: all of them agree.
        if spotd.checkpoint_requested():
            save(root, step, model, optimizer, "signal")
            saved_at = step
        elif args.save_every and step % args.save_every == 0:
            save(root, step, model, optimizer, "schedule")
            saved_at = step
        if args.sleep_per_step > 0:
            time.sleep(args.sleep_per_step)
    if saved_at != step:
        save(root, step, model, optimizer, "final")
    log("done at step %d" % step)
    dist.barrier()
    dist.destroy_process_group()
    # torch 1.13 on Python 3.11 can hang at interpreter exit (the DDP
    # reducer's gloo group joins a thread that waits for the GIL): the
    # work is saved and flushed, skip the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
