"""End to end: a real PyTorch run preempted twice, resumed bit-identical.

examples/pytorch/train.py runs under `spotd run` on "node 0". When it has
done a random number of steps, the node's metadata emulator (`spotctl
emulate --provider aws`) publishes a spot interruption notice; spotd has
the trainer checkpoint, uploads and commits the checkpoint to Ceph, runs
`spotctl relaunch --backend exec` and stops the trainer (exit 75). Node 1
is a fresh working folder (node 0's folder deleted) with a fresh emulator:
spotd restores the committed checkpoint and the trainer resumes; it is
preempted again at another random step; node 2 finishes the run.

Checks: no step completed before a signal is lost; each node resumes from
the checkpoint the previous one committed (LATEST, the relaunch step's
SPOTD_CHECKPOINT); every step has the uninterrupted run's loss; the final
checkpoint, both the last node's local copy and the one restored from the
store, is byte-identical to an uninterrupted run's (every file). This is
the strongest check of the promise spotd makes.

The preemption steps come from a seed printed first (SPOT_TEST_SEED=N
replays them). Skips (77) without the test S3 server or torch.
"""
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402
import e2elib as e2e  # noqa: E402

STEPS = 300
SAVE_EVERY = 100
SLEEP = "0.05"  # per step: a preemption lands mid-run, with room to act


def main():
    sl.daemon_env()
    e2e.need_torch()
    rng = e2e.test_seed("e2e_preempt")
    seed = rng.randrange(1000)
    # Notices away from the scheduled saves (multiples of 100), so that the
    # checkpoint the notice asks for is the one committed last.
    k1 = 100 * rng.randint(0, 1) + rng.randint(5, 40)
    k2 = 100 * rng.randint(k1 // 100 + 1, 2) + rng.randint(5, 40)
    print("     train seed %d; notices after steps %d and %d" % (seed, k1, k2),
          flush=True)
    train_args = ["--steps", STEPS, "--seed", seed, "--log-every", 1,
                  "--save-every", SAVE_EVERY]
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("e2e-preempt")
    tmp = tempfile.mkdtemp(prefix="spotd-e2e-preempt-")
    nodes = []
    try:
        ref, ref_losses = e2e.reference(tmp, [str(a) for a in train_args])
        run(c, tmp, store, job, prefix, train_args, ref, ref_losses,
            (k1, k2, None), nodes)
    finally:
        for n in nodes:
            n.stop()
        sl.kill_started()
        sl.s3_cleanup(prefix)
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


def run(c, tmp, store, job, prefix, train_args, ref, ref_losses, plan, nodes):
    final = "step-%06d" % STEPS
    segments = []
    prev = None  # (name, step) committed by the previous node
    t0 = time.monotonic()
    for i, at in enumerate(plan):
        if i > 0:
            # A new machine: nothing local survives the old one.
            shutil.rmtree(nodes[-1].ckpt_dir)
        node = e2e.Node(tmp, "node%d" % i, store, job,
                        train_args + ["--sleep-per-step", SLEEP])
        nodes.append(node)
        what = node.name
        if prev:
            got = node.resumed(timeout=90)
            c.check(got == prev, what + ": resumed from %s at step %d" % prev,
                    "got %r\n%s" % (got, node.dump()))
            c.check(node.d.err.matching(r"restored checkpoint %s into " %
                                        prev[0]),
                    what + ": spotd restored %s from the store" % prev[0])
            if got != prev:
                return
        segments.append((node, prev[1] if prev else 0))
        if at is None:
            rc = node.finish(timeout=180)
            c.check(rc == 0, what + ": runs to the end, spotd exits 0",
                    "rc=%s\n%s" % (rc, node.dump()))
            c.check(node.wait_log(r"committed checkpoint name=%s " % final, 1)
                    is not None, what + ": the final %s is committed" % final)
            break
        if not c.check(node.wait_step(at) is not None,
                       what + ": reached step %d" % at, node.dump()):
            return
        node.notice(deadline=120)
        rc = node.finish(timeout=120)
        c.check(rc == 75, what + ": spotd exits 75 after the notice",
                "rc=%s\n%s" % (rc, node.dump()))
        saved = e2e.check_no_step_lost(c, node, what)
        if saved is None:
            return
        commits = [x[0] for x in node.committed_lines()]
        hooks = node.relaunches()
        c.check(len(hooks) == 1 and hooks[0].get("SPOTD_CHECKPOINT") == saved[0]
                and hooks[0].get("SPOTD_REASON") == "aws-spot-terminate",
                what + ": relaunched (exec backend) with SPOTD_CHECKPOINT=%s"
                % saved[0], repr(hooks))
        c.check(saved[0] in commits and sl.latest(prefix) == saved[0],
                what + ": %s committed and LATEST" % saved[0],
                "commits %s LATEST %r" % (commits, sl.latest(prefix)))
        c.check(not os.path.exists(node.d.socket), what + ": spotd cleaned up")
        done = max(node.losses() or [0])
        print("     %s: notice after step %d, checkpoint %s, stopped after "
              "step %d (%d step(s) redone)" % (what, at, saved[0], done,
                                               done - saved[1]), flush=True)
        prev = saved
    print("     preempted chain: %.1f s" % (time.monotonic() - t0), flush=True)

    e2e.check_steps(c, segments, ref_losses, STEPS)
    last = nodes[-1]
    why = e2e.same_checkpoint(os.path.join(last.ckpt_dir, final),
                              os.path.join(ref, final))
    c.check(why is None, "preempted twice: the last node's %s is byte-identical"
            " to the uninterrupted run's" % final, why or "")
    c.check(sl.latest(prefix) == final, "LATEST is %s" % final,
            "LATEST=%r" % sl.latest(prefix))
    dest = os.path.join(tmp, "from-store")
    cp = e2e.restore_from_store("%s/%s" % (store, job), dest)
    c.check(cp.returncode == 0, "spotctl restore of LATEST", cp.stderr)
    why = e2e.same_checkpoint(dest, os.path.join(ref, final))
    c.check(why is None, "the store's %s is byte-identical to the uninterrupted "
            "run's" % final, why or "")


if __name__ == "__main__":
    main()
