"""spotd.dcp with torch.distributed.checkpoint, or torch 1.13's prototype
of it (torch.distributed._shard.checkpoint), under `spotd run --
torchrun` with 2 gloo workers: a spot notice, the DCP folder committed to
the store (exit 75), a fresh node restores it, spotd.dcp.load() loads it
in place on both ranks; every later step (each rank's batch and loss) and
the final weights equal an uninterrupted run's (fwlib.run).

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
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outs.append((p.returncode, out))
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
    what = "DCP%s, torchrun, 2 gloo workers" % (
        " (torch 1.13's prototype)" if proto else "")
    with tempfile.TemporaryDirectory(prefix="spotd-dcp-tr-") as tmp:
        args = ["--steps", str(STEPS)]

        def folder(c, path):
            files = sorted(os.listdir(path)) if os.path.isdir(path) else []
            c.check("SPOTD_COMPLETE" in files and ".metadata" in files and
                    any(f.endswith(".distcp") for f in files),
                    "%s: the committed folder holds DCP's files and the "
                    "marker" % what, repr(files))

        fwlib.run(c, what, torchrun(os.path.join(tmp, "t0"),
                                    args + ["--sleep", "0.3"]),
                  env, STEPS, 2, notice_at=5,
                  resume_cmd=torchrun(os.path.join(tmp, "t1"), args),
                  ref_cmd=torchrun(os.path.join(tmp, "t2"), args),
                  folder_check=folder)


def per_rank(c, env, proto):
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
