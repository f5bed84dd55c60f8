#!/usr/bin/python3
"""Preempt -> requeue -> resume on a real Slurm cluster (docs/slurm.md).

Starts a single-node Slurm 22.05 (tests/slurm.sh) and a metadata emulator,
and uses the real Ceph of tools/test (SPOT_TEST_S3_*). A batch job
(`sbatch --requeue --open-mode=append`) runs

    spotd run --provider aws --metadata-url EMU --interval 0 \
      --relaunch "spotctl relaunch --backend slurm" -- fake-trainer

The fake trainer counts steps (a short sleep each), appends every completed
step to a log, checkpoints its step on SIGUSR1 into a new folder of
SPOTD_CKPT_DIR (with SPOTD_COMPLETE) and resumes from SPOTD_RESUME_DIR.
Once the first run has done some steps the test publishes a spot notice;
spotd checkpoints, uploads, commits and requeues; the batch script's second
run (SLURM_RESTART_COUNT=1) cancels the notice before its spotd starts, so
that spotd restores the checkpoint and the trainer finishes.

Checks: the final step count; the second run resumed from the checkpoint
taken at the notice (no step lost beyond the one in flight) and every step
1..TOTAL was done; the job ran exactly twice (run starts counted in the job's
own output, sacct needs slurmdbd); the checkpoint is committed in the store;
the relaunch was logged. Skips (77) only when Slurm is not installed and
cannot be, or without the S3 server."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metalib  # noqa: E402
import spotlib  # noqa: E402

TOTAL = 60        # steps of the whole training
STEP_S = 0.1      # seconds per step
NOTICE_AT = 12    # the notice is published once run 0 has done this many

TRAINER = r'''
import os, signal, sys, time
import spotd  # python/spotd: report_step() for the job history
total = int(os.environ["FAKE_TOTAL"])
step_s = float(os.environ["FAKE_STEP_S"])
log_path = os.environ["FAKE_LOG"]
run = os.environ.get("SLURM_RESTART_COUNT", "0")
want = False
step = 0

def log(line):
    with open(log_path, "a") as f:
        f.write(line + "\n")

def usr1(signum, frame):
    global want
    want = True
    log("signal at %d run %s" % (step, run))

signal.signal(int(os.environ.get("SPOTD_SIGNAL") or signal.SIGUSR1), usr1)
resume = os.environ.get("SPOTD_RESUME_DIR")
if resume:
    with open(os.path.join(resume, "step")) as f:
        step = int(f.read())
log("start run %s at %d resume %s" % (run, step, resume or "-"))
while step < total:
    time.sleep(step_s)
    step += 1
    spotd.report_step(step, force=True)
    log("step %d run %s" % (step, run))
    if want:  # the safe point: between steps
        want = False
        d = os.path.join(os.environ["SPOTD_CKPT_DIR"], "step-%06d" % step)
        os.makedirs(d)
        with open(os.path.join(d, "step"), "w") as f:
            f.write("%d\n" % step)
        open(os.path.join(d, "SPOTD_COMPLETE"), "w").close()
        log("ckpt %d run %s" % (step, run))
log("done %d run %s" % (step, run))
'''

BATCH = r'''#!/bin/bash
run=${SLURM_RESTART_COUNT:-0}
echo "batch start run=$run restart=${SLURM_RESTART_COUNT:-unset} job=$SLURM_JOB_ID node=$SLURMD_NODENAME"
if [[ $run != 0 ]]; then
  # The notice was for the first machine: the new run must not see it.
  /usr/bin/python3 -c 'import sys, urllib.request as u; u.urlopen(u.Request(sys.argv[1] + "/__emulate/cancel?notice=1", method="POST", data=b""), timeout=10)' "$FAKE_EMU" || exit 99
fi
# exec: spotd is the job's main process, so Slurm's SIGTERM at the requeue
# reaches it and the job lasts until spotd has stopped the trainer.
exec "$SPOTD" run --job "$FAKE_JOB" --store "$FAKE_STORE" --provider aws \
  --metadata-url "$FAKE_EMU" --poll-interval 200ms --interval 0 \
  --ckpt-dir "$FAKE_WORK/ckpt-run$run" --socket "$FAKE_WORK/spotd-$run.sock" \
  --relaunch "spotctl relaunch --backend slurm --state-dir $FAKE_WORK/relaunch-state" \
  -- /usr/bin/python3 "$FAKE_WORK/trainer.py"
'''


def slurm_installed():
    return all(os.path.exists(p) for p in
               ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch",
                "/usr/sbin/munged"))


def job_state(jobid):
    cp = spotlib.run(["scontrol", "show", "job", "-o", jobid], timeout=20)
    m = re.search(r"\bJobState=(\S+)", cp.stdout)
    r = re.search(r"\bRestarts=(\d+)", cp.stdout)
    return (m.group(1) if m else "?"), (int(r.group(1)) if r else -1)


def main():
    endpoint, bucket = spotlib.store_env()
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    if os.geteuid() != 0:
        spotlib.skip("needs root to start munged and slurmd")
    c = spotlib.Checks()
    spotd = os.environ.get("SPOTD") or spotlib.builddir_path("daemon", "spotd")
    spotctl = os.environ.get("SPOTCTL") or spotlib.builddir_path("client", "spotctl")
    url, root = spotlib.unique_job("slurm-requeue")
    store, job = url.rsplit("/", 1)

    sdir = tempfile.mkdtemp(prefix="spotd-slurm-")
    work = tempfile.mkdtemp(prefix="spotd-slurm-work-")
    os.chmod(work, 0o755)
    emu = None
    started = False
    try:
        cp = spotlib.run(["bash", spotlib.srcdir_path("tests", "slurm.sh"),
                          "start", sdir], timeout=600)
        if cp.returncode != 0:
            if not slurm_installed():
                spotlib.skip("slurm-wlm is not installed and could not be:\n"
                             + cp.stderr[-2000:])
            print(cp.stderr)
            c.check(False, "tests/slurm.sh starts a cluster")
            c.finish()
        started = True
        for line in spotlib.read_text(os.path.join(sdir, "env")).splitlines():
            k, _, v = line.partition("=")
            os.environ[k] = v
        print(cp.stderr.strip())

        emu = metalib.Emulator("aws")
        steps = os.path.join(work, "steps.log")
        out = os.path.join(work, "job.out")
        with open(os.path.join(work, "trainer.py"), "w") as f:
            f.write(TRAINER)
        with open(os.path.join(work, "batch.sh"), "w") as f:
            f.write(BATCH)
        env = {
            "PATH": os.path.dirname(spotctl) + ":" + os.environ.get("PATH", ""),
            "SPOTD": spotd, "FAKE_JOB": job, "FAKE_STORE": store,
            "FAKE_EMU": emu.url, "FAKE_WORK": work, "FAKE_LOG": steps,
            "FAKE_TOTAL": str(TOTAL), "FAKE_STEP_S": str(STEP_S),
            "AWS_ENDPOINT_URL": endpoint,
            "PYTHONPATH": spotlib.srcdir_path("python"),
        }
        cp = spotlib.run(["sbatch", "--parsable", "--requeue",
                          "--open-mode=append", "-o", out, "-J", "spotd-itest",
                          os.path.join(work, "batch.sh")], env=env, timeout=30)
        c.check(cp.returncode == 0, "sbatch accepts the job", cp.stderr)
        if cp.returncode != 0:
            c.finish()
        jobid = cp.stdout.strip().split(";")[0]
        print("job %s submitted; store %s/%s" % (jobid, store, job))

        # Run 0 trains; publish the notice once it has done some steps.
        t0 = time.time()
        while time.time() - t0 < 60:
            if re.search(r"^step %d run 0$" % NOTICE_AT, spotlib.read_text(steps), re.M):
                break
            time.sleep(0.05)
        else:
            print(spotlib.read_text(out))
            c.check(False, "the first run trains", spotlib.read_text(steps)[-2000:])
            c.finish()
        emu.control("notice", after=0)
        t_notice = time.time()
        print("notice published %.1f s after submission" % (t_notice - t0))

        # Requeue, rerun, finish.
        end = time.time() + 200
        state, restarts = "?", -1
        while time.time() < end:
            state, restarts = job_state(jobid)
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                         "NODE_FAIL", "OUT_OF_MEMORY") and restarts >= 1:
                break
            if state == "COMPLETED" and restarts == 0:
                break
            time.sleep(0.5)
        print("job %s: %s, restarts %d, %.1f s after the notice" %
              (jobid, state, restarts, time.time() - t_notice))
        joblog = spotlib.read_text(out)
        log = spotlib.read_text(steps)
        print("----- job output\n" + joblog + "----- steps (tail)\n" +
              "\n".join(log.splitlines()[-8:]))

        c.check(state == "COMPLETED", "the job completes", state)
        c.check(restarts == 1, "Slurm requeued it once (Restarts=1)", str(restarts))
        starts = re.findall(r"^batch start run=(\d+) restart=(\S+)", joblog, re.M)
        c.check(starts == [("0", "unset"), ("1", "1")],
                "the job ran exactly twice: SLURM_RESTART_COUNT unset, then 1",
                repr(starts))

        lines = log.splitlines()
        sig = [int(m.group(1)) for m in
               (re.match(r"signal at (\d+) run 0$", x) for x in lines) if m]
        ckpt = [int(m.group(1)) for m in
                (re.match(r"ckpt (\d+) run 0$", x) for x in lines) if m]
        res = [(m.group(1), int(m.group(2)), m.group(3)) for m in
               (re.match(r"start run (\S+) at (\d+) resume (\S+)$", x)
                for x in lines) if m]
        done = [x for x in lines if x.startswith("done ")]
        c.check(len(sig) == 1 and len(ckpt) == 1,
                "run 0 was signalled once and checkpointed once",
                "signals %r checkpoints %r" % (sig, ckpt))
        if sig and ckpt:
            c.check(sig[0] >= NOTICE_AT and ckpt[0] in (sig[0], sig[0] + 1),
                    "the checkpoint holds every step done before the signal "
                    "(at most the one in flight)",
                    "signal at %d, checkpoint at %d" % (sig[0], ckpt[0]))
        c.check(len(res) == 2 and res[0][:2] == ("0", 0),
                "run 0 started from scratch", repr(res))
        if len(res) == 2 and ckpt:
            c.check(res[1][0] == "1" and res[1][1] == ckpt[0] and
                    res[1][2].endswith("step-%06d" % ckpt[0]),
                    "run 1 resumed from the restored checkpoint", repr(res[1]))
        c.check(done == ["done %d run 1" % TOTAL],
                "the trainer finished all %d steps in run 1" % TOTAL, repr(done))
        run1 = [int(m.group(1)) for m in
                (re.match(r"step (\d+) run 1$", x) for x in lines) if m]
        run0 = [int(m.group(1)) for m in
                (re.match(r"step (\d+) run 0$", x) for x in lines) if m]
        if ckpt:
            c.check(run1 == list(range(ckpt[0] + 1, TOTAL + 1)),
                    "run 1 did exactly the steps after the checkpoint",
                    "%r..%r (%d)" % (run1[:2], run1[-2:], len(run1)))
            c.check(run0[:ckpt[0]] == list(range(1, ckpt[0] + 1)),
                    "run 0 did steps 1..checkpoint in order", repr(run0[:5]))
            lost = max(run0) - ckpt[0] if run0 else -1
            print("steps redone after the resume (done after the checkpoint "
                  "while spotd uploaded and requeued): %d" % lost)
        # The store: the checkpoint is committed.
        if ckpt:
            name = "step-%06d" % ckpt[0]
            latest = spotlib.s3_get(root + "LATEST").decode().strip()
            c.check(latest == name, "LATEST names the checkpoint", latest)
            keys = spotlib.s3_keys(root + "checkpoints/" + name + "/")
            c.check(any(k.endswith("/MANIFEST.json") for k in keys),
                    "its manifest is committed", repr(keys))
        c.check(re.search(r"scontrol requeue %s: ok" % jobid, joblog) is not None,
                "spotctl relaunch logged the requeue attempt with its outcome",
                joblog[-3000:])
        c.check(re.search(r"relaunch: running 'spotctl relaunch --backend slurm",
                          joblog) is not None, "spotd ran the relaunch step")
        c.check("Traceback" not in joblog, "no trainer crash in the job output")
        # The job's history as spotd recorded it: 2 runs, 1 preemption,
        # and the steps lost as measured here (done before the signal and
        # not in the checkpoint).
        cp = spotlib.run([spotctl, "history", url, "--json"], timeout=60)
        try:
            s = json.loads(cp.stdout)["summary"]
        except (ValueError, KeyError):
            s = {}
        lost = max(0, sig[0] - ckpt[0]) if sig and ckpt else -1
        c.check(s.get("runs") == 2 and s.get("preemptions") == 1 and
                s.get("commits") == len(ckpt) and s.get("relaunches") == 1,
                "spotctl history: 2 runs, 1 preemption, %d commit(s), 1 "
                "relaunch" % len(ckpt), cp.stdout[:600] + cp.stderr)
        c.check(s.get("lost_steps") == lost,
                "spotctl history: %s steps lost, as measured here (%d)" %
                (s.get("lost_steps"), lost), repr(s))
        cp = spotlib.run([spotctl, "history", url], timeout=60)
        print(cp.stdout)
        c.check(re.search(r"2 runs, 1 preemption", cp.stdout) is not None,
                "the history table's headline", cp.stdout + cp.stderr)
        # The second run restored and exited 0 (the batch step's status).
        cp = spotlib.run(["scontrol", "show", "job", "-o", jobid], timeout=20)
        c.check(" ExitCode=0:0" in cp.stdout, "the second run exited 0",
                cp.stdout[:600])
    finally:
        if emu is not None:
            try:
                emu.stop()
            except Exception as e:  # noqa: BLE001
                print("emulator stop: %r" % e)
        if started:
            cp = spotlib.run(["bash", spotlib.srcdir_path("tests", "slurm.sh"),
                              "stop", sdir], timeout=120)
            if cp.returncode != 0:
                print("slurm stop: " + cp.stderr)
        shutil.rmtree(sdir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        spotlib.s3_cleanup(root)
    c.finish()


if __name__ == "__main__":
    main()
