"""End to end: a preemption while the trainer is writing a checkpoint.

examples/pytorch/train.py runs under `spotd run` with --save-every 50 and
--slow-save (a pause after the first file of each save: the folder is
half-written for a while). Its step-000050 is uploaded and committed.
Then, while a later save is half-written:

  deadline   the scheduled save of step 100 is under way when a spot notice
             with a short deadline arrives: the save cannot finish in time,
             spotd gives up at the deadline, relaunches with the last
             committed checkpoint and stops the trainer (SIGTERM) in the
             middle of its save;
  sigkill    a notice arrives, the trainer starts the checkpoint it asks
             for and is killed (SIGKILL) while writing it.

Either way: the half-written folder (no SPOTD_COMPLETE) is never committed
(no object of that name left in the store, no multipart upload), LATEST
stays step-000050, the relaunch step gets step-000050, and a fresh node
resumes from step-000050 and ends byte-identical to an uninterrupted run.
Skips (77) without the test S3 server or torch.
"""
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402
import e2elib as e2e  # noqa: E402

STEPS = 150
SAVE_EVERY = 50
SLOW_SAVE = 8      # seconds a save stays half-written
DEADLINE = 5       # the short notice of the "deadline" case (< SLOW_SAVE)
FIRST = "step-%06d" % SAVE_EVERY


def half_written(ckpt_dir, exclude=()):
    """A checkpoint folder being written (model.pt there, no marker)."""
    try:
        names = sorted(os.listdir(ckpt_dir))
    except FileNotFoundError:
        return None
    for n in names:
        p = os.path.join(ckpt_dir, n)
        if n in exclude or n.startswith(".") or not os.path.isdir(p):
            continue
        if os.path.exists(os.path.join(p, "model.pt")) and \
                not os.path.exists(os.path.join(p, e2e.MARKER)):
            return n
    return None


def wait_for(pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    return None


def scenario(c, tmp, case, train_args, ref, ref_losses):
    tag = case + ": "
    store, job, prefix = sl.daemon_job("e2e-save-race-" + case)
    nodes = []
    try:
        node = e2e.Node(tmp, case + "-node0", store, job,
                        train_args + ["--sleep-per-step", "0.05",
                                      "--slow-save", SLOW_SAVE])
        nodes.append(node)
        line = node.wait_log(r"committed checkpoint name=%s " % FIRST, 90)
        if not c.check(line is not None and sl.latest(prefix) == FIRST,
                       tag + "the scheduled %s is committed" % FIRST,
                       node.dump()):
            return
        if case == "deadline":
            half = wait_for(lambda: half_written(node.ckpt_dir, (FIRST,)), 60)
            c.check(half == "step-%06d" % (2 * SAVE_EVERY),
                    tag + "the scheduled save of step %d is under way (%s)"
                    % (2 * SAVE_EVERY, half), node.dump())
            node.notice(deadline=DEADLINE)
        else:
            node.wait_step(SAVE_EVERY + 10)
            node.notice(deadline=120)
            half = wait_for(lambda: half_written(node.ckpt_dir, (FIRST,)), 30)
            c.check(half is not None and node.wait_log(
                r"checkpoint requested \(aws-spot-terminate\)", 5),
                tag + "the trainer is writing the checkpoint the notice asked "
                "for (%s)" % half, node.dump())
            m = re.search(r"trainer pid=(\d+) started",
                          node.d.err.matching(r"trainer pid=\d+ started")[0])
            os.kill(int(m.group(1)), signal.SIGKILL)
        rc = node.finish(timeout=60)
        if not c.check(half is not None, tag + "caught a half-written folder"):
            return
        c.check(rc == 75, tag + "spotd exits 75 (handled preemption)",
                "rc=%s\n%s" % (rc, node.dump()))
        hp = os.path.join(node.ckpt_dir, half)
        c.check(os.path.exists(os.path.join(hp, "model.pt")) and
                not os.path.exists(os.path.join(hp, "optimizer.pt")) and
                not os.path.exists(os.path.join(hp, e2e.MARKER)),
                tag + "%s was left half-written (model.pt only, no marker)"
                % half, str(os.listdir(hp) if os.path.isdir(hp) else None))
        keys = sl.s3_keys(prefix + "checkpoints/" + half + "/")
        # with overlap (the default) its closed files may have gone up
        # while it was written: never committed, and nothing of it left
        c.check(not keys and half not in sl.committed(prefix) and
                not node.d.err.matching(r"committed checkpoint name=%s " % half),
                tag + "%s was never committed (no object left)" % half,
                "keys %s" % keys[:5])
        c.check(not sl.s3_uploads(prefix), tag + "no multipart upload left")
        c.check(sl.latest(prefix) == FIRST,
                tag + "LATEST is still %s" % FIRST, "LATEST=%r" %
                sl.latest(prefix))
        hooks = node.relaunches()
        c.check(len(hooks) == 1 and hooks[0].get("SPOTD_CHECKPOINT") == FIRST,
                tag + "relaunched with the previous checkpoint %s" % FIRST,
                repr(hooks))
        want = (r"the trainer did not complete a final checkpoint before the "
                r"deadline"
                if case == "deadline" else
                r"the trainer exited without a final checkpoint")
        c.check(node.d.err.matching(want), tag + "spotd says: " + want,
                node.dump())

        # A fresh node: node 0's folder is gone.
        shutil.rmtree(node.ckpt_dir)
        node1 = e2e.Node(tmp, case + "-node1", store, job, train_args)
        nodes.append(node1)
        got = node1.resumed(timeout=90)
        c.check(got == (FIRST, SAVE_EVERY),
                tag + "the fresh node resumed from %s" % FIRST,
                "got %r\n%s" % (got, node1.dump()))
        rc = node1.finish(timeout=120)
        c.check(rc == 0, tag + "the fresh node finishes, spotd exits 0",
                "rc=%s\n%s" % (rc, node1.dump()))
        e2e.check_steps(c, [(node, 0), (node1, SAVE_EVERY)], ref_losses, STEPS)
        final = "step-%06d" % STEPS
        why = e2e.same_checkpoint(os.path.join(node1.ckpt_dir, final),
                                  os.path.join(ref, final))
        c.check(why is None, tag + "final %s byte-identical to the "
                "uninterrupted run's" % final, why or "")
        c.check(sl.latest(prefix) == final, tag + "LATEST is %s" % final)
    finally:
        for n in nodes:
            n.stop()
        sl.kill_started()
        sl.s3_cleanup(prefix)


def main():
    sl.daemon_env()
    e2e.need_torch()
    rng = e2e.test_seed("e2e_save_race")
    seed = rng.randrange(1000)
    train_args = ["--steps", STEPS, "--seed", seed, "--log-every", 1,
                  "--save-every", SAVE_EVERY]
    c = sl.Checks()
    tmp = tempfile.mkdtemp(prefix="spotd-e2e-race-")
    try:
        ref, ref_losses = e2e.reference(tmp, [str(a) for a in train_args])
        for case in sys.argv[1:] or ["deadline", "sigkill"]:
            print("--- " + case, flush=True)
            scenario(c, tmp, case, train_args, ref, ref_losses)
    finally:
        sl.kill_started()
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
