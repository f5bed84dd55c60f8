"""A trainer on the Python helper, for the daemon's history and metrics
tests: it resumes from SPOTD_RESUME_DIR's "step" file, reports every step
(0.05 s each), checkpoints when asked and at the last step, and logs
started / step / checkpoint / done events as JSON lines.

    python3 step_trainer.py PYTHON_DIR LOG STEPS [STOP_FILE]

It stops early once STOP_FILE exists. STEP_TRAINER_SLEEP sets the step's
sleep; with STEP_TRAINER_CRASH_AT=N it raises (exit 1) on reaching step N,
on every start, after logging a "crash" event."""
import json
import os
import sys
import time
sys.path.insert(0, sys.argv[1])
import spotd
log, steps = sys.argv[2], int(sys.argv[3])
stop = sys.argv[4] if len(sys.argv) > 4 else None
pause = float(os.environ.get("STEP_TRAINER_SLEEP") or 0.05)
crash_at = int(os.environ.get("STEP_TRAINER_CRASH_AT") or 0)
step = 0
if spotd.resume_dir():
    with open(os.path.join(spotd.resume_dir(), "step")) as f:
        step = int(f.read())
def ev(**e):
    with open(log, "a") as f:
        f.write(json.dumps(e) + "\n")
ev(ev="started", step=step, pid=os.getpid())
while step < steps and not (stop and os.path.exists(stop)):
    time.sleep(pause)
    step += 1
    spotd.report_step(step, force=True)
    ev(ev="step", step=step)
    if step == crash_at:
        ev(ev="crash", step=step)
        raise RuntimeError("step_trainer: a failure at step %d" % step)
    if spotd.checkpoint_requested() or step == steps:
        with spotd.checkpoint(step=step) as ck:
            with ck.open("step") as f:
                f.write(b"%d" % step)
        ev(ev="checkpoint", step=step, name=ck.name)
ev(ev="done", step=step)
