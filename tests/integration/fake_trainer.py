#!/usr/bin/python3
"""A fake trainer that follows the trainer contract (README "Quick start",
"How a request reaches the trainer"), for the daemon's integration tests.

It counts steps (a short sleep each), and:
  - on the checkpoint signal ($SPOTD_SIGNAL, SIGUSR1 without it, or --signal) sets a flag; at the
    next step it writes SPOTD_CKPT_DIR/step-NNNNNN/ (a `step` file, a
    `data.bin` of --bytes bytes) and then the empty SPOTD_COMPLETE marker;
  - resumes from SPOTD_RESUME_DIR/step when that is set;
  - optionally ignores the signal, crashes at step N (exit status or a
    signal), exits 0 at step N, checkpoints on its own every N steps,
    ignores SIGTERM;
  - with --read-deadline, reads spotd.deadline() of the Python helper
    (imported then, not at start) at each checkpoint it is asked for, and
    puts it in the event: "deadline" (seconds, or null) between the times
    "dl_t0" and "dl_t1" (before and after the read);
  - with --save-with LOG, writes each checkpoint that another trainer's
    event log LOG records, under the same name, as the ranks of a job that
    agree on the step to save at do (train_ddp.py's all_reduce).

Every event is one JSON line appended to the file named by --log (default:
$FAKE_TRAINER_LOG), flushed at once, so a test can follow it:
  {"ev": "start", "pid": .., "env": {SPOTD_* variables}, "step": first}
  {"ev": "step", "step": N}
  {"ev": "signal", "step": N}
  {"ev": "checkpoint", "name": "step-000012", "step": 12, "why": "signal"}
  {"ev": "term", "step": N}
  {"ev": "exit", "status": S} / {"ev": "crash", "status": S, "signal": SIG}
"""
import argparse
import json
import os
import signal
import sys
import time

STATE = {"flag": False, "step": 0, "term": False}
LOG = None


def emit(ev, **kw):
    kw = dict(kw)
    kw["ev"] = ev
    kw["t"] = round(time.time(), 3)
    line = json.dumps(kw, sort_keys=True) + "\n"
    if LOG is not None:
        os.write(LOG, line.encode())


def on_ckpt_signal(signum, frame):
    STATE["flag"] = True


def on_term(signum, frame):
    STATE["term"] = True


def read_deadline():
    """spotd.deadline() and the times before and after the read."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "..", "..", "python"))
    import spotd
    t0 = time.time()
    dl = spotd.deadline()
    return {"deadline": dl, "dl_t0": t0, "dl_t1": time.time()}


def write_checkpoint(ckpt_dir, step, nbytes, why, rand=False, delay=0.0,
                     extra=None):
    name = "step-%06d" % step
    path = os.path.join(ckpt_dir, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "step"), "w") as f:
        f.write("%d\n" % step)
    # Some bytes that depend on the step, mildly compressible.
    block = (("step %d " % step) * 64).encode()[:512] + os.urandom(512)
    with open(os.path.join(path, "data.bin"), "wb") as f:
        left = nbytes
        while left > 0:
            if rand:  # incompressible: a slow upload
                n = min(left, 1 << 20)
                f.write(os.urandom(n))
            else:
                n = min(left, len(block))
                f.write(block[:n])
            left -= n
    if delay > 0:  # a slow save (a big model)
        time.sleep(delay)
    # The marker comes last, once every file is closed.
    with open(os.path.join(path, "SPOTD_COMPLETE"), "w"):
        pass
    emit("checkpoint", name=name, step=step, why=why, **(extra or {}))
    return name


def env_int(name, default):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


PEER = {"seen": None}


def peer_gone(spec):
    """Whether the event log LOG (spec LOG:EVENT[:SEC]) held EVENT SEC
    seconds ago."""
    parts = spec.split(":")
    delay = float(parts[2]) if len(parts) > 2 else 0.0
    if PEER["seen"] is None:
        try:
            with open(parts[0]) as f:
                if any(json.loads(x).get("ev") == parts[1]
                       for x in f if x.strip()):
                    PEER["seen"] = time.time()
        except (OSError, ValueError):
            pass
    return PEER["seen"] is not None and time.time() >= PEER["seen"] + delay


def peer_saves(log, done):
    """The steps of the checkpoints in event log LOG not in done yet."""
    try:
        with open(log) as f:
            evs = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return []
    new = [e["step"] for e in evs
           if e.get("ev") == "checkpoint" and e["step"] not in done]
    done.update(new)
    return new


def sleep_watching(a, step):
    """A step's sleep; with --die-with, exit 1 as soon as the peer is gone."""
    end = time.time() + a.step_sleep
    while a.die_with:
        if peer_gone(a.die_with):
            emit("crash", status=1, step=step, why="peer")
            sys.exit(1)
        if time.time() >= end or STATE["term"]:
            return
        time.sleep(0.02)
    time.sleep(a.step_sleep)


def main():
    global LOG
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log", default=os.environ.get("FAKE_TRAINER_LOG"))
    ap.add_argument("--step-sleep", type=float,
                    default=float(os.environ.get("FAKE_TRAINER_STEP_SLEEP", "0.05")))
    ap.add_argument("--bytes", type=int, default=env_int("FAKE_TRAINER_BYTES", 64 << 10))
    ap.add_argument("--random", action="store_true",
                    help="checkpoint data is random bytes (incompressible)")
    ap.add_argument("--save-delay", type=float, default=0.0,
                    help="seconds a checkpoint takes before its marker")
    ap.add_argument("--signal", default=os.environ.get("SPOTD_SIGNAL", "USR1"),
                    help="a name (USR1) or a number ($SPOTD_SIGNAL, set by "
                    "spotd)")
    ap.add_argument("--ignore-signal", action="store_true")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--crash-at", type=int, default=0,
                    help="crash at this step (absolute step number)")
    ap.add_argument("--crash-status", default="3",
                    help="exit status, or a signal name (SEGV, KILL, ABRT)")
    ap.add_argument("--exit-at", type=int, default=0,
                    help="exit 0 at this step")
    ap.add_argument("--every", type=int, default=0,
                    help="checkpoint on its own every N steps")
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--die-with", default=None, metavar="LOG:EVENT[:SEC]",
                    help="exit 1 (a lost peer, as gloo) SEC seconds after "
                    "the event log LOG of another trainer holds EVENT "
                    "(checked every 20 ms, also during a step's sleep)")
    ap.add_argument("--read-deadline", action="store_true",
                    help="read spotd.deadline() at each checkpoint asked "
                    "for; in the event")
    ap.add_argument("--save-with", default=None, metavar="LOG",
                    help="write every checkpoint the event log LOG of "
                    "another trainer records, under its name (checked "
                    "every step)")
    a = ap.parse_args()

    if a.log:
        LOG = os.open(a.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sig = int(a.signal) if a.signal.isdigit() else \
        getattr(signal, "SIG" + a.signal.upper().replace("SIG", ""))
    signal.signal(sig, signal.SIG_IGN if a.ignore_signal else on_ckpt_signal)
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)

    ckpt_dir = os.environ.get("SPOTD_CKPT_DIR")
    if not ckpt_dir:
        print("fake_trainer: SPOTD_CKPT_DIR is not set", file=sys.stderr)
        return 2
    step = 0
    resume = os.environ.get("SPOTD_RESUME_DIR")
    if resume:
        with open(os.path.join(resume, "step")) as f:
            step = int(f.read().strip())
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("SPOTD_", "NOTIFY_SOCKET", "WATCHDOG_", "LISTEN_"))}
    emit("start", pid=os.getpid(), pgid=os.getpgid(0), sid=os.getsid(0),
         env=env, step=step)
    # spotd forwards both streams
    print("fake_trainer: stdout pid %d" % os.getpid(), flush=True)
    print("fake_trainer: stderr pid %d" % os.getpid(), file=sys.stderr,
          flush=True)

    last_ckpt = step
    copied = set()  # the peer's saves before this start are not copied
    if a.save_with:
        peer_saves(a.save_with, copied)
    while step < a.max_steps:
        sleep_watching(a, step)
        if STATE["term"]:
            emit("term", step=step)
            emit("exit", status=143)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return 143
        step += 1
        emit("step", step=step)
        if a.crash_at and step == a.crash_at:
            st = a.crash_status
            if st.isdigit():
                emit("crash", status=int(st), step=step)
                return int(st)
            signum = getattr(signal, "SIG" + st.upper().replace("SIG", ""))
            emit("crash", signal=int(signum), step=step)
            if signum not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            time.sleep(5)
            return 99
        for s in peer_saves(a.save_with, copied) if a.save_with else ():
            write_checkpoint(ckpt_dir, s, a.bytes, "peer")
            last_ckpt = step
        if STATE["flag"]:
            STATE["flag"] = False
            emit("signal", step=step)
            write_checkpoint(ckpt_dir, step, a.bytes, "signal", a.random,
                             a.save_delay,
                             read_deadline() if a.read_deadline else None)
            last_ckpt = step
        elif a.every and step - last_ckpt >= a.every:
            write_checkpoint(ckpt_dir, step, a.bytes, "own", a.random,
                             a.save_delay)
            last_ckpt = step
        if a.exit_at and step == a.exit_at:
            emit("exit", status=0, step=step)
            return 0
    emit("exit", status=0, step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
