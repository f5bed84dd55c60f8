"""Multi-node jobs: two spotd processes on one machine play two nodes of
one job (--rank 0/1 --nranks 2, the same --job and --store, their own
checkpoint folders and sockets), each supervising fake_trainer.py.

1. Both trainers are asked to checkpoint (`spotctl checkpoint --wait` on
   each socket): each rank uploads its files under rank-K/ and writes its
   marker ranks/rank-K.json; rank 0 merges the markers into one
   MANIFEST.json (the commit) and LATEST; rank 1's wait returns once that
   commit exists.
2. Both restart: each restores the whole checkpoint and its trainer gets
   SPOTD_RESUME_DIR=CKPT_DIR/NAME/rank-K holding its own files, plus
   SPOTD_RANK and SPOTD_NRANKS.
3. Rank 0 alone (rank 1 never shows up): its push fails after --rank-wait
   and nothing is committed.
Also: a rank not below nranks is refused at start."""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

STEP_SLEEP = 3.0  # both trainers checkpoint in the same step: same name


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def start(wd, store, job, rank, trainer, extra=()):
    return sl.Daemon(os.path.join(wd, "node%d" % rank), store, job,
                     trainer=trainer,
                     args=["--rank", rank, "--nranks", 2] + list(extra),
                     env={"AWS_EC2_METADATA_DISABLED": "true"})


def checkpoint_wait(d):
    return subprocess.Popen(
        [sl.spotctl_exe(), "checkpoint", "--socket", d.socket, "--wait",
         "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def main():
    sl.daemon_env()
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("multinode")
    ck = prefix + "checkpoints/"
    trainer = ["--step-sleep", STEP_SLEEP, "--exit-at", 2]
    with sl.cleaned_up(prefix):
        with tempfile.TemporaryDirectory(prefix="spotd-multinode-") as wd:
            # 0: a rank must be below nranks
            cp = sl.run([sl.spotd_exe(), "run", "--job", job, "--store", store,
                         "--provider", "none", "--rank", "2", "--nranks", "2",
                         "--ckpt-dir", os.path.join(wd, "bad"), "--socket",
                         os.path.join(wd, "bad.sock"), "--", "true"],
                        timeout=20)
            c.check(cp.returncode != 0 and "not below nranks" in cp.stderr,
                    "--rank 2 --nranks 2 is refused", cp.stderr)

            # 1: both ranks checkpoint; rank 0 commits the merged manifest
            d0 = start(wd, store, job, 0, trainer)
            d1 = start(wd, store, job, 1, trainer)
            s0 = d0.wait_event("start", 20)
            s1 = d1.wait_event("start", 20)
            c.check(s0 is not None and s1 is not None, "both trainers started")
            w0, w1 = checkpoint_wait(d0), checkpoint_wait(d1)
            out0, err0 = w0.communicate(timeout=90)
            out1, err1 = w1.communicate(timeout=90)
            c.check(w0.returncode == 0, "rank 0: checkpoint --wait committed",
                    out0 + err0)
            c.check(w1.returncode == 0, "rank 1: checkpoint --wait committed "
                    "(after rank 0's commit)", out1 + err1)
            name = "step-000001"
            c.check(d0.wait_exit(60) == 0 and d1.wait_exit(60) == 0,
                    "both spotd exit 0 when their trainers finish")
            c.check(s0 is not None and s0["env"].get("SPOTD_RANK") == "0" and
                    s0["env"].get("SPOTD_NRANKS") == "2" and s1 is not None
                    and s1["env"].get("SPOTD_RANK") == "1",
                    "SPOTD_RANK and SPOTD_NRANKS reach the trainers",
                    repr((s0 or {}).get("env")))
            c.check(sl.committed(prefix) == [name],
                    "one committed checkpoint, %s" % name,
                    repr(sl.committed(prefix)))
            c.check(sl.latest(prefix) == name, "LATEST names it",
                    repr(sl.latest(prefix)))
            keys = sl.s3_keys(ck + name + "/")
            c.check(ck + name + "/ranks/rank-0.json" in keys and
                    ck + name + "/ranks/rank-1.json" in keys,
                    "both rank markers exist", repr(keys))
            try:
                m = json.loads(sl.s3_get(ck + name + "/MANIFEST.json"))
                paths = sorted(f["path"] for f in m["files"])
                fkeys = sorted(f.get("key", "") for f in m["files"])
            except Exception as e:  # noqa: BLE001
                paths, fkeys = [repr(e)], []
            want = ["rank-0/data.bin", "rank-0/step", "rank-1/data.bin",
                    "rank-1/step"]
            c.check(paths == want, "MANIFEST.json lists both ranks' files",
                    repr(paths))
            # rank-K/<attempt>/<path>.zst (store.h: per-attempt keys)
            c.check(len(fkeys) == len(want) and
                    all(k.startswith(p.split("/")[0] + "/attempt-") and
                        k.endswith("/" + p.split("/", 1)[1] + ".zst")
                        for k, p in zip(fkeys, want)) and
                    all(ck + name + "/" + k in keys for k in fkeys),
                    "each file's object is under its rank's folder",
                    repr(fkeys))
            own = {}
            for r, d in ((0, d0), (1, d1)):
                src = os.path.join(d.ckpt_dir, name)
                own[r] = (sha(os.path.join(src, "data.bin")),
                          open(os.path.join(src, "step")).read())

            # 2: both restart and resume from their own rank's folder
            trainer2 = ["--step-sleep", 0.1, "--exit-at", 2]
            r0 = start(wd, store, job, 0, trainer2)
            r1 = start(wd, store, job, 1, trainer2)
            c.check(r0.wait_exit(60) == 0 and r1.wait_exit(60) == 0,
                    "restart: both spotd exit 0")
            for r, d in ((0, r0), (1, r1)):
                st = d.events("start")
                env = st[0]["env"] if st else {}
                want_dir = os.path.join(d.ckpt_dir, name, "rank-%d" % r)
                c.check(env.get("SPOTD_RESUME_DIR") == want_dir,
                        "restart: rank %d gets SPOTD_RESUME_DIR=%s" % (r, want_dir),
                        repr(env))
                c.check(st and st[0]["step"] == 1,
                        "restart: rank %d resumed at step 1" % r, repr(st))
                got = (sha(os.path.join(want_dir, "data.bin")),
                       open(os.path.join(want_dir, "step")).read())
                c.check(got == own[r],
                        "restart: rank %d's folder holds its own files" % r)

            # 3: rank 1 never shows up: rank 0 gives up, nothing committed
            lone = start(wd, store, job, 0,
                         ["--step-sleep", STEP_SLEEP, "--exit-at", 3],
                         extra=["--rank-wait", "2"])
            c.check(lone.wait_event("start", 20) is not None,
                    "alone: rank 0's trainer started")
            t = time.time()
            w = checkpoint_wait(lone)
            out, err = w.communicate(timeout=90)
            c.check(w.returncode != 0, "alone: checkpoint --wait fails",
                    out + err)
            c.check(time.time() - t < 30, "alone: within the rank wait",
                    "%.1f s" % (time.time() - t))
            line = lone.wait_log(r"did not write their part of step-000002",
                                 10)
            c.check(line is not None and "rank(s) 1" in line,
                    "alone: the log says rank 1 did not write its part", line)
            lone.wait_exit(60)
            c.check(sl.committed(prefix) == [name],
                    "alone: nothing more committed", repr(sl.committed(prefix)))
            c.check(sl.latest(prefix) == name, "alone: LATEST unchanged",
                    repr(sl.latest(prefix)))
            keys = sl.s3_keys(ck + "step-000002/")
            c.check(ck + "step-000002/ranks/rank-0.json" in keys and
                    ck + "step-000002/ranks/rank-1.json" not in keys,
                    "alone: only rank 0's marker", repr(keys))
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
