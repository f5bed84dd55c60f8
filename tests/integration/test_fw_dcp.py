"""spotd.dcp with torch.distributed.checkpoint: two ranks (gloo, CPU)
save a state dict with spotd.dcp.save() into one folder, each rank its own
shard file; one SPOTD_COMPLETE after all of them; spotd.dcp.load() from
spotd.resume_dir() restores it on both ranks. Skips (77) when this torch
has no torch.distributed.checkpoint (torch before 2.0, Debian's 1.13 in
CI); then it checks that spotd.dcp says so with a clear error instead."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

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
    path = spotd.dcp.save(state, step=7)
    print("saved", os.path.basename(path), flush=True)
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
    env = dict(os.environ, PYTHONPATH=sl.srcdir_path("python"))
    for k in ("SPOTD_SOCKET", "SPOTD_RESUME_DIR", "SPOTD_REQUEST_FILE"):
        env.pop(k, None)
    cp = subprocess.run([sl.PY3, "-c", "import torch.distributed.checkpoint"],
                        capture_output=True, text=True, env=env)
    if cp.returncode != 0:
        probe = subprocess.run(
            [sl.PY3, "-c", "import spotd.dcp\n"
             "try:\n spotd.dcp.save({}, step=1)\n"
             "except RuntimeError as e:\n print(e)"],
            capture_output=True, text=True, env=env)
        msg = probe.stdout.strip()
        if "needs torch.distributed.checkpoint" not in msg:
            print("FAIL spotd.dcp without DCP: no clear error\n     " +
                  probe.stdout + probe.stderr)
            sys.exit(1)
        sl.skip("this torch has no torch.distributed.checkpoint (spotd.dcp "
                "says: %s)" % msg)
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-dcp-") as tmp:
        root = os.path.join(tmp, "ckpt")
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        env["SPOTD_CKPT_DIR"] = root
        outs = ranks(script, "save", env)
        detail = "\n".join("rc=%d\n%s" % o for o in outs)
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
    c.finish()


if __name__ == "__main__":
    main()
