"""End to end: a spot notice too short for the upload.

examples/pytorch/train.py runs under `spotd run`, whose S3 traffic goes
through a loopback proxy in front of Ceph. The scheduled step-000100 is
uploaded at full speed and committed. Then the link gets slow (the proxy
reads upload bodies at checkpoint size / SLOW_SECS bytes/s): the test first measures how long a
`spotctl push` of a checkpoint of the same size takes through it, and the
emulator then publishes a notice whose deadline is below that time.

Checks: spotd gives up the final upload at the deadline and says so; the
checkpoint it was uploading is not committed (no manifest), the previous
one stays intact (same manifest bytes, LATEST unchanged, no multipart
upload left behind), the relaunch step gets it, and a fresh node resumes
from it and ends byte-identical to an uninterrupted run.
Skips (77) without the test S3 server or torch.
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
FIRST = "step-%06d" % SAVE_EVERY
SLOW_SECS = 16   # the slow link moves a checkpoint in about this long
DEADLINE = 5     # s; spotd gives up 2 s before it


def main():
    endpoint, _ = sl.daemon_env()
    e2e.need_torch()
    rng = e2e.test_seed("e2e_short_notice")
    seed = rng.randrange(1000)
    at = SAVE_EVERY + rng.randint(5, 30)
    train_args = ["--steps", STEPS, "--seed", seed, "--log-every", 1,
                  "--save-every", SAVE_EVERY]
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("e2e-short-notice")
    tmp = tempfile.mkdtemp(prefix="spotd-e2e-short-")
    proxy = e2e.ThrottleProxy(endpoint)
    nodes = []
    try:
        ref, ref_losses = e2e.reference(tmp, [str(a) for a in train_args])
        run(c, tmp, store, job, prefix, proxy, train_args, ref, ref_losses,
            at, nodes)
    finally:
        for n in nodes:
            n.stop()
        sl.kill_started()
        proxy.close()
        sl.s3_cleanup(prefix)
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


def run(c, tmp, store, job, prefix, proxy, train_args, ref, ref_losses, at,
        nodes):
    # 1. How long does a checkpoint of this size take over the slow link?
    size = sum(os.path.getsize(os.path.join(ref, FIRST, f))
               for f in e2e.CKPT_FILES)
    rate = size / SLOW_SECS
    proxy.rate = rate
    t0 = time.monotonic()
    cp = sl.spotctl("push", os.path.join(ref, FIRST), "%s/measure" % store,
                    "--name", FIRST, "--endpoint", proxy.url, timeout=120)
    t_up = time.monotonic() - t0
    proxy.rate = None
    if not c.check(cp.returncode == 0 and proxy.slowed > 0,
                   "measured: a push over the slow link takes %.1f s" % t_up,
                   cp.stdout + cp.stderr):
        return
    if not c.check(t_up > DEADLINE + 1, "the notice's %d s deadline is below "
                   "the measured upload time (%.1f s)" % (DEADLINE, t_up)):
        return

    # 2. Node 0: step-000100 committed at full speed, then the slow link
    #    and a short notice.
    node = e2e.Node(tmp, "node0", store, job,
                    train_args + ["--sleep-per-step", "0.05"],
                    endpoint=proxy.url)
    nodes.append(node)
    line = node.wait_log(r"committed checkpoint name=%s " % FIRST, 90)
    if not c.check(line is not None and sl.latest(prefix) == FIRST,
                   "node0: the scheduled %s is committed" % FIRST, node.dump()):
        return
    mkey = prefix + "checkpoints/%s/MANIFEST.json" % FIRST
    manifest = sl.s3_get(mkey)
    first_keys = sl.s3_keys(prefix + "checkpoints/%s/" % FIRST)
    proxy.rate = rate
    if not c.check(node.wait_step(at) is not None,
                   "node0: reached step %d" % at, node.dump()):
        return
    node.notice(deadline=DEADLINE)
    rc = node.finish(timeout=60)
    c.check(rc == 75, "node0: spotd exits 75 after the notice",
            "rc=%s\n%s" % (rc, node.dump()))
    saved = e2e.check_no_step_lost(c, node, "node0")
    name = saved[0] if saved else "?"
    c.check(node.d.err.matching(r"uploading checkpoint %s" % name),
            "node0: spotd started uploading %s over the slow link" % name)
    c.check(node.d.err.matching(r"the final upload could not finish before "
                                r"the deadline: the last committed "
                                r"checkpoint \(%s\) is kept" % FIRST),
            "node0: spotd gave up the upload at the deadline, keeping %s"
            % FIRST, node.dump())
    c.check(name not in sl.committed(prefix) and
            not node.d.err.matching(r"committed checkpoint name=%s " % name),
            "node0: %s was not committed (no manifest)" % name)
    c.check(sl.latest(prefix) == FIRST, "LATEST is still %s" % FIRST,
            "LATEST=%r" % sl.latest(prefix))
    c.check(sl.s3_get(mkey) == manifest and
            sl.s3_keys(prefix + "checkpoints/%s/" % FIRST) == first_keys,
            "%s is intact: same manifest bytes, same objects" % FIRST)
    c.check(not sl.s3_uploads(prefix), "no multipart upload left behind",
            repr(sl.s3_uploads(prefix)))
    hooks = node.relaunches()
    c.check(len(hooks) == 1 and hooks[0].get("SPOTD_CHECKPOINT") == FIRST,
            "relaunched with the previous checkpoint %s" % FIRST, repr(hooks))

    # 3. A fresh node (node 0's folder deleted) at full speed.
    shutil.rmtree(node.ckpt_dir)
    node1 = e2e.Node(tmp, "node1", store, job, train_args)
    nodes.append(node1)
    got = node1.resumed(timeout=90)
    c.check(got == (FIRST, SAVE_EVERY), "node1 resumed from %s" % FIRST,
            "got %r\n%s" % (got, node1.dump()))
    rc = node1.finish(timeout=120)
    c.check(rc == 0, "node1 finishes, spotd exits 0",
            "rc=%s\n%s" % (rc, node1.dump()))
    e2e.check_steps(c, [(node, 0), (node1, SAVE_EVERY)], ref_losses, STEPS)
    final = "step-%06d" % STEPS
    why = e2e.same_checkpoint(os.path.join(node1.ckpt_dir, final),
                              os.path.join(ref, final))
    c.check(why is None, "final %s byte-identical to the uninterrupted run's"
            % final, why or "")
    dest = os.path.join(tmp, "from-store")
    cp = e2e.restore_from_store("%s/%s" % (store, job), dest)
    why = e2e.same_checkpoint(dest, os.path.join(ref, final)) \
        if cp.returncode == 0 else cp.stderr
    c.check(why is None, "the store's LATEST (%s) is byte-identical too"
            % final, why or "")


if __name__ == "__main__":
    main()
