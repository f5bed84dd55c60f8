"""spotd.lightning on a real PyTorch Lightning Trainer (CPU, a tiny model
with dropout, a plain shuffled DataLoader), one process and 2-rank DDP
(gloo), each under `spotd run`: a spot notice mid-epoch, the checkpoint
committed to the store (exit 75), a fresh node restores it and resumes
with fit(ckpt_path=spotd.lightning.ckpt_path()); every later step (the
batch's sample ids, the loss) and the final weights of every rank equal
an uninterrupted run's (fwlib.run). The committed folder holds last.ckpt,
each rank's data position and the marker. The one-process run uses
staged saves (spotd.lightning.StagedCheckpointIO, its write held 0.7 s
while the steps go on): the resume is still exact, so what was written
is the state at the checkpoint, not the live tensors of later steps.

Also Lightning on Slurm (SLURM_* set as srun sets them, a stand-in
scontrol) under spotd: Lightning's auto-requeue is off, so the requeue
signal (SIGUSR1) becomes spotd's checkpoint instead of Lightning's own
hpc_ckpt and `scontrol requeue`, and SIGTERM stops the trainer.

Needs the Lightning package: tools/test gives it (the frameworks archive,
$SPOTD_TEST_PYTHONUSERBASE; then a missing import fails); otherwise skips
(77) when /usr/bin/python3 does not import lightning.pytorch. Skips
without the test S3 server."""
import os
import re
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402
import fwlib  # noqa: E402

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "fw_lightning_trainer.py")
STEPS = 28  # 64 samples in batches of 4: 16 per epoch, 8 per rank in DDP


def one(c, env, devices, staged=False):
    what = "Lightning, %s" % ("1 process" if devices == 1 else
                              "%d-rank DDP" % devices)
    cmd = [sl.PY3, TRAINER, "--steps", str(STEPS), "--devices", str(devices)]
    if staged:  # the write held 0.7 s: the steps change the tensors meanwhile
        what += ", staged saves"
        cmd += ["--staged-delay", "0.7"]

    def folder(c, path):
        files = sorted(os.listdir(path)) if os.path.isdir(path) else []
        want = sorted(["SPOTD_COMPLETE", "last.ckpt"] +
                      ["spotd-data-rank%d.pt" % r for r in range(devices)])
        c.check(files == want, "%s: the committed folder holds last.ckpt, "
                "each rank's data position and the marker" % what,
                repr(files))

    lines = fwlib.run(c, what, cmd + ["--sleep", "0.3"], env, STEPS, devices,
                      notice_at=5, resume_cmd=cmd, folder_check=folder)
    if lines is None:
        return
    skipped = {int(m.group(1)): int(m.group(2)) for m in
               (re.match(r"^skipped rank (\d+) (\d+)$", x) for x in lines)
               if m}
    c.check(sorted(skipped) == list(range(devices)) and
            all(v > 0 for v in skipped.values()),
            "%s: every rank replayed its epoch's consumed batches (%s)" %
            (what, skipped), "\n".join(lines[-20:]))


SCONTROL = """#!/bin/sh
echo "$@" >> "%s"
"""


def slurm(c, env):
    """Lightning on Slurm (its SLURMEnvironment, auto_requeue on by
    default) under spotd: the requeue signal (SIGUSR1) becomes a spotd
    checkpoint, not Lightning's hpc_ckpt and `scontrol requeue`; SIGTERM
    stops the trainer instead of being ignored."""
    with tempfile.TemporaryDirectory(prefix="spotd-lightning-slurm-") as tmp:
        calls = os.path.join(tmp, "scontrol.calls")
        bindir = os.path.join(tmp, "bin")
        os.makedirs(bindir)
        with open(os.path.join(bindir, "scontrol"), "w") as f:
            f.write(SCONTROL % calls)
        os.chmod(os.path.join(bindir, "scontrol"), 0o755)
        req = os.path.join(tmp, "req")
        sl.write_request_file(req, 0)
        root = os.path.join(tmp, "ckpt")
        e = dict(env, PATH=bindir + ":" + os.environ.get("PATH", ""),
                 SPOTD_CKPT_DIR=root, SPOTD_REQUEST_FILE=req,
                 SPOTD_SOCKET=os.path.join(tmp, "no-spotd.sock"),
                 SLURM_JOB_ID="4242", SLURM_JOB_NAME="train",
                 SLURM_NTASKS="1", SLURM_NTASKS_PER_NODE="1",
                 SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
                 SLURM_NNODES="1", SLURM_STEP_NUM_NODES="1")
        cp = subprocess.run([sl.PY3, TRAINER, "--steps", "12", "--signals",
                             "3:USR1,6:TERM"], env=e, cwd=tmp,
                            capture_output=True, text=True, timeout=600)
        log = "rc=%d\n%s%s" % (cp.returncode, cp.stdout[-2000:],
                               cp.stderr[-3000:])
        hpc = [f for f in os.listdir(tmp) if f.startswith("hpc_ckpt")]
        saved = sorted(os.listdir(root)) if os.path.isdir(root) else []
        c.check("SLURM auto-requeue" in cp.stderr or "auto-requeue is off"
                in cp.stderr, "Lightning on Slurm: Lightning saw a Slurm "
                "environment", log)
        c.check(not hpc and not os.path.exists(calls) and
                saved == ["step-000004"],
                "Lightning on Slurm under spotd: SIGUSR1 in step 3 makes "
                "spotd's checkpoint at the next step (step-000004), not "
                "Lightning's hpc_ckpt "
                "and `scontrol requeue`", "hpc %s, scontrol %s, saved %s\n%s"
                % (hpc, os.path.exists(calls), saved, log))
        last = max([int(m.group(1)) for m in (re.match(
            r"^step (\d+) rank 0", x) for x in cp.stdout.splitlines())
                    if m] or [0])
        c.check(last < 12 and "final rank" not in cp.stdout,
                "Lightning on Slurm under spotd: SIGTERM after step 6 stops "
                "the trainer (last step %d of 12)" % last, log)


def main():
    sl.daemon_env()
    env = fwlib.fw_env(["torch", "lightning.pytorch"],
                       "the Lightning integration (spotd.lightning)")
    c = sl.Checks()
    threads = [threading.Thread(target=one, args=(c, env, 1, True)),
               threading.Thread(target=one, args=(c, env, 2))]
    threads.append(threading.Thread(target=slurm, args=(c, env)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sl.kill_started()
    c.finish()


if __name__ == "__main__":
    main()
