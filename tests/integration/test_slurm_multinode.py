#!/usr/bin/python3
"""A 3-node job on a real Slurm cluster (tests/slurm.sh --nodes 3): one
node's notice preempts the whole job once, and it resumes byte-identical.

Two `sbatch -N3 --ntasks-per-node=1 --requeue` jobs run at once on the
three nodes, each `srun spotd run ... -- python3 train_ddp.py` (PyTorch
DDP, gloo, one process per node, MASTER_ADDR = node1's namespace address,
the Python helper `spotd`):
  - the reference job runs uninterrupted (no metadata);
  - the preempted job's spotd on node K watches its own spotd-emulate
    (on the cluster's bridge address, reachable from the namespaces) and
    relaunches with `spotctl relaunch --backend slurm`.
Once the preempted job trains, only node2's emulator publishes a notice.
Checks: the other two spotd drain on the job-wide notice (fan-out latency
printed); the three ranks commit one checkpoint; the job is requeued
exactly once (one relaunch step ran, the others skipped it); it comes back
on 3 nodes where each rank restores only its rank-K/ files (bytes printed);
the final checkpoint of every rank is byte-identical to the reference
job's. Then nodes 2 and 3 get notices in the same second in a third job:
still one commit for the preemption and one requeue. (train_ddp.py's
warm-up pass makes DDP sum gradients in the same
order in a fresh and a resumed run, which shows with 3 ranks). Skips (77) without root, Slurm, torch or the S3 server."""
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

STEPS = 160
BATCH = r'''#!/bin/bash
run=${SLURM_RESTART_COUNT:-0}
echo "batch run=$run job=$SPOTD_TEST_JOB"
export MASTER_ADDR=$SPOT_TEST_MASTER MASTER_PORT=$((29000 + SLURM_JOB_ID % 900))
srun --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c '
  # A shell between srun and spotd: at the requeue Slurm SIGTERMs every
  # process of the step and SIGKILLs what is left once the task (this
  # shell) has exited; the trap keeps the shell waiting for spotd, which
  # stops its trainer and releases the job lease first.
  trap : TERM
  k=$SLURM_NODEID
  meta=(--provider none)
  if [[ -n $SPOT_TEST_EMUS ]]; then
    urls=($SPOT_TEST_EMUS)
    meta=(--provider aws --metadata-url "${urls[$k]}" --poll-interval 1
          --relaunch "$SPOTCTL relaunch --backend slurm")
  fi
  d=$SPOT_TEST_WORK/$SPOTD_TEST_JOB/node$k
  mkdir -p "$d"
  RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=0 \
  GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
  "$SPOTD" run --job "$SPOTD_TEST_JOB" --store "$SPOT_TEST_STORE" \
    --endpoint "http://$SPOT_TEST_SLURM_FORWARD" "${meta[@]}" \
    --interval 0 --ckpt-dir "$d/ckpt" --socket "$d/spotd.sock" -- \
    /usr/bin/python3 "$SPOT_TEST_TRAIN" --steps '$STEPS' \
      --sleep-per-step 0.08 --log-every 20
  echo "spotd exit node=$k run='$run' status=$?"
'
echo "batch end run=$run"
'''.replace("'$STEPS'", str(STEPS))


class Emulator(sl.EmulatorProc):
    """`spotd-emulate --provider aws` on the cluster's bridge address,
    which the nodes' namespaces reach."""

    def __init__(self, bind):  # noqa: super().__init__ insists on 127.x
        self.p = subprocess.Popen(
            [sl.spotd_emulate_exe(), "--provider", "aws", "--port", "0",
             "--bind", bind], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        sl._STARTED.append(self.p)
        self.out = sl.LineLog(self.p.stdout, "[emulate] ")
        self.err = sl.LineLog(self.p.stderr, "[emulate] ")
        _, line = self.out.wait(r"^listening on ", 10)
        if line is None:
            self.p.kill()
            raise RuntimeError("the emulator did not start")
        self.url = line.split()[-1]
        sl.expect(self.url.startswith("http://%s:" % bind), self.url)


def final_files(work, job, rank):
    """{relative path: full path} of rank's final local checkpoint."""
    base = os.path.join(work, job, "node%d" % rank, "ckpt",
                        "step-%06d" % STEPS)
    out = {}
    for dp, _, fs in os.walk(base):
        for f in fs:
            if f != "SPOTD_COMPLETE":
                full = os.path.join(dp, f)
                out[os.path.relpath(full, base)] = full
    return out


GAP = r"""
import sys, torch
def flat(x):
    if torch.is_tensor(x):
        return [x.double().flatten()]
    if isinstance(x, dict):
        return [t for k in sorted(x, key=str) for t in flat(x[k])]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat(v)]
    return []
gap = 0.0
for i in range(1, len(sys.argv), 2):
    a = flat(torch.load(sys.argv[i])); b = flat(torch.load(sys.argv[i + 1]))
    if len(a) != len(b):
        sys.exit("%s and %s hold different tensors" % (sys.argv[i], sys.argv[i + 1]))
    for x, y in zip(a, b):
        gap = max(gap, (x - y).abs().max().item() if x.numel() else 0.0)
print(gap)
"""


def max_gap(pairs):
    """The largest difference between the tensors of file pairs."""
    if not pairs:
        return 0.0
    cp = subprocess.run(["/usr/bin/python3", "-c", GAP] +
                        [p for ab in pairs for p in ab],
                        capture_output=True, text=True, timeout=60)
    try:
        return float(cp.stdout.strip())
    except ValueError:
        print(cp.stderr)
        return None


def wait_for(path, pattern, timeout, count=1):
    end = time.time() + timeout
    while time.time() < end:
        found = re.findall(pattern, sl.read_text(path), re.M)
        if len(found) >= count:
            return found
        time.sleep(0.2)
    return re.findall(pattern, sl.read_text(path), re.M)


def two_notices(c, env, work, emus, store, prefix, job):
    """Nodes 2 and 3 get notices in the same second: still one commit for
    the preemption and one requeue."""
    out = os.path.join(work, "two.out")
    e = dict(env, SPOTD_TEST_JOB=job,
             SPOT_TEST_EMUS=" ".join(x.url for x in emus))
    cp = sl.run(["sbatch", "--parsable", "-N3", "--ntasks-per-node=1",
                 "--requeue", "--open-mode=append", "-o", out, "-J",
                 "spotd-two", os.path.join(work, "batch.sh")], timeout=30,
                env=e)
    if not c.check(cp.returncode == 0, "two notices: sbatch", cp.stderr):
        return
    c.check(wait_for(out, r"^step (\d+) loss", 90),
            "two notices: the job trains on 3 nodes")
    emus[1].control("notice", deadline=60)
    emus[2].control("notice", deadline=60)
    wait_for(out, r"relaunch: this rank \(\d\) runs", 90)
    for x in emus[1:]:
        x.control("cancel", notice=1)
    c.check(wait_for(out, r"^batch end run=1", 150),
            "two notices: the requeued run ends")
    text = sl.read_text(out)
    runs = re.findall(r"^batch run=(\d)", text, re.M)
    c.check(runs == ["0", "1"], "two notices: requeued exactly once (%s)" %
            runs)
    won = re.findall(r"relaunch: this rank \((\d)\) runs the job's "
                     r"relaunch step", text)
    c.check(len(won) == 1, "two notices: one relaunch step ran (%s)" % won)
    restored = re.findall(r"restored checkpoint (step-\d+) into", text)
    commits = sl.committed(prefix)
    c.check(len(restored) == 3 and len(set(restored)) == 1 and
            sorted(commits) == sorted([restored[0], "step-%06d" % STEPS]),
            "two notices: one commit for the preemption, restored by the 3 "
            "ranks (%s), then the final one: %r" % (restored[:1], commits))


def main():
    endpoint, bucket = sl.store_env()
    if os.geteuid() != 0:
        sl.skip("needs root for namespaces, munged and slurmd")
    if not all(os.path.exists(p) for p in ("/usr/sbin/slurmctld",
                                           "/usr/sbin/slurmd",
                                           "/usr/bin/sbatch")):
        sl.skip("slurm-wlm is not installed")
    if subprocess.run(["/usr/bin/python3", "-c", "import torch"]).returncode:
        sl.skip("python3-torch is not installed")
    c = sl.Checks()
    t0 = time.time()
    spotd = sl.spotd_exe()
    spotctl = sl.spotctl_exe()
    train = sl.srcdir_path("examples", "pytorch", "train_ddp.py")
    store, job, prefix = sl.daemon_job("slurm-mn")
    ref_job = job + "-ref"  # same store root: PREFIX/job-ref/
    ref_prefix = prefix.rstrip("/") + "-ref/"
    target = re.sub(r"^https?://", "", endpoint).rstrip("/")
    sdir = tempfile.mkdtemp(prefix="spotd-slurmmn-")
    work = tempfile.mkdtemp(prefix="spotd-slurmmn-work-")
    os.chmod(work, 0o755)
    env_vals, emus, started = {}, [], False
    try:
        cp = sl.run(["bash", sl.srcdir_path("tests", "slurm.sh"), "start", sdir,
                     "--nodes", "3", "--forward", target], timeout=120,
                    env={"SLURM_TEST_KILLWAIT": "3"})
        started = True
        if not c.check(cp.returncode == 0, "a 3-node cluster starts",
                       cp.stderr[-3000:]):
            c.finish()
        for line in sl.read_text(os.path.join(sdir, "env")).splitlines():
            k, _, v = line.partition("=")
            env_vals[k] = v
            os.environ[k] = v
        bridge = env_vals["SPOT_TEST_SLURM_FORWARD"].split(":")[0]
        master = bridge.rsplit(".", 1)[0] + ".11"  # node1 (tests/slurm.sh)
        for _ in range(3):
            emus.append(Emulator(bridge))
        env = {"SPOTD": spotd, "SPOTCTL": spotctl, "SPOT_TEST_STORE": store,
               "SPOT_TEST_WORK": work, "SPOT_TEST_TRAIN": train,
               "SPOT_TEST_MASTER": master, "SPOT_TEST_SLURM_FORWARD":
               env_vals["SPOT_TEST_SLURM_FORWARD"],
               "AWS_EC2_METADATA_DISABLED": "true"}
        with open(os.path.join(work, "batch.sh"), "w") as f:
            f.write(BATCH)
        outs, ids = {}, {}
        for name, j, urls in (("ref", ref_job, ""),
                              ("pre", job, " ".join(e.url for e in emus))):
            outs[name] = os.path.join(work, name + ".out")
            e = dict(env, SPOTD_TEST_JOB=j, SPOT_TEST_EMUS=urls)
            cp = sl.run(["sbatch", "--parsable", "-N3", "--ntasks-per-node=1",
                         "--requeue", "--open-mode=append", "-o", outs[name],
                         "-J", "spotd-" + name,
                         os.path.join(work, "batch.sh")], timeout=30, env=e)
            if not c.check(cp.returncode == 0, "sbatch %s job" % name,
                           cp.stderr):
                c.finish()
            ids[name] = cp.stdout.strip().split(";")[0]
        pre = outs["pre"]
        got = wait_for(pre, r"^step (\d+) loss", 90)
        c.check(got, "the preempted job trains on 3 nodes",
                sl.read_text(pre)[-3000:])
        t_notice = time.time()
        emus[1].control("notice", deadline=60)  # node2 = rank 1 only
        drains = wait_for(pre, r"job-wide notice from rank 1: \S+, seen "
                          r"([\d.]+) s after", 20, 2)
        c.check(len(drains) == 2, "ranks 0 and 2 drain on rank 1's notice "
                "(fan-out %s s)" % ", ".join(drains))
        # The requeued run must not see this notice again: the cloud would
        # have replaced the machine.
        wait_for(pre, r"relaunch: this rank \(\d\) runs", 90)
        emus[1].control("cancel", notice=1)
        ends = wait_for(pre, r"^batch end run=1", 150)
        text = sl.read_text(pre)
        c.check(ends, "the requeued run ends", text[-3000:])
        runs = re.findall(r"^batch run=(\d)", text, re.M)
        c.check(runs == ["0", "1"], "requeued exactly once (runs %s)" % runs)
        won = re.findall(r"relaunch: this rank \((\d)\) runs the job's "
                         r"relaunch step", text)
        c.check(won == ["0"], "rank 0 alone ran the relaunch step (%s); "
                "%d other rank(s) logged that they skipped it before Slurm "
                "stopped them" % (won, len(re.findall(
                    r"another rank already ran the job's relaunch", text))))
        # Slurm's output of run 0 ends when srun goes, before spotd's last
        # lines: the requeued rank 0 tells whether the lease was released
        # (taken at once with no wait and no dead-holder takeover).
        second = text.split("batch run=1", 1)[-1]
        took = re.findall(r"took the job lease of %s: .* epoch=(\d+)" % job,
                          second)
        c.check(took == ["2"] and "that is gone" not in second and
                "waiting for the job lease" not in second,
                "run 0: rank 0 released the job lease before Slurm stopped "
                "it (run 1 took it at once: epoch %s)" % took,
                "\n".join(l for l in second.splitlines() if "lease" in l))
        st = re.findall(r"spotd exit node=(\d) run=0 status=(\d+)", text)
        print("run 0 exits: %r (%.1f s after the notice)" %
              (st, time.time() - t_notice))
        rest = re.findall(r"rank (\d) restored (\d+) files: (\d+) bytes "
                          r"downloaded \(\d+ raw\) of the checkpoint's (\d+)",
                          text)
        c.check(sorted(r[0] for r in rest) == ["0", "1", "2"] and
                all(0 < int(r[2]) < int(r[3]) for r in rest),
                "run 1: every rank restored only its part %r" % rest)
        for k in range(3):
            dirs = [x for x in os.listdir(os.path.join(work, job, "node%d" % k,
                                                       "ckpt"))
                    if x.startswith("step-")]
            c.check(dirs, "node %d has local checkpoints" % k)
        restored = re.findall(r"restored checkpoint (step-\d+) into", text)
        commits = sl.committed(prefix)
        c.check(len(set(restored)) == 1 and sorted(commits) == sorted(
            [restored[0], "step-%06d" % STEPS]),
            "one checkpoint committed for the preemption (%s), restored by "
            "all three, then the final one: %r" % (restored[:1], commits))
        end = wait_for(outs["ref"], r"^batch end run=0", 60)
        c.check(end, "the reference job ends")
        for k in range(3):
            a = final_files(work, ref_job, k)
            b = final_files(work, job, k)
            diff = [f for f in sorted(a) if f not in b or
                    not filecmp.cmp(a[f], b[f], shallow=False)]
            c.check(a and sorted(a) == sorted(b),
                    "rank %d: the final checkpoint has the reference's %d "
                    "files" % (k, len(a)), repr((sorted(a), sorted(b))))
            c.check(a and not diff, "rank %d: the final checkpoint is "
                    "byte-identical to the uninterrupted run's" % k,
                    "differ: %r, largest tensor gap %r" %
                    (diff, max_gap([(a[f], b[f]) for f in diff])))
        two_notices(c, env, work, emus, store, prefix.rstrip("/") + "-two/",
                    job + "-two")
    finally:
        for e in emus:
            e.stop()
        if started:
            cp = sl.run(["bash", sl.srcdir_path("tests", "slurm.sh"), "stop",
                         sdir], timeout=90)
            c.check(cp.returncode == 0, "tests/slurm.sh stop", cp.stderr[-2000:])
        for name in ("pre", "ref", "two"):
            p = os.path.join(work, name + ".out")
            if os.path.exists(p):
                text = sl.read_text(p)  # all of it when a check failed
                print("---- %s job output%s\n%s" %
                      (name, "" if c.failed else " (tail)",
                       text if c.failed else text[-6000:]))
        shutil.rmtree(sdir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        sl.s3_cleanup(prefix)
        sl.s3_cleanup(ref_prefix)
        sl.s3_cleanup(prefix.rstrip("/") + "-two/")
        print("elapsed %.1f s" % (time.time() - t0))
    c.finish()


if __name__ == "__main__":
    main()
