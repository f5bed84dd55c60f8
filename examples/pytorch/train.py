#!/usr/bin/python3
"""A small PyTorch trainer that follows spotd's trainer contract.

    spotd run --job J --store s3://B/P -- /usr/bin/python3 examples/pytorch/train.py

What spotd needs from a trainer, done here with the `spotd` Python helper
(python/spotd, installed by `meson install`; from a source tree it is
found next to this file):

1. `import spotd` first. Under spotd it maps spotd's request file and
   checkpoint_requested() reads requests from it, no signal involved;
   without spotd (or with --signal) the checkpoint signal (SIGUSR1, or
   --signal) only sets a flag, so an early signal cannot kill the import
   of torch.
2. After optimizer.step(), when spotd.checkpoint_requested() is True, the
   trainer saves model, optimizer, step and every RNG state inside
   `with spotd.checkpoint(step=step)`: a NEW folder under SPOTD_CKPT_DIR,
   named step-NNNNNN, that gets the SPOTD_COMPLETE marker only after every
   file is written and fsync'ed, never after an exception
   (save_checkpoint). spotd never uploads a folder without that marker.
3. When spotd.resume_dir() is set, spotd restored that checkpoint before
   launch: the trainer loads it and carries on from its step (resume).
4. SIGTERM: spotd sends it only after the checkpoint is committed, so the
   trainer saves nothing and dies at once (default action, exit status 143).

Checkpoints are also made every --save-every steps, and always at the end:
the final checkpoint is step-NNNNNN with NNNNNN = --steps, and the exit
status is 0 once it is written.

Determinism: two runs with the same arguments write byte-identical
checkpoints, and a run stopped and resumed (any number of times) ends
byte-identical to an uninterrupted one. It takes: batches that are a
function of (seed, step) only; every RNG state in the checkpoint; a fixed
thread count; torch.save to an open file (given a path it records the path
in the archive); interned strings (pickle's memo depends on object identity).

Output, one line each, for people and for tests:
    start job=J restart=0 model=small params=152330 seed=0 steps=300 threads=1
    resumed from step-000120 at step 120
    step 130 loss 2.301234
    saved step-000140 at step 140 (signal, 1.8 MB in 0.01 s)
    done at step 300
"""
import argparse
import os
import signal
import sys
import time

try:
    import spotd  # request file, or signal handler: before torch
except ImportError:  # run from a source tree, not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "..", "..", "python"))
    import spotd

CKPT_FILES = ("model.pt", "optimizer.pt", "trainer.pt")

# name: (input width, hidden width, hidden layers, classes, batch size).
# Debian's torch uses a slow reference BLAS (~1 GFLOP/s per core), so both
# keep the batch small. "large" is ~50M parameters: a ~600 MB checkpoint
# (weights + Adam's two moments) for the end-to-end benchmark.
MODEL_SIZES = {
    "small": (64, 256, 3, 10, 64),
    "large": (64, 4096, 4, 10, 2),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300,
                   help="optimizer steps in total (default 300)")
    p.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="also checkpoint every N steps (0 = never, default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="small")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; keep it fixed for bitwise results")
    p.add_argument("--log-every", type=int, default=10, metavar="N",
                   help="print the loss every N steps (default 10)")
    p.add_argument("--sleep-per-step", type=float, default=0.0, metavar="SEC",
                   help="slow each step down (to preempt mid-run in tests)")
    p.add_argument("--slow-save", type=float, default=0.0, metavar="SEC",
                   help="pause SEC after the first file of each save (tests: "
                   "a preemption in the middle of a save)")
    p.add_argument("--signal", default=None,
                   help="take requests by this signal too, e.g. USR1, "
                   "SIGUSR2 (default: spotd's request file; without it "
                   "$SPOTD_SIGNAL, else USR1)")
    p.add_argument("--ckpt-dir", default=None,
                   help="default $SPOTD_CKPT_DIR, else ./checkpoints")
    args = p.parse_args()
    if args.steps < 0 or args.save_every < 0 or args.log_every < 1:
        p.error("--steps and --save-every must be >= 0, --log-every >= 1")
    if args.signal:  # else import spotd chose: the request file or the signal
        try:
            spotd.install(args.signal)  # the flag checkpoint_requested() reads
        except ValueError as e:
            p.error(str(e))
    return args


def log(msg):
    # flush: spotd and the tests read this line by line through a pipe.
    print(msg, flush=True)


args = parse_args()
# SIG_DFL for SIGTERM undoes an inherited "ignore": spotd's SIGTERM comes
# only after the checkpoint is committed, and ends us at once.
signal.signal(signal.SIGTERM, signal.SIG_DFL)

import random  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

try:
    import numpy  # noqa: E402  (not used here, but saved if your code uses it)
except ImportError:
    numpy = None


def make_model(size):
    d_in, hidden, layers, classes, _ = MODEL_SIZES[size]
    mods = [nn.Linear(d_in, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.1)]
    mods.append(nn.Linear(hidden, classes))
    return nn.Sequential(*mods)


def make_teacher(seed, size):
    """A fixed random linear map that labels the synthetic inputs."""
    d_in, _, _, classes, _ = MODEL_SIZES[size]
    g = torch.Generator().manual_seed(seed)
    return torch.randn(d_in, classes, generator=g)


def batch_for(seed, step, size, teacher):
    """The batch of a step depends on (seed, step) only, never on what ran
    before: a resumed run sees exactly the batches it would have seen.
    With a real dataset: a sampler seeded with (seed, epoch), skipping the
    samples already consumed in the epoch."""
    d_in, _, _, _, batch = MODEL_SIZES[size]
    g = torch.Generator().manual_seed(((seed & 0xFFFFFFFF) << 32) | step)
    x = torch.randn(batch, d_in, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return x, y


def interned(obj):
    """obj with every str interned. pickle writes a string once per object
    and back-references repeats of the SAME object, so equal strings that
    are distinct objects (as after a resume) would change the bytes."""
    if isinstance(obj, str):
        return sys.intern(obj)
    if isinstance(obj, dict):
        out = type(obj)((interned(k), interned(v)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)  # module state_dict versions
        if meta is not None:
            out._metadata = interned(meta)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(interned(v) for v in obj)
    return obj


def save_checkpoint(root, step, model, optimizer, reason):
    t0 = time.monotonic()
    trainer_state = {
        "step": step,
        "seed": args.seed,
        "model_size": args.model_size,
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": numpy.random.get_state() if numpy else None,
    }
    parts = {
        "model.pt": model.state_dict(),
        "optimizer.pt": optimizer.state_dict(),
        "trainer.pt": trainer_state,
    }
    size = 0
    # A new folder step-NNNNNN (a suffix if taken: never reuse one, spotd
    # may be uploading it); SPOTD_COMPLETE once the block ends, after
    # every file is fsynced: from then on spotd may upload it.
    with spotd.checkpoint(step=step, root=root) as ck:
        for fname in CKPT_FILES:
            with ck.open(fname) as f:  # fsynced when closed
                torch.save(interned(parts[fname]), f)  # a file, not a path
                size += f.tell()
            if args.slow_save > 0 and fname == CKPT_FILES[0]:
                time.sleep(args.slow_save)  # half-written: no marker yet
    log("saved %s at step %d (%s, %.1f MB in %.2f s)"
        % (ck.name, step, reason, size / 1e6, time.monotonic() - t0))


def resume(path, model, optimizer):
    """Loads a checkpoint folder written by save_checkpoint; returns its step."""
    def load(fname):
        with open(os.path.join(path, fname), "rb") as f:
            return torch.load(f, map_location="cpu")

    state = load("trainer.pt")
    if (state["seed"], state["model_size"]) != (args.seed, args.model_size):
        sys.exit("train.py: %s was made with --seed %d --model-size %s"
                 % (path, state["seed"], state["model_size"]))
    model.load_state_dict(load("model.pt"))
    optimizer.load_state_dict(load("optimizer.pt"))
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    if numpy and state["numpy_rng"] is not None:
        numpy.random.set_state(state["numpy_rng"])
    return state["step"]


def main():
    ckpt_root = args.ckpt_dir or spotd.ckpt_root()
    resume_dir = spotd.resume_dir()

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    if numpy:
        numpy.random.seed(args.seed)

    model = make_model(args.model_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    teacher = make_teacher(args.seed, args.model_size)
    loss_fn = nn.CrossEntropyLoss()
    log("start job=%s restart=%d model=%s params=%d seed=%d steps=%d threads=%d"
        % (os.environ.get("SPOTD_JOB", "-"),
           spotd.restart_count(), args.model_size,
           sum(p.numel() for p in model.parameters()), args.seed, args.steps,
           args.threads))

    step = 0  # optimizer steps done
    if resume_dir:
        step = resume(resume_dir, model, optimizer)
        log("resumed from %s at step %d"
            % (os.path.basename(os.path.normpath(resume_dir)), step))

    saved_at = None
    model.train()
    while step < args.steps:
        x, y = batch_for(args.seed, step, args.model_size, teacher)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        spotd.report_step(step)  # the job history counts lost steps
        if step % args.log_every == 0:
            log("step %d loss %.6f" % (step, loss.item()))

        # The safe point: between optimizer steps.
        if spotd.checkpoint_requested():  # a signal mid-save asks again
            save_checkpoint(ckpt_root, step, model, optimizer, "signal")
            saved_at = step
        elif args.save_every and step % args.save_every == 0:
            save_checkpoint(ckpt_root, step, model, optimizer, "schedule")
            saved_at = step
        if args.sleep_per_step > 0:
            time.sleep(args.sleep_per_step)

    if saved_at != step:
        save_checkpoint(ckpt_root, step, model, optimizer, "final")
    log("done at step %d" % step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
