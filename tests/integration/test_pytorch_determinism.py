"""examples/pytorch/train.py keeps the promise spotd relies on.

1. Two uninterrupted runs write byte-identical checkpoints (every file of
   every folder) and print the same loss at every step.
2. A run preempted twice the way spotd does it (SIGUSR1 at a random step,
   wait for SPOTD_COMPLETE, let it train a few more steps as if uploading,
   SIGTERM, resume from the saved folder into a NEW checkpoint folder) ends
   byte-identical to the uninterrupted run, and its step log loses no step
   completed before the signal.

The random steps come from a seed printed first; SPOT_TEST_SEED=N replays.
Skips (77) only when /usr/bin/python3 cannot import torch. No daemon, no S3.
"""
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spotlib import PY3, Checks, same_file, skip, srcdir_path  # noqa: E402

TRAIN = srcdir_path("examples", "pytorch", "train.py")
STEPS = 300
SAVE_EVERY = 100
ARGS = ["--steps", str(STEPS), "--seed", "7", "--log-every", "1",
        "--save-every", str(SAVE_EVERY)]
SLEEP = "0.02"       # per step in the preempted runs: room to signal mid-run
SIGNAL_SLACK = 50    # steps the trainer may take to act on SIGUSR1
WAIT = 90            # seconds for any one expected line

STEP_RE = re.compile(r"^step (\d+) loss (\S+)$")
SAVED_RE = re.compile(r"^saved (\S+) at step (\d+) \((\w+),")
RESUMED_RE = re.compile(r"^resumed from (\S+) at step (\d+)$")
MARKER = "SPOTD_COMPLETE"


class Trainer:
    """train.py as spotd would start it, its output read line by line."""

    def __init__(self, ckpt_dir, restart=0, resume=None, extra=()):
        env = dict(os.environ, SPOTD_CKPT_DIR=ckpt_dir, SPOTD_JOB="determinism",
                   SPOTD_RESTART_COUNT=str(restart))
        env.pop("SPOTD_RESUME_DIR", None)
        if resume:
            env["SPOTD_RESUME_DIR"] = resume
        self.ckpt_dir = ckpt_dir
        self.lines = []
        self.q = queue.Queue()
        self.proc = subprocess.Popen([PY3, TRAIN] + ARGS + list(extra), env=env,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def wait_for(self, regex, pred=lambda m: True, timeout=WAIT):
        """The first match of regex (satisfying pred) in lines not read yet,
        or None at EOF or timeout."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.q.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                self.q.put(None)  # keep EOF visible to later calls
                return None
            self.lines.append(line)
            m = regex.match(line)
            if m and pred(m):
                return m

    def finish(self, timeout=WAIT):
        """Waits for exit; returns the status (-9 after a forced kill)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = -9
        self.reader.join(timeout=10)
        while True:
            try:
                line = self.q.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def losses(self):
        """{step: loss text} from the lines read so far."""
        return {int(m.group(1)): m.group(2)
                for m in map(STEP_RE.match, self.lines) if m}

    def log(self):
        return "\n".join(self.lines[-40:])


def folders(ckpt_dir):
    """{name: sorted file list} of the complete checkpoints in ckpt_dir."""
    out = {}
    for name in sorted(os.listdir(ckpt_dir)) if os.path.isdir(ckpt_dir) else []:
        files = sorted(os.listdir(os.path.join(ckpt_dir, name)))
        if MARKER in files:
            out[name] = files
    return out


def same_folder(a, b):
    """None when folders a and b hold the same files byte for byte, else why."""
    fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
    if fa != fb:
        return "files differ: %s vs %s" % (fa, fb)
    for f in fa:
        if not same_file(os.path.join(a, f), os.path.join(b, f)):
            return "%s differs" % f
    return None


def preempt(c, t, rng, at, what):
    """spotd's preemption of trainer t: SIGUSR1 once step `at` is logged,
    wait for the checkpoint, a few more steps (the upload), SIGTERM.
    Returns (checkpoint name, its step) or None."""
    m = t.wait_for(STEP_RE, lambda m: int(m.group(1)) >= at)
    if not c.check(m is not None, what + ": reached step %d" % at, t.log()):
        return None
    signalled_after = int(m.group(1))  # every step up to here must be kept
    t.proc.send_signal(signal.SIGUSR1)
    m = t.wait_for(SAVED_RE, lambda m: m.group(3) == "signal")
    if not c.check(m is not None, what + ": saved a checkpoint on SIGUSR1",
                   t.log()):
        return None
    name, step = m.group(1), int(m.group(2))
    path = os.path.join(t.ckpt_dir, name)
    c.check(os.path.exists(os.path.join(path, MARKER)),
            what + ": %s has %s when the line is printed" % (name, MARKER))
    c.check(signalled_after <= step <= signalled_after + SIGNAL_SLACK,
            what + ": checkpoint step %d keeps every step up to %d (signal "
            "at step %d)" % (step, signalled_after, signalled_after))
    upload_steps = rng.randint(0, 5)
    t.wait_for(STEP_RE, lambda m: int(m.group(1)) >= step + upload_steps)
    t0 = time.monotonic()
    t.proc.terminate()
    rc = t.finish(timeout=20)
    c.check(rc == -15, what + ": SIGTERM ends the trainer at once "
            "(status %d, %.2f s)" % (rc, time.monotonic() - t0), t.log())
    done = max(t.losses() or [0])
    print("     %s: signal after step %d, saved %s, SIGTERM after step %d "
          "(%d step(s) to redo)" % (what, signalled_after, name, done,
                                    done - step))
    return name, step


def main():
    cp = subprocess.run([PY3, "-c", "import torch"], capture_output=True,
                        text=True)
    if cp.returncode != 0:
        skip("%s cannot import torch: %s" % (PY3, cp.stderr.strip()[-200:]))

    seed = int(os.environ.get("SPOT_TEST_SEED") or
               random.SystemRandom().randrange(1 << 31))
    print("seed=%d (SPOT_TEST_SEED=%d replays these preemption steps)"
          % (seed, seed))
    rng = random.Random(seed)
    c = Checks()
    tmp = tempfile.mkdtemp(prefix="spot-pytorch-")
    running = []
    try:
        run_checks(c, rng, tmp, running)
    finally:
        for t in running:
            t.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


def run_checks(c, rng, tmp, running):
    final = "step-%06d" % STEPS

    # 1. Two uninterrupted runs, side by side.
    t0 = time.monotonic()
    a = Trainer(os.path.join(tmp, "a"))
    b = Trainer(os.path.join(tmp, "b"))
    running += [a, b]
    for name, t in (("a", a), ("b", b)):
        rc = t.finish(timeout=240)
        c.check(rc == 0 and t.lines and t.lines[-1] == "done at step %d" % STEPS,
                "uninterrupted run %s exits 0 after step %d" % (name, STEPS),
                "status %d\n%s" % (rc, t.log()))
    print("     two uninterrupted runs: %.1f s" % (time.monotonic() - t0))
    ref = a.losses()
    c.check(sorted(ref) == list(range(1, STEPS + 1)),
            "run a logs every step once")
    c.check(b.losses() == ref, "run b prints the same loss at every step")
    fa, fb = folders(a.ckpt_dir), folders(b.ckpt_dir)
    want = ["step-%06d" % s for s in range(SAVE_EVERY, STEPS + 1, SAVE_EVERY)]
    c.check(sorted(fa) == want and fb == fa,
            "both runs made the same complete checkpoints %s" % want,
            "%s vs %s" % (fa, fb))
    for name in fa:
        c.check(fa[name] == sorted(["model.pt", "optimizer.pt", "trainer.pt",
                                    MARKER]),
                "%s holds model, optimizer, trainer state and the marker" % name,
                str(fa[name]))
        why = same_folder(os.path.join(a.ckpt_dir, name),
                          os.path.join(b.ckpt_dir, name))
        c.check(why is None, "runs a and b: %s byte-identical" % name, why or "")
    size = sum(os.path.getsize(os.path.join(a.ckpt_dir, final, f))
               for f in fa.get(final, []))
    print("     final checkpoint: %d bytes" % size)
    if not os.path.isdir(os.path.join(a.ckpt_dir, final)):
        return

    # 2. Preempted twice at random steps, resumed each time on a "new node"
    #    (a new checkpoint folder), then run to the end.
    k1 = rng.randint(10, 120)
    k2 = rng.randint(k1 + SIGNAL_SLACK + 10, 250)
    print("     preemptions after steps %d and %d" % (k1, k2))
    t0 = time.monotonic()
    segments = []  # (trainer, resumed-from step)
    resume, start = None, 0
    for i, at in enumerate((k1, k2, None)):
        ckpt = os.path.join(tmp, "seg%d" % i)
        t = Trainer(ckpt, restart=i, resume=resume, extra=["--sleep-per-step",
                                                           SLEEP])
        running.append(t)
        what = "segment %d" % i
        if resume:
            m = t.wait_for(RESUMED_RE)
            c.check(m is not None and m.group(1) == os.path.basename(resume)
                    and int(m.group(2)) == start,
                    what + ": resumed from %s at step %d"
                    % (os.path.basename(resume), start), t.log())
        segments.append((t, start))
        if at is None:
            rc = t.finish(timeout=240)
            c.check(rc == 0 and t.lines[-1:] == ["done at step %d" % STEPS],
                    what + ": exits 0 after step %d" % STEPS,
                    "status %d\n%s" % (rc, t.log()))
            break
        got = preempt(c, t, rng, at, what)
        if got is None:
            return
        resume, start = os.path.join(ckpt, got[0]), got[1]
    print("     preempted chain: %.1f s" % (time.monotonic() - t0))

    # The step log: each segment continues exactly where the checkpoint it
    # resumed from left off, and every step has the uninterrupted loss.
    merged = {}
    for i, (t, first) in enumerate(segments):
        upto = segments[i + 1][1] if i + 1 < len(segments) else STEPS
        steps = t.losses()
        c.check(min(steps or [0]) == first + 1,
                "segment %d starts at step %d" % (i, first + 1))
        for s in range(first + 1, upto + 1):
            if s in steps:
                merged[s] = steps[s]
    c.check(sorted(merged) == list(range(1, STEPS + 1)),
            "the segments' step logs cover steps 1..%d with no gap" % STEPS,
            "missing: %s" % sorted(set(range(1, STEPS + 1)) - set(merged))[:20])
    diff = [s for s in merged if merged[s] != ref.get(s)]
    c.check(not diff, "every step's loss equals the uninterrupted run's",
            "first differing steps: %s" % diff[:10])

    # Every complete checkpoint any segment made equals the uninterrupted
    # run's checkpoint of the same step (scheduled ones) and the last
    # segment's final one is the uninterrupted final one.
    for i, (t, _) in enumerate(segments):
        for name, files in folders(t.ckpt_dir).items():
            c.check(set(["model.pt", "optimizer.pt", "trainer.pt"]) <= set(files),
                    "segment %d: complete %s has every file" % (i, name),
                    str(files))
            if name in fa and not (t is segments[-1][0] and name == final):
                why = same_folder(os.path.join(t.ckpt_dir, name),
                                  os.path.join(a.ckpt_dir, name))
                c.check(why is None, "segment %d: %s byte-identical to the "
                        "uninterrupted run's" % (i, name), why or "")
    last = os.path.join(segments[-1][0].ckpt_dir, final)
    why = same_folder(last, os.path.join(a.ckpt_dir, final)) \
        if os.path.exists(os.path.join(last, MARKER)) else "no " + last
    c.check(why is None, "preempted twice: final %s byte-identical to the "
            "uninterrupted run's" % final, why or "")


if __name__ == "__main__":
    main()
