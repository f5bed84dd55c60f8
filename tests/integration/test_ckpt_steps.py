"""The step travels with the checkpoint, against the real Ceph: progress
never goes backwards whatever the checkpoint names, and a finished job
stays finished.

1. Names without a step (checkpoint-N, as the Hugging Face Trainer
   writes them), saved through the Python helper, whose marker states
   the step: `spotd run --keep 1`, two `spotctl checkpoint --wait`, a copy
   of the older folder kept aside, SIGTERM (a final checkpoint). The older
   folder is put back, as a crash leaves it, and spotd starts again on the
   same folder: it restores the newest, does not upload the leftover
   (a line says why), LATEST stays, the restored folder stays; its final
   checkpoint then moves LATEST forward, and a third run resumes there.
2. A finished job started again (the project's own example trainer, 5
   steps, three times, each in a new folder): every start exits 0; the
   final checkpoint saved again holds the same step, so it is no new
   commit: LATEST stays step-000005 and one line says so.
3. A commit LATEST's step rule refuses (`spotctl push --step` of an older
   step) leaves no MANIFEST.json behind; nor does the upload journal: a
   spotd killed just before it commits checkpoint-N (the fault point
   before-commit) leaves its journal, another writer commits
   checkpoint-228 meanwhile, and the spotd started again on that node
   resumes the journaled upload: refused before its manifest, LATEST stays
   checkpoint-228 and the trainer resumes from it.
4. spotd.hf.SpotdCallback.on_save passes the Trainer's global step to the
   marker (a stand-in TrainerCallback base: transformers is not needed).
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

TRAINER = r"""
import json, os, sys, time
import spotd
step = 0
r = spotd.resume_dir()
if r:
    with open(os.path.join(r, "step")) as f:
        step = int(f.read())
log = open(os.environ["T_LOG"], "a", buffering=1)
log.write(json.dumps({"ev": "start", "step": step,
                      "resume": os.path.basename(r) if r else None}) + "\n")
while True:
    time.sleep(0.05)
    step += 1
    if spotd.checkpoint_requested():
        # the Hugging Face Trainer's names: no step spotd could read
        with spotd.checkpoint(name="checkpoint-%d" % step, step=step) as ck:
            with ck.open("step") as f:
                f.write(b"%d" % step)
            if os.environ.get("T_BIG"):  # multipart: a journaled upload
                with ck.open("data.bin") as f:
                    f.write(os.urandom(20 << 20))
        log.write(json.dumps({"ev": "checkpoint", "step": step,
                              "name": ck.name}) + "\n")
"""


def hf_names(c, wd, store, job, prefix):
    node = os.path.join(wd, "node")
    script = os.path.join(wd, "trainer.py")
    with open(script, "w") as f:
        f.write(TRAINER)
    env = {"PYTHONPATH": sl.srcdir_path("python"),
           "T_LOG": os.path.join(node, "trainer.log")}

    def start():
        return sl.Daemon(node, store, job, cmd=[sl.PY3, script],
                         args=["--keep", 1], env=env)

    d1 = start()
    c.check(d1.wait_event("start", 60) is not None, "first: trainer started")
    names = []
    for _ in range(2):
        cp = d1.spotctl("checkpoint", "--wait", timeout=120)
        c.check(cp.returncode == 0, "first: spotctl checkpoint --wait",
                cp.stdout + cp.stderr)
        names.append(sl.latest(prefix))
        if len(names) == 1:  # the older one, kept aside
            shutil.copytree(os.path.join(d1.ckpt_dir, names[0]),
                            os.path.join(wd, "aside"))
    d1.send(signal.SIGTERM)
    rc = d1.wait_exit(120)
    final1 = sl.latest(prefix)
    c.check(rc == 0 and final1 not in names, "first: SIGTERM, a final "
            "checkpoint committed, exit 0", "rc=%s latest=%r %r" % (
                rc, final1, names))
    old = names[0]
    old_dir = os.path.join(d1.ckpt_dir, old)
    if os.path.isdir(old_dir):
        shutil.rmtree(old_dir)
    shutil.copytree(os.path.join(wd, "aside"), old_dir)
    with open(os.path.join(old_dir, "SPOTD_COMPLETE")) as f:
        marker = f.read()
    c.check(marker == "step=%s\n" % old.split("-")[1],
            "the helper's marker states the step", repr(marker))

    d2 = start()
    st = d2.wait_event("start", 90)
    c.check(st is not None and st["resume"] == final1,
            "second: the trainer resumed from %s" % final1, repr(st))
    i, line = d2.err.wait(r"not uploading checkpoint %s|committed checkpoint "
                          r"name=%s" % (old, old), 60)
    c.check(line is not None and "not uploading checkpoint %s (step %s): "
            "%s (step %s) is newer" % (old, old.split("-")[1], final1,
                                       final1.split("-")[1]) in line,
            "second: the leftover %s is not uploaded, a line says why" % old,
            repr(line))
    c.check(sl.latest(prefix) == final1,
            "second: LATEST still names %s" % final1, repr(sl.latest(prefix)))
    c.check(os.path.isdir(os.path.join(d2.ckpt_dir, final1)) and
            os.path.isdir(old_dir),
            "second: the restored folder and the leftover are on disk",
            repr(sorted(os.listdir(d2.ckpt_dir))))
    d2.send(signal.SIGTERM)
    rc = d2.wait_exit(120)
    final2 = sl.latest(prefix)
    c.check(rc == 0 and final2 not in (final1, old) and
            int(final2.split("-")[1]) > int(final1.split("-")[1]),
            "second: its final checkpoint moves LATEST forward",
            "rc=%s latest=%r" % (rc, final2))
    c.check("committed checkpoint name=%s " % old not in d2.log() and
            "removing local checkpoint %s (committed %s is newer)" % (
                final1, old) not in d2.log(),
            "second: the leftover was never committed over the restored one")

    d3 = start()
    st = d3.wait_event("start", 90)
    c.check(st is not None and st["resume"] == final2 and
            st["step"] == int(final2.split("-")[1]),
            "third: the trainer resumed from %s" % final2, repr(st))
    d3.send(signal.SIGTERM)
    d3.wait_exit(120)


def finished_job(c, wd):
    url, prefix = sl.unique_job("steps-finished")
    store, job = url.rsplit("/", 1)
    example = sl.srcdir_path("examples", "pytorch", "train.py")
    env = dict(os.environ, PYTHONPATH=sl.srcdir_path("python"),
               CUDA_VISIBLE_DEVICES="")
    try:
        for i in (1, 2, 3):
            n = os.path.join(wd, "n%d" % i)
            os.makedirs(n)
            cp = subprocess.run(
                [sl.spotd_exe(), "run", "--job", job, "--store", store,
                 "--provider", "none", "--", sl.PY3, example,
                 "--model-size", "small", "--steps", "5"],
                cwd=n, env=env, capture_output=True, text=True, timeout=300)
            c.check(cp.returncode == 0 and sl.latest(prefix) == "step-000005",
                    "start %d of the finished job: exit 0, LATEST "
                    "step-000005" % i, "rc=%d latest=%r\n%s" % (
                        cp.returncode, sl.latest(prefix), cp.stderr[-3000:]))
            if i > 1:
                left = sorted(os.listdir(os.path.join(n, "spotd-ckpt")))
                c.check([x for x in left if x.startswith("step-")] ==
                        ["step-000005"], "start %d: the local copy saved "
                        "again is dropped" % i, repr(left))
                c.check("holds step 5, as the committed step-000005 does: "
                        "not a new commit; its local copy is dropped" in cp.stderr,
                        "start %d: the final checkpoint saved again is no "
                        "new commit, one line says so" % i, cp.stderr[-2000:])
    finally:
        sl.s3_cleanup(prefix)


def push_refused(c, wd):
    url, prefix = sl.unique_job("steps-push")
    src = os.path.join(wd, "src")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "w.bin"), "wb") as f:
        f.write(b"weights" * 100)
    try:
        cp = sl.spotctl("push", src, url, "--name", "checkpoint-228",
                        "--step", "228")
        c.check(cp.returncode == 0, "push checkpoint-228 --step 228",
                cp.stderr)
        cp = sl.spotctl("push", src, url, "--name", "checkpoint-69",
                        "--step", "69")
        c.check(cp.returncode != 0 and sl.latest(prefix) == "checkpoint-228",
                "push of the older step 69: refused, LATEST stays",
                "rc=%d latest=%r %s" % (cp.returncode, sl.latest(prefix),
                                        cp.stderr))
        keys = [k for k in sl.s3_keys(prefix) if "checkpoint-69/" in k and
                k.endswith("MANIFEST.json")]
        c.check(keys == [], "the refused commit wrote no manifest", repr(keys))
    finally:
        sl.s3_cleanup(prefix)


def journal(c, wd):
    store, job, prefix = sl.daemon_job("steps-journal")
    node = os.path.join(wd, "jnode")
    script = os.path.join(wd, "trainer.py")
    with open(script, "w") as f:
        f.write(TRAINER)
    env = {"PYTHONPATH": sl.srcdir_path("python"),
           "T_LOG": os.path.join(node, "trainer.log"), "T_BIG": "1"}
    try:
        da = sl.Daemon(node, store, job, cmd=[sl.PY3, script],
                       env=dict(env, SPOTD_FAULT="before-commit"))
        c.check(da.wait_event("start", 60) is not None, "journal: trainer "
                "started")
        da.spotctl("checkpoint")
        line = da.wait_log(r"fault point before-commit: killing", 120)
        c.check(line is not None, "journal: spotd killed before its commit")
        da.wait_exit(60)
        ev = da.wait_event("checkpoint", 10)
        name = ev["name"] if ev else "?"
        src = os.path.join(wd, "newer")
        os.makedirs(src)
        with open(os.path.join(src, "step"), "w") as f:
            f.write("228")
        cp = sl.spotctl("push", src, "%s/%s" % (store, job), "--name",
                        "checkpoint-228", "--step", "228")
        c.check(cp.returncode == 0 and sl.latest(prefix) == "checkpoint-228",
                "journal: another writer commits checkpoint-228", cp.stderr)
        db = sl.Daemon(node, store, job, cmd=[sl.PY3, script], env=env)
        st = db.wait_event("start", 120)
        c.check(db.wait_log(r"resuming that upload", 0) is not None and
                st is not None and st["resume"] == "checkpoint-228" and
                st["step"] == 228, "journal: the journaled %s is resumed, "
                "refused; the trainer resumes from checkpoint-228" % name,
                repr(st))
        keys = [k for k in sl.s3_keys(prefix) if
                k.endswith("/%s/MANIFEST.json" % name)]
        c.check(keys == [] and sl.latest(prefix) == "checkpoint-228",
                "journal: no manifest of %s, LATEST stays" % name,
                "%r latest=%r" % (keys, sl.latest(prefix)))
        db.send(signal.SIGTERM)
        db.wait_exit(120)
    finally:
        sl.s3_cleanup(prefix)


def hf_callback(c, wd):
    """on_save with a stand-in transformers: the marker states the step."""
    sys.path.insert(0, sl.srcdir_path("python"))
    fake = types.ModuleType("transformers")

    class TrainerCallback:
        pass

    fake.TrainerCallback = TrainerCallback
    sys.modules.setdefault("transformers", fake)
    os.environ.pop("SPOTD_SOCKET", None)
    import spotd.hf
    out = os.path.join(wd, "hf")
    folder = os.path.join(out, "checkpoint-94")
    os.makedirs(folder)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(b"w" * 64)
    cb = spotd.hf.SpotdCallback(report_steps=False)
    args = types.SimpleNamespace(output_dir=out)
    state = types.SimpleNamespace(global_step=94, is_local_process_zero=True,
                                  is_world_process_zero=True)
    cb.on_save(args, state, types.SimpleNamespace())
    with open(os.path.join(folder, "SPOTD_COMPLETE")) as f:
        marker = f.read()
    c.check(marker == "step=94\n", "hf: on_save's marker states step 94",
            repr(marker))


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("steps")
    with sl.cleaned_up(prefix):
        with tempfile.TemporaryDirectory(prefix="spotd-steps-") as wd:
            hf_callback(c, wd)
            push_refused(c, wd)
            journal(c, wd)
            hf_names(c, wd, store, job, prefix)
            finished_job(c, wd)
    c.finish()


if __name__ == "__main__":
    main()
