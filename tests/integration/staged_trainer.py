"""A trainer on spotd's staged saves, for test_staged.py: a small model
and Adam on CPU, deterministic (its data comes from torch's generator,
whose state is saved with the model), one step every T_PAUSE seconds.

    python3 staged_trainer.py LOG STEPS

A resumed run stops after T_RESUMED_STEPS more steps when that is set,
and with T_SELF_AT=K stages a checkpoint of its own K steps after its
start (no request: a periodic save of the trainer's). At the end it
waits for the persist in flight, still answering requests meanwhile.

When asked for a checkpoint it stages {model, optim, rng, step} with
spotd.StagedSaver (unless a staged save is still persisting: that one
answers the request) and logs the state's hash at stage() time, then
trains on at once: the optimizer changes the tensors in place while the
persist runs. Every step logs the hash of the state after it.

The test slows the persist through the saver's writer (a knob of this
trainer, not of the library): T_SLOW seconds before torch.save, and
while the file T_HANG exists, after writing the file (without the
marker) it logs "writing" and sleeps (the test kills it there)."""
import hashlib
import json
import os
import sys
import time

import torch

import spotd

log_path, steps = sys.argv[1], int(sys.argv[2])
pause = float(os.environ.get("T_PAUSE") or 0.02)
slow = float(os.environ.get("T_SLOW") or 0)
hang = os.environ.get("T_HANG")


RUN = os.urandom(6).hex()  # pids repeat: each run has a pid namespace


def ev(**e):
    e["pid"], e["run"] = os.getpid(), RUN
    with open(log_path, "a") as f:
        f.write(json.dumps(e) + "\n")


def digest(state):
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, torch.Tensor):
            h.update(x.detach().contiguous().numpy().tobytes())
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(str(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            h.update(repr(x).encode())
    walk(state)
    return h.hexdigest()


def writer(snap, folder, filename):
    time.sleep(slow)
    with open(os.path.join(folder, filename), "wb") as f:
        torch.save(snap, f)
    if hang and os.path.exists(hang):
        ev(ev="writing", step=snap["step"], folder=os.path.basename(folder))
        while os.path.exists(hang):
            time.sleep(0.05)


torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(),
                            torch.nn.Linear(128, 8))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
step = 0


def state():
    return {"model": model.state_dict(), "optim": opt.state_dict(),
            "rng": torch.get_rng_state(), "step": step}


r = spotd.resume_dir()
if r:
    st = torch.load(os.path.join(r, spotd.staged.FILENAME))
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["optim"])
    torch.set_rng_state(st["rng"])
    step = st["step"]
    self_at = step + int(os.environ.get("T_SELF_AT") or 0) \
        if os.environ.get("T_SELF_AT") else None
    steps = min(steps, step + int(os.environ.get("T_RESUMED_STEPS") or steps))
    ev(ev="start", step=step, resume=os.path.basename(r), hash=digest(st))
else:
    self_at = None
    ev(ev="start", step=0, resume=None)

saver = spotd.StagedSaver(writer=writer)
while step < steps:
    time.sleep(pause)
    x = torch.randn(16, 64)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    ev(ev="step", step=step, hash=digest(state()))
    if step == self_at:
        s = state()
        h = saver.stage(s, step=step)
        ev(ev="staged", step=step, name=h.name, hash=digest(s), own=True)
    if spotd.checkpoint_requested():
        busy = saver.persisting
        if busy is not None:
            ev(ev="answered", step=step, by=busy.name)
        else:
            s = state()
            h = saver.stage(s, step=step)
            ev(ev="staged", step=step, name=h.name, hash=digest(s))
while saver.persisting is not None:
    if spotd.checkpoint_requested():  # the save in flight answers it
        ev(ev="answered", step=step, by=saver.persisting.name)
    time.sleep(0.02)
saver.wait()
ev(ev="done", step=step)
