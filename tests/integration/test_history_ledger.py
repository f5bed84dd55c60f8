#!/usr/bin/python3
"""The job history as a ledger of failures: real spotd processes, the
Python helper's trainer (step_trainer.py, report_step() every step), the
real S3 server; `spotctl history --json` read against the trainers' own
event logs.

  restarts  the trainer raises at step N on every start; --max-restarts 2:
            two restarts in place, then spotd gives up with exit 70. The
            run is a crash (not "exited"), its restarts used up, the
            trainer's exit status 1 recorded; the steps lost are the
            trainer's own count (each failure back to the step the next
            start resumed from, and the last one back to the newest
            commit); the backoff is downtime, not training.
  raises    the trainer raises once, no restarts: exit 1, a crash with
            exit status 1 and its lost steps.
  drain     SIGTERM with SPOTD_TERMINATION_GRACE (a pod's drain): exit 75,
            one preemption (kind sigterm), final checkpoint, 0 steps lost;
            then `spotctl checkpoint --final` on the next start, the
            operator's road: exit 75 again, a second preemption (kind
            spotctl-final), 0 steps lost.
  kill9     spotd and its trainer killed with SIGKILL 0.6 s after a step
            (1 s steps): the steps lost are exactly the trainer's last step
            less its checkpoint's, and not marked as a bound."""
import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

TRAINER = sl.srcdir_path("tests", "integration", "step_trainer.py")
PREFIXES = []


def job_of(name):
    store, job, prefix = sl.daemon_job(name)
    PREFIXES.append(prefix[:-len("job/")])
    return store, job


def cmd(log, stop=None):
    return [sl.PY3, TRAINER, sl.srcdir_path("python"), log, "100000"] + \
        ([stop] if stop else [])


def history(store, job):
    cp = sl.spotctl("history", "%s/%s" % (store, job), "--json")
    try:
        return json.loads(cp.stdout), cp.stdout + cp.stderr
    except ValueError:
        return {}, cp.stdout + cp.stderr


def restarts(c, wd):
    tag = "restarts: "
    store, job = job_of("ledger-restarts")
    log = os.path.join(wd, "r.jsonl")
    d = sl.Daemon(os.path.join(wd, "r"), store, job, cmd=cmd(log),
                  interval="1", env={"STEP_TRAINER_CRASH_AT": "40"},
                  args=["--max-restarts", "2", "--restart-backoff", "2"])
    rc = d.wait_exit(120)
    c.check(rc == 70, tag + "spotd gives up with exit 70 (%s)" % rc)
    evs = sl.trainer_events(log)
    starts = [e["step"] for e in evs if e["ev"] == "started"]
    crashes = [e["step"] for e in evs if e["ev"] == "crash"]
    c.check(len(starts) == 3 and crashes == [40, 40, 40],
            tag + "three starts (%s), each failed at step 40" % starts)
    saved = [e["step"] for e in evs if e["ev"] == "checkpoint"]
    # The trainer's own count: each failure back to the next start's step,
    # the last back to the newest checkpoint it saved.
    lost = sum(40 - s for s in starts[1:]) + 40 - (max(saved) if saved else 0)
    j, text = history(store, job)
    s, runs = j.get("summary", {}), j.get("runs", [])
    r = runs[0] if runs else {}
    c.check(len(runs) == 1 and r.get("outcome") == "crashed" and
            r.get("exhausted") is True and s.get("crashes") == 1 and
            s.get("restarts") == 2 and s.get("restarts_used_up") == 1 and
            r.get("exit_code") == 1,
            tag + "history: one crash, 2 restarts, restarts used up, exit "
            "status 1", text[:1500])
    c.check(r.get("lost_steps") == lost and s.get("lost_steps") == lost,
            tag + "history: %d steps lost, the trainer's own count (%s)" %
            (lost, r.get("lost_steps")), text[:1500])
    c.check(r.get("down_s", 0) >= 2 + 2 and
            s.get("train_s", 1e9) <= s.get("wall_s", 0) - s.get("down_s", 0) + 1e-6,
            tag + "history: the backoff (2 s, then more) is downtime, not "
            "training (down %.1f s)" % r.get("down_s", 0), text[:1500])
    cp = sl.spotctl("history", "%s/%s" % (store, job))
    c.check("1 crash" in cp.stdout and "restarts used up" in cp.stdout,
            tag + "the table says so", cp.stdout)
    png = os.path.join(wd, "restarts.png")
    cp = sl.spotctl("history", "%s/%s" % (store, job), "--plot", png)
    c.check(cp.returncode == 0 and os.path.getsize(png) > 0, tag + "--plot",
            cp.stderr)


def raises(c, wd):
    tag = "raises: "
    store, job = job_of("ledger-raises")
    log = os.path.join(wd, "x.jsonl")
    d = sl.Daemon(os.path.join(wd, "x"), store, job, cmd=cmd(log),
                  interval="1", env={"STEP_TRAINER_CRASH_AT": "40"})
    rc = d.wait_exit(60)
    c.check(rc == 1, tag + "spotd exits with the trainer's 1 (%s)" % rc)
    saved = [e["step"] for e in sl.trainer_events(log, "checkpoint")]
    j, text = history(store, job)
    s, runs = j.get("summary", {}), j.get("runs", [])
    r = runs[0] if runs else {}
    c.check(r.get("outcome") == "crashed" and r.get("exit_code") == 1 and
            s.get("crashes") == 1 and
            r.get("lost_steps") == 40 - (max(saved) if saved else 0),
            tag + "history: a crash, exit status 1, %d steps lost" %
            (40 - (max(saved) if saved else 0)), text[:1500])


def drain(c, wd):
    tag = "drain: "
    store, job = job_of("ledger-drain")
    log = os.path.join(wd, "d.jsonl")
    d = sl.Daemon(os.path.join(wd, "d"), store, job, cmd=cmd(log),
                  env={"SPOTD_TERMINATION_GRACE": "30"})
    end = time.time() + 30
    while len(sl.trainer_events(log, "step")) < 10 and time.time() < end:
        time.sleep(0.1)
    d.send(signal.SIGTERM)
    rc = d.wait_exit(60)
    c.check(rc == 75, tag + "SIGTERM with a termination grace: exit 75 (%s)" % rc)
    j, text = history(store, job)
    s, runs = j.get("summary", {}), j.get("runs", [])
    r = runs[0] if runs else {}
    c.check(s.get("preemptions") == 1 and r.get("outcome") == "preempted" and
            r.get("notice_kind") == "sigterm" and r.get("final_committed") and
            r.get("lost_steps") == 0,
            tag + "history: one preemption by SIGTERM, final committed, 0 "
            "steps lost", text[:1500])
    log2 = os.path.join(wd, "d2.jsonl")
    d = sl.Daemon(os.path.join(wd, "d2"), store, job, cmd=cmd(log2))
    end = time.time() + 30
    while len(sl.trainer_events(log2, "step")) < 10 and time.time() < end:
        time.sleep(0.1)
    cp = d.spotctl("checkpoint", "--final")
    rc = d.wait_exit(60)
    c.check(cp.returncode == 0 and rc == 75,
            tag + "spotctl checkpoint --final: exit 75 (%s)" % rc, cp.stderr)
    j, text = history(store, job)
    s, runs = j.get("summary", {}), j.get("runs", [])
    r = runs[1] if len(runs) > 1 else {}
    c.check(s.get("preemptions") == 2 and r.get("outcome") == "preempted" and
            r.get("notice_kind") == "spotctl-final" and
            r.get("final_committed") and r.get("lost_steps") == 0,
            tag + "history: the second preemption, by spotctl checkpoint "
            "--final, 0 steps lost", text[:1500])


def kill9(c, wd):
    tag = "kill9: "
    store, job = job_of("ledger-kill9")
    log = os.path.join(wd, "k.jsonl")
    d = sl.Daemon(os.path.join(wd, "k"), store, job, cmd=cmd(log),
                  env={"STEP_TRAINER_SLEEP": "1.0"}, args=["--lease-ttl", "6"])
    end = time.time() + 30
    while not sl.trainer_events(log, "started") and time.time() < end:
        time.sleep(0.05)
    cp = d.spotctl("checkpoint", "--wait", timeout=60)
    c.check(cp.returncode == 0, tag + "a checkpoint", cp.stderr)
    saved = [e["step"] for e in sl.trainer_events(log, "checkpoint")]
    base = len(sl.trainer_events(log, "step"))
    end = time.time() + 30
    while len(sl.trainer_events(log, "step")) < base + 3 and time.time() < end:
        time.sleep(0.02)
    time.sleep(0.6)  # the step's report is stored; the next is 0.4 s away
    d.p.kill()
    d.wait_exit(30)
    st = sl.trainer_events(log, "started")
    if st:
        try:
            os.killpg(st[0]["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    trained = max(e["step"] for e in sl.trainer_events(log, "step"))
    lost = trained - (max(saved) if saved else 0)
    # The next start restores the checkpoint and finishes at once.
    stop = os.path.join(wd, "stop")
    with open(stop, "w"):
        pass
    d2 = sl.Daemon(os.path.join(wd, "k2"), store, job,
                   cmd=cmd(os.path.join(wd, "k2.jsonl"), stop),
                   args=["--lease-ttl", "6"])
    c.check(d2.wait_exit(120) == 0, tag + "the next start finishes")
    j, text = history(store, job)
    runs = j.get("runs", [])
    r = runs[0] if runs else {}
    c.check(r.get("outcome") == "crashed" and r.get("lost_steps") == lost and
            r.get("lost_bound") is False,
            tag + "history: the killed node lost %d steps, the trainer's own "
            "count, exact (%s)" % (lost, r.get("lost_steps")), text[:1500])


def main():
    sl.daemon_env()
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-ledger-") as wd:
        try:
            for f in (restarts, raises, drain, kill9):
                f(c, wd)
        finally:
            sl.kill_started()
            for p in PREFIXES:
                sl.s3_cleanup(p)
    c.finish()


if __name__ == "__main__":
    main()
