"""spotd.dcp with torch.distributed.checkpoint, or torch 1.13's prototype
of it (torch.distributed._shard.checkpoint), under `spotd run --
torchrun` with 2 gloo workers: a spot notice, the DCP folder committed to
the store (exit 75), a fresh node restores it, spotd.dcp.load() loads it
in place on both ranks; every later step (each rank's batch and loss) and
the final weights equal an uninterrupted run's (fwlib.run). Node 0
saves once on its own with the synchronous spotd.dcp.save() (step 2:
rank 0 sees DCP's files and the marker in its folder on return) and
answers the notice with a staged save (spotd.dcp.StagedSaver): it
trains on while the background persist runs (its writer writes only
once a step has changed the state in place), and node 1 resumes the
state as it was at stage() time (its hash), bit-identically.

Staged saves on 2 ranks without spotd: the folder holds the state at
stage() time (a plain tensor and a ShardedTensor's rows per rank), a
write failing on one rank fails the save on both (wait() and the next
stage() raise, no marker), a state that does not fit one rank's limit
is saved synchronously on both, a copy failing on one rank fails
stage() on both, and kill -9 of a rank held in its persist
makes the other raise instead of hanging, leaving no marker.

Then two ranks whose state dicts differ (a per-rank entry each): with
DCP (torch 2) each rank's shard file, DCP's metadata and one
SPOTD_COMPLETE land in one folder and spotd.dcp.load() restores every
rank's tensor; with torch 1.13's prototype, which would save rank 0's
entries only, spotd.dcp.save() refuses on both ranks with a clear error.

With neither importable (Debian's torch 1.13 under Python 3.11 without
the frameworks archive's import fix) it checks that spotd.dcp says so
clearly, then skips (77); with $SPOTD_TEST_PYTHONUSERBASE set (tools/test
with the frameworks archive) that is a failure. Skips without the test
S3 server."""
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
                       "fw_dcp_trainer.py")
STEPS = 20

WORKER = r"""
import os, sys
import spotd, spotd.dcp
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
# Per-rank entries make per-rank shard files.
state = {"w%d" % r: torch.full((64,), float(r + 1)), "step": 7}
if sys.argv[1] == "save":
    try:
        path = spotd.dcp.save(state, step=7)
        print("saved", os.path.basename(path), flush=True)
    except RuntimeError as e:
        print("refused:", e, flush=True)
else:
    into = {"w%d" % r: torch.zeros(64), "step": 0}
    got = spotd.dcp.load(into)
    ok = bool(torch.equal(into["w%d" % r], state["w%d" % r]))
    print("loaded", os.path.basename(got), ok, flush=True)
dist.barrier()
dist.destroy_process_group()
os._exit(0)
"""


# Staged saves (spotd.dcp.StagedSaver), 2 ranks, no spotd: a plain
# tensor and a ShardedTensor (each rank its rows: its own shard file);
# the storage writer of step-000001 writes only once the trainer has
# changed the state in place, fails on rank 1 when told, and holds rank 1
# (files written, no marker) while the file T_HOLD exists; rank 1's
# second saver has no room (limit 0), and a meta tensor fails its copy.
STAGED_WORKER = r"""
import os, sys, time
import spotd, spotd.dcp
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import (
    Shard, ShardMetadata, init_from_local_shards)
dist.init_process_group("gloo")
r = dist.get_rank()
hold = os.environ["T_HOLD"]
fail = []
dcp = spotd.dcp._dcp()


class Writer(dcp.FileSystemWriter):
    def write_data(self, plan, planner):
        if str(self.path).endswith("step-000001"):  # after the change
            end = time.monotonic() + 60
            while state["w"][0] != 100 and time.monotonic() < end:
                time.sleep(0.01)
            print("changed before the write", bool(state["w"][0] == 100),
                  flush=True)
        fut = super().write_data(plan, planner)
        if fail and r == 1:
            raise OSError(28, "No space left on device (test)")
        if r == 1 and os.path.exists(hold):
            print("holding", os.getpid(), flush=True)
            while os.path.exists(hold):
                time.sleep(0.05)
        return fut


def rows(v):
    md = ShardMetadata(shard_offsets=[4 * r, 0], shard_sizes=[4, 8],
                       placement="rank:%d/cpu" % r)
    return init_from_local_shards([Shard(torch.full((4, 8), v), md)], 8, 8)


def raised(what, fn):
    try:
        fn()
        print(what, "returned", flush=True)
    except RuntimeError as e:
        print(what, "raised:", str(e).splitlines()[0], flush=True)


state = {"w": torch.arange(16.0), "sh": rows(1.0 + r), "step": 1}
saver = spotd.dcp.StagedSaver(storage_writer=Writer)
h = saver.stage(state, step=1)
state["w"].add_(100)  # in place, during the persist
state["sh"].local_shards()[0].tensor.add_(100)
h.wait()
into = {"w": torch.zeros(16), "sh": rows(0.0), "step": 0}
spotd.dcp.load(into, h.path)
print("step1", bool(torch.equal(into["w"], torch.arange(16.0))),
      bool(torch.equal(into["sh"].local_shards()[0].tensor,
                       torch.full((4, 8), 1.0 + r))), into["step"],
      flush=True)
fail.append(1)
h = saver.stage(state, step=2)
raised("wait2", h.wait)
raised("stage3", lambda: saver.stage(state, step=3))
fail.clear()
small = spotd.dcp.StagedSaver(limit=0 if r == 1 else None,
                              storage_writer=Writer)
h = small.stage(state, name="fit")  # rank 1's state does not fit
print("fit", h.staged, h.done(), os.path.exists(os.path.join(
    h.path, "SPOTD_COMPLETE")) if r == 0 else "", flush=True)
# rank 1's copy fails (a meta tensor has no data to copy)
bad = torch.empty(4, device="meta") if r == 1 else torch.zeros(4)
raised("copy", lambda: saver.stage(dict(state, m=bad), name="copy"))
if r == 0:
    open(hold, "w").close()
dist.barrier()
h = saver.stage(state, step=4)
raised("wait4", h.wait)
os._exit(0)
"""


def ranks(script, arg, env, timeout=300):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for r in (0, 1):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                 LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=port)
        procs.append(subprocess.Popen([sl.PY3, script, arg], env=e, text=True,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    if arg == "staged":  # kill -9 of rank 1 held in its persist
        got = []
        for line in procs[1].stdout:
            got.append(line)
            if line.startswith("holding"):
                procs[1].kill()
                break
        procs[1].held = "".join(got)
        try:
            os.unlink(env["T_HOLD"])
        except FileNotFoundError:
            pass
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outs.append((p.returncode, getattr(p, "held", "") + out))
    return outs


def main():
    fwlib.skip_if_ran()
    sl.daemon_env()
    env = dict(os.environ, PYTHONPATH=sl.srcdir_path("python"))
    for k in ("SPOTD_SOCKET", "SPOTD_RESUME_DIR", "SPOTD_REQUEST_FILE"):
        env.pop(k, None)
    given = os.environ.get(fwlib.USERBASE_VAR)
    if given:
        env["PYTHONUSERBASE"] = given
    cp = subprocess.run([sl.PY3, "-c", "import spotd.dcp\n"
                         "print(spotd.dcp.available())"],
                        capture_output=True, text=True, env=env)
    if cp.stdout.strip() != "True":
        probe = subprocess.run(
            [sl.PY3, "-c", "import spotd.dcp\n"
             "try:\n spotd.dcp.save({}, step=1)\n"
             "except RuntimeError as e:\n print(e)"],
            capture_output=True, text=True, env=env)
        msg = probe.stdout.strip()
        if "needs torch.distributed.checkpoint" not in msg or given:
            print("FAIL spotd.dcp is not usable (%s=%s): %s\n     %s" %
                  (fwlib.USERBASE_VAR, given, msg, probe.stderr[-2000:]))
            sys.exit(1)
        sl.skip("neither torch.distributed.checkpoint nor torch 1.13's "
                "prototype imports (spotd.dcp says: %s)" % msg)
    proto = subprocess.run([sl.PY3, "-c", "import torch.distributed."
                            "checkpoint"], capture_output=True,
                           env=env).returncode != 0
    c = sl.Checks()
    fw = fwlib.fw_env(["torch"], "DCP")
    t = threading.Thread(target=preempt_resume, args=(c, fw, proto))
    t.start()
    per_rank(c, env, proto)
    t.join()
    sl.kill_started()
    c.finish()


def torchrun(wd, args):
    os.makedirs(wd, exist_ok=True)
    return ["/usr/bin/torchrun"] + sl.torchrun_one_node() + [
        "--nproc_per_node", "2", "--redirects", "2", "--tee", "2",
        "--log_dir", wd, TRAINER] + args


def preempt_resume(c, env, proto):
    """One run for both saves: node 0 saves with the synchronous
    spotd.dcp.save() after step 2 (its own save, committed by spotd),
    the notice's checkpoint is staged, node 1 resumes from that one."""
    what = "DCP%s, torchrun, 2 gloo workers" % (
        " (torch 1.13's prototype)" if proto else "")
    with tempfile.TemporaryDirectory(prefix="spotd-dcp-tr-") as tmp:
        args = ["--steps", str(STEPS), "--staged"]

        def folder(c, path):
            files = sorted(os.listdir(path)) if os.path.isdir(path) else []
            c.check("SPOTD_COMPLETE" in files and ".metadata" in files and
                    any(f.endswith(".distcp") for f in files),
                    "%s: the committed (staged) folder holds DCP's files and "
                    "the marker" % what, repr(files))

        got = {}

        def node0(c, name, lines):
            got["saved"] = fwlib.step_of(name)
            got["lines"] = lines
            m = re.search(r"saved step-000002 files (.*)", "\n".join(lines))
            files = m.group(1).split() if m else []
            c.check("SPOTD_COMPLETE" in files and ".metadata" in files and
                    any(f.endswith(".distcp") for f in files),
                    "%s: the synchronous spotd.dcp.save() after step 2 "
                    "wrote step-000002 with DCP's files and the marker" %
                    what, repr(m and m.group(0)))

        lines1 = fwlib.run(c, what, torchrun(
            os.path.join(tmp, "t0"), args + ["--persist-late", "--sync-at",
                                             "2", "--sleep", "0.3"]),
            env, STEPS, 2, notice_at=5,
            resume_cmd=torchrun(os.path.join(tmp, "t1"), args),
            ref_cmd=torchrun(os.path.join(tmp, "t2"), args),
            folder_check=folder, node0_check=node0)
        if lines1 is not None:
            staged_content(c, what, got.get("saved"), got.get("lines", []),
                           lines1)


def staged_content(c, what, n, lines0, lines1):
    """The resumed state is node 0's state at stage() time, which the
    steps that ran during the persist had changed in place."""
    text0, text1 = "\n".join(lines0), "\n".join(lines1)
    st = re.search(r"staged step %d rank 0 hash (\w+)" % n, text0)
    nxt = re.search(r"state step %d rank 0 hash (\w+)" % (n + 1), text0)
    per = [int(m) for m in re.findall(r"writing step %d rank \d at step "
                                      r"(\d+)" % n, text0)]
    res = re.search(r"resumed from \S+ at step %d hash (\w+)" % n, text1)
    c.check(st and nxt and len(per) == 2 and min(per) > n and
            nxt.group(1) != st.group(1),
            "%s: node 0 trained on during the persist (both ranks wrote "
            "step-%06d at steps %s), changing the state in place" %
            (what, n or 0, per), text0[-3000:])
    c.check(st and res and res.group(1) == st.group(1),
            "%s: node 1 resumed the state as it was at stage() time" % what,
            "staged %s, resumed %s" % (st and st.group(1),
                                       res and res.group(1)))


def staged_ranks(c, env):
    """spotd.dcp.StagedSaver on 2 ranks without spotd: the snapshot is a
    copy, a failure on one rank fails the save on both, kill -9 of a
    rank during the persist makes the other raise (not hang); no marker
    on a save that failed."""
    with tempfile.TemporaryDirectory(prefix="spotd-dcp-staged-") as tmp:
        root = os.path.join(tmp, "ckpt")
        script = os.path.join(tmp, "staged.py")
        with open(script, "w") as f:
            f.write(STAGED_WORKER)
        env = dict(env, SPOTD_CKPT_DIR=root,
                   T_HOLD=os.path.join(tmp, "hold"))
        outs = ranks(script, "staged", env, timeout=180)
        detail = "\n".join("rc=%s\n%s" % o for o in outs)
        out0, out1 = outs[0][1], outs[1][1]

        def files(name):
            p = os.path.join(root, name)
            return sorted(os.listdir(p)) if os.path.isdir(p) else None
        c.check("step1 True True 1" in out0 and "step1 True True 1" in out1
                and "changed before the write False" not in out0 + out1 and
                "changed before the write True" in out0 and
                "SPOTD_COMPLETE" in (files("step-000001") or []),
                "staged DCP: the committed folder holds the state at "
                "stage() time (plain tensor and each rank's ShardedTensor "
                "rows), though both changed in place during the persist",
                detail)
        c.check(all("wait2 raised: staged checkpoint step-000002 failed"
                    in o and "No space left on device (test)" in o and
                    "stage3 raised: staged checkpoint step-000002 failed"
                    in o for o in (out0, out1)) and
                "SPOTD_COMPLETE" not in (files("step-000002") or []),
                "staged DCP: a write failing on rank 1 fails the save on "
                "both ranks (wait() and the next stage() raise), no marker",
                detail)
        c.check("fit False True True" in out0 and "fit False True" in out1
                and "does not fit the staging limit" in out1,
                "staged DCP: a state that does not fit one rank's limit is "
                "saved synchronously on every rank, marked on return",
                detail)
        c.check("copy raised: staged checkpoint copy not saved (no "
                "marker): the snapshot failed on another rank" in out0 and
                "copy raised: staged checkpoint copy not saved" in out1 and
                files("copy") == [],
                "staged DCP: a copy failing on rank 1 fails stage() on both "
                "ranks, nothing written, no marker", detail + "\ncopy: %r" %
                files("copy"))
        c.check(outs[1][0] == -9 and "holding" in out1 and outs[0][0] == 0
                and "wait4 raised: staged checkpoint step-000004 failed"
                in out0 and files("step-000004") is not None and
                "SPOTD_COMPLETE" not in files("step-000004") and
                "SPOTD_COMPLETE" in (files("step-000001") or []),
                "staged DCP: kill -9 of rank 1 during the persist: rank 0 "
                "raises (no hang), step-000004 has no marker, step-000001 "
                "keeps its", detail + "\nstep-000004: %r" %
                files("step-000004"))


def per_rank(c, env, proto):
    staged_ranks(c, env)
    with tempfile.TemporaryDirectory(prefix="spotd-dcp-") as tmp:
        root = os.path.join(tmp, "ckpt")
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        env = dict(env, SPOTD_CKPT_DIR=root)
        outs = ranks(script, "save", env)
        detail = "\n".join("rc=%d\n%s" % o for o in outs)
        if proto:
            c.check(all(rc == 0 and "refused: spotd.dcp: torch 1.13's "
                        "prototype DCP saves plain tensors from rank 0 "
                        "only" in out for rc, out in outs) and
                    not os.path.exists(root),
                    "torch 1.13's prototype: per-rank entries are refused "
                    "on both ranks with a clear error, nothing written",
                    detail)
            return
        c.check(all(rc == 0 and "saved step-000007" in out
                    for rc, out in outs),
                "both ranks saved step-000007 with spotd.dcp.save", detail)
        folder = os.path.join(root, "step-000007")
        files = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        shards = [f for f in files if f.endswith(".distcp")]
        c.check("SPOTD_COMPLETE" in files and ".metadata" in files and
                len(shards) >= 2,
                "one folder: each rank's shard file, DCP's metadata, one "
                "marker", repr(files))
        c.check(sorted(os.listdir(root)) == ["step-000007"],
                "no other folder", repr(os.listdir(root)))
        env["SPOTD_RESUME_DIR"] = folder
        outs = ranks(script, "load", env)
        detail = "\n".join("rc=%d\n%s" % o for o in outs)
        c.check(all(rc == 0 and "loaded step-000007 True" in out
                    for rc, out in outs),
                "spotd.dcp.load() from spotd.resume_dir() restores every "
                "rank's tensor", detail)


if __name__ == "__main__":
    main()
