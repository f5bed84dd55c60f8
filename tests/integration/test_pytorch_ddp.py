"""A torchrun DDP job (Debian's real torchrun, 2 workers, gloo, CPU) under
spotd, preempted by an AWS notice of spotd-emulate, resumed on a fresh
"node", ends byte-identical to an uninterrupted run.

examples/pytorch/train_ddp.py uses the Python helper (python/spotd): the
ranks agree on the checkpoint request with one all_reduce, local rank 0
writes model/optimizer/trainer state, each rank its RNG state, and the
marker comes after every rank is done.

Checks: node 0's spotd signals the job on the notice, the ranks save one
checkpoint at the same step, spotd commits it (LATEST), stops the job and
exits 75; node 1 (a fresh folder) restores it, torchrun resumes from that
step and finishes (spotd exits 0); every step's loss equals the
uninterrupted run's and the final checkpoint (every file, both ranks' RNG
states included) is byte-identical to it, locally and restored from the
store.

torchrun: spotd is to start the command with the checkpoint signal ignored,
so torchrun survives SIGUSR1 with no wrapper. SPOTD_TEST_TORCHRUN_WRAPPER=1
runs it through the documented wrapper `bash -c "trap '' USR1; exec
torchrun ..."` instead (for a spotd without that change). Skips (77)
without the test S3 server, torch or torchrun.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402
import e2elib as e2e  # noqa: E402

TRAIN = sl.srcdir_path("examples", "pytorch", "train_ddp.py")
TORCHRUN = "/usr/bin/torchrun"
# torchrun --tee copies the workers' lines to its own stdout, a pipe to
# spotd here: block-buffered, they reached the test only when torchrun
# exited, after the step the notice waits for (the run was over, and no
# checkpoint was taken on the signal). Where PYTHONUNBUFFERED=1 was already
# set the test passed.
os.environ["PYTHONUNBUFFERED"] = "1"
STEPS = 120
FILES = ["model.pt", "optimizer.pt", "rng-rank0.pt", "rng-rank1.pt",
         "trainer.pt"]
MARKER = "SPOTD_COMPLETE"
PFX = r"^(?:\[\w+?\d+\]:)?"  # torchrun --tee's "[default0]:"
STEP_RE = re.compile(PFX + r"step (\d+) loss (\S+)$")
SAVED_RE = re.compile(PFX + r"saved (\S+) at step (\d+) \((\w+)\)$")
RESUMED_RE = re.compile(PFX + r"resumed from (\S+) at step (\d+)$")


def torchrun_cmd(logdir, train_args):
    cmd = [TORCHRUN] + sl.torchrun_one_node() + [
           "--nproc_per_node", "2", "--redirects",
           "1", "--tee", "1", "--log_dir", logdir, TRAIN] + \
        [str(a) for a in train_args]
    if os.environ.get("SPOTD_TEST_TORCHRUN_WRAPPER") == "1":
        return ["bash", "-c", "trap '' USR1; exec \"$@\"", "bash"] + cmd
    return cmd


def losses(lines):
    return {int(m.group(1)): m.group(2) for m in map(STEP_RE.match, lines)
            if m}


def rank0_lines(logdir):
    """What global rank 0 printed, from the file torchrun --redirects
    writes it to (LOGDIR/RUN/attempt_N/0/stdout.log): torchrun's --tee copy
    on its own stdout can split a line it read while the worker was still
    writing it (seen on a loaded machine: "step 99 loss 2.30" then the
    rest), so the losses are read from the file itself."""
    out = []
    for path in sorted(glob.glob(os.path.join(logdir, "*", "attempt_*", "0",
                                              "stdout.log"))):
        with open(path, errors="replace") as f:
            out.extend(f.read().splitlines())
    return out


def same_folder(a, b):
    """None when the checkpoint folders hold FILES byte-identical, else why."""
    try:
        fa = sorted(f for f in os.listdir(a) if f != MARKER)
        fb = sorted(f for f in os.listdir(b) if f != MARKER)
    except OSError as e:
        return str(e)
    if fa != FILES or fb != FILES:
        return "files: %s vs %s" % (fa, fb)
    for f in fa:
        if not sl.same_file(os.path.join(a, f), os.path.join(b, f)):
            return f + " differs"
    return None


def reference(tmp, train_args):
    ckpt = os.path.join(tmp, "reference")
    env = dict(os.environ, SPOTD_CKPT_DIR=ckpt, SPOTD_JOB="reference")
    env.pop("SPOTD_RESUME_DIR", None)
    env.pop("SPOTD_SOCKET", None)
    t0 = time.monotonic()
    cp = subprocess.run(torchrun_cmd(os.path.join(tmp, "ref-logs"),
                                     train_args), env=env, capture_output=True,
                        text=True, timeout=240)
    if cp.returncode != 0:
        print("FAIL reference torchrun exited %d\n%s%s"
              % (cp.returncode, cp.stdout[-3000:], cp.stderr[-3000:]))
        raise SystemExit(1)
    print("     uninterrupted torchrun: %.1f s" % (time.monotonic() - t0),
          flush=True)
    return ckpt, losses(rank0_lines(os.path.join(tmp, "ref-logs")))


def node(tmp, name, store, job, train_args):
    wd = os.path.join(tmp, name)
    os.makedirs(wd)
    emu = sl.EmulatorProc("aws")
    d = sl.Daemon(wd, store, job, cmd=torchrun_cmd(os.path.join(wd, "logs"),
                                                   train_args),
                  args=["--grace", "10"], provider="aws",
                  metadata_url=emu.url, poll_interval="200ms", echo=False)
    return emu, d


def out_lines(d):
    return [l for _, l in list(d.out.lines)]


def dump(d):
    return "--- spotd\n%s\n--- torchrun (last 30)\n%s" % (
        "\n".join(d.err.text().splitlines()[-60:]),
        "\n".join(out_lines(d)[-30:]))


def kill_workers(tmp):
    """SIGKILLs the torchrun workers a dead torchrun left behind: the
    processes whose SPOTD_CKPT_DIR lies in our tmp (started by this test)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"SPOTD_CKPT_DIR=" + tmp.encode()) for e in env):
            print("     killing leftover worker pid %s" % pid)
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass


def main():
    sl.daemon_env()
    e2e.need_torch()
    if not os.access(TORCHRUN, os.X_OK):
        sl.skip(TORCHRUN + " is not installed")
    rng = e2e.test_seed("pytorch_ddp")
    at = rng.randint(20, 70)
    wrapper = os.environ.get("SPOTD_TEST_TORCHRUN_WRAPPER") == "1"
    print("     notice after step %d; torchrun %s" % (
        at, "through the trap '' USR1 wrapper" if wrapper else "directly"),
        flush=True)
    train_args = ["--steps", STEPS, "--seed", 3, "--log-every", 1]
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("pytorch-ddp")
    tmp = tempfile.mkdtemp(prefix="spotd-ddp-")
    emus = []
    try:
        run(c, tmp, store, job, prefix, train_args, at, emus)
    finally:
        for e in emus:
            e.stop()
        sl.kill_started()
        kill_workers(tmp)
        sl.s3_cleanup(prefix)
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


def run(c, tmp, store, job, prefix, train_args, at, emus):
    final = "step-%06d" % STEPS
    ref, ref_losses = reference(tmp, train_args)
    if not c.check(sorted(ref_losses) == list(range(1, STEPS + 1)) and
                   same_folder(os.path.join(ref, final),
                               os.path.join(ref, final)) is None,
                   "the uninterrupted run logs every step and saves %s with "
                   "%s" % (final, FILES)):
        return

    # Node 0: preempted.
    emu, d = node(tmp, "node0", store, job,
                  train_args + ["--sleep-per-step", "0.1"])
    emus.append(emu)
    got = e2e._wait_lines(d.out, lambda l: (STEP_RE.match(l) is not None and
                                            int(STEP_RE.match(l).group(1))
                                            >= at), 120)
    if not c.check(got is not None, "node0: torchrun reached step %d" % at,
                   dump(d)):
        return
    emu.control("notice", deadline=120)
    rc = d.wait_exit(150)
    lines = out_lines(d)
    saved = [(m.group(1), int(m.group(2)), m.group(3))
             for m in map(SAVED_RE.match, lines) if m]
    c.check(rc == 75, "node0: spotd exits 75 after the notice",
            "rc=%s\n%s" % (rc, dump(d)))
    sig = [s for s in saved if s[2] == "signal"]
    if not c.check(len(sig) == 1 and sig[0][1] >= at,
                   "node0: the ranks saved one checkpoint on the signal, at "
                   "or after step %d" % at, "%r\n%s" % (saved, dump(d))):
        return
    name, step, _ = sig[0]
    local = os.path.join(d.ckpt_dir, name)
    c.check(sorted(os.listdir(local)) == sorted(FILES + [MARKER]),
            "node0: %s holds both ranks' files and one marker" % name,
            repr(os.listdir(local)))
    c.check(sl.latest(prefix) == name and d.err.matching(
        r"committed checkpoint name=%s " % name),
        "node0: spotd committed %s (LATEST)" % name,
        "LATEST=%r\n%s" % (sl.latest(prefix), dump(d)))
    c.check(not d.err.matching(r"without a final checkpoint|killed by"),
            "node0: torchrun survived the checkpoint signal", dump(d))
    emu.stop()
    shutil.rmtree(d.ckpt_dir)  # a new machine: nothing local survives

    # Node 1: restores and finishes.
    emu, d1 = node(tmp, "node1", store, job, train_args)
    emus.append(emu)
    rc = d1.wait_exit(240)
    lines1 = out_lines(d1)
    m = next(filter(None, map(RESUMED_RE.match, lines1)), None)
    c.check(m is not None and (m.group(1), int(m.group(2))) == (name, step),
            "node1: restored %s and resumed at step %d" % (name, step),
            dump(d1))
    c.check(rc == 0, "node1: runs to the end, spotd exits 0",
            "rc=%s\n%s" % (rc, dump(d1)))
    l0 = losses(rank0_lines(os.path.join(tmp, "node0", "logs")))
    l1 = losses(rank0_lines(os.path.join(tmp, "node1", "logs")))
    merged = {s: v for s, v in l0.items() if s <= step}
    merged.update({s: v for s, v in l1.items() if s > step})
    c.check(min(l1 or [0]) == step + 1, "node1: first step is %d" % (step + 1),
            "first %s" % min(l1 or [0]))
    c.check(sorted(merged) == list(range(1, STEPS + 1)),
            "the nodes' step logs cover 1..%d" % STEPS)
    diff = [s for s in sorted(merged) if merged[s] != ref_losses.get(s)]
    c.check(not diff, "every step's loss equals the uninterrupted run's",
            "first differing steps: %s" % diff[:10])
    why = same_folder(os.path.join(d1.ckpt_dir, final),
                      os.path.join(ref, final))
    c.check(why is None, "after the preemption the final %s is "
            "byte-identical to the uninterrupted run's" % final, why or "")
    dest = os.path.join(tmp, "from-store")
    cp = e2e.restore_from_store("%s/%s" % (store, job), dest)
    why = same_folder(dest, os.path.join(ref, final)) \
        if cp.returncode == 0 else cp.stderr
    c.check(why is None, "the store's LATEST (%s) is byte-identical to the "
            "uninterrupted run's" % sl.latest(prefix), why or "")


if __name__ == "__main__":
    main()
