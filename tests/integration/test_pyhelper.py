"""The Python helper (python/spotd) keeps the trainer contract.

1. A checkpoint block: SPOTD_COMPLETE appears only when the block ends,
   after every file in the folder (those written through ck.open and
   others) and the folders were fsynced (os.fsync is recorded); a taken
   name gets a suffix.
2. An exception in the block: no marker, the exception goes through.
3. No spotd: checkpoints go to ./checkpoints, resume_dir() is None, rank 0,
   restart 0; done() marks a folder without any socket.
4. The signal only sets a flag (SIGUSR1, or $SPOTD_SIGNAL in a fresh
   process); checkpoint_requested() reads and clears it.
5. done() sends `spotctl done`'s request to $SPOTD_SOCKET (a fake spotd
   here), takes "already handled" as success and raises on a refusal.
6. Under torch.distributed (2 processes, gloo, when torch imports): only
   rank 1 gets the signal, both ranks see the request at the same step;
   one folder, written by local rank 0, marked once; an exception on rank
   1 leaves no marker and rank 0 gets CheckpointAbandoned. The same
   agreement when only rank 1's request channel holds a request.
7. The request channel ($SPOTD_REQUEST_FILE, written here as spotd
   would): a request made before the process started is taken once at its
   first poll; taken is not answered again; once served a new process
   does not take it; a new seq is; each checkpoint_requested() adds one
   to polls; the process installs no signal handler (SIGUSR1 and the
   real-time $SPOTD_SIGNAL keep their default) and counts itself in the file (attached); its first poll maps it; a
   forked child keeps the mapping and sees the request; after exec the
   new image maps it again at its first poll. spotd.deadline() is None
   while the DEADLINE slot is 0, else the seconds to the time it holds
   (0.0 once past), and it maps nothing (the process still takes the
   signal).
8. Fallback: a missing or foreign request file prints one warning and the
   signal handler ($SPOTD_SIGNAL, a real-time number here) is installed.
9. `import spotd, spotd.hf, spotd.lightning, spotd.dcp` imports neither
   torch nor a framework; without torch.distributed.checkpoint,
   spotd.dcp.save() raises a RuntimeError that says so.
10. Staged saves (spotd.StagedSaver, when torch imports): stage()
   returns with the folder unmarked while its writer runs, the handle is
   the saver's `persisting`; the marker (step=N) comes after the file; the
   saved state is the state at stage() time though the tensors were
   changed in place right after (a tied tensor stays one); the buffers
   are reused by the next stage() of the same layout; a stage() while a
   persist runs waits for it with one line; a state over the limit is
   saved synchronously with one line; a failing writer leaves no marker
   and wait() and the next stage() raise; sizes parse. Under
   torch.distributed (2 ranks): one folder, local rank 0's state written
   and marked, nothing from rank 1.
No daemon, no S3.
"""
import contextlib
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spotlib import PY3, Checks, srcdir_path  # noqa: E402

sys.path.insert(0, srcdir_path("python"))
import spotd  # noqa: E402

MARKER = spotd.MARKER


@contextlib.contextmanager
def env(**kv):
    """os.environ with kv set (None: removed) for the block."""
    old = {k: os.environ.get(k) for k in kv}
    for k, v in kv.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def fsync_recorder(events):
    """Records ("fsync", path) for every os.fsync in the block, and
    ("create", path) for every os.open that may create a file."""
    real, real_open = os.fsync, os.open

    def rec(fd):
        events.append(("fsync", os.readlink("/proc/self/fd/%d" % fd)))
        return real(fd)

    def rec_open(path, flags, *a, **kw):
        if flags & os.O_CREAT:
            events.append(("create", os.path.abspath(path)))
        return real_open(path, flags, *a, **kw)
    os.fsync, os.open = rec, rec_open
    try:
        yield
    finally:
        os.fsync, os.open = real, real_open


NO_SPOTD = dict(SPOTD_CKPT_DIR=None, SPOTD_RESUME_DIR=None, SPOTD_SOCKET=None,
                SPOTD_RESTART_COUNT=None, SPOTD_RANK=None, RANK=None,
                SPOTD_SIGNAL=None, LOCAL_RANK=None, WORLD_SIZE=None)


def test_complete_after_files(c, tmp):
    root = os.path.join(tmp, "ckpt")
    events = []
    with env(**dict(NO_SPOTD, SPOTD_CKPT_DIR=root)), fsync_recorder(events):
        with spotd.checkpoint(step=7) as ck:
            c.check(ck.name == "step-000007" and ck.path == os.path.join(
                root, "step-000007") and os.path.isdir(ck.path),
                "checkpoint(step=7) makes ROOT/step-000007", repr(ck.path))
            with ck.open("model.pt") as f:
                f.write(b"m" * 100000)
            c.check(not os.path.exists(os.path.join(ck.path, MARKER)),
                    "no marker while the block runs")
            with open(os.path.join(ck.path, "extra.bin"), "wb") as f:
                f.write(b"x")  # written without ck.open
            with ck.open("sub/opt.pt") as f:
                f.write(b"o")
            c.check(not os.path.exists(os.path.join(ck.path, MARKER)),
                    "still no marker after every file is written")
        marker = os.path.join(ck.path, MARKER)
        with open(marker) as f:
            body = f.read()
        c.check(os.path.isfile(marker) and body == "step=7\n"
                and ck.complete, "the marker exists after the block and "
                "states the step", repr(body))
        with spotd.checkpoint(step=7) as ck2:
            pass
    c.check(ck2.name == "step-000007-1",
            "a taken name gets a suffix (folder never reused)", ck2.name)
    synced = [p for k, p in events if k == "fsync"]
    created = [p for k, p in events if k == "create"]
    # the marker's body is written into a hidden file beside the folder,
    # fsynced, then renamed into place: it never appears empty
    tmps = [p for p in synced if os.path.dirname(p) == root and
            os.path.basename(p).startswith(".spotd-marker-")]
    c.check(marker not in created and len(tmps) >= 1 and not [
        n for n in os.listdir(root) if n.startswith(".")],
            "the marker is renamed into place whole (never created empty "
            "in the folder), nothing left beside it", "\n".join(
                "%s %s" % e for e in events))
    first_marker = synced.index(tmps[0]) if tmps else -1
    for p in ("model.pt", "extra.bin", "sub/opt.pt", "sub", ""):
        full = os.path.normpath(os.path.join(ck.path, p))
        c.check(full in synced[:first_marker],
                "%s fsynced before the marker" % (p or "the folder"),
                "\n".join(synced))
    c.check(first_marker >= 0 and ck.path in synced[first_marker + 1:] and
            root in synced[first_marker + 1:],
            "the marker, then the folder and its parent are fsynced",
            "\n".join(synced))


def test_exception(c, tmp):
    root = os.path.join(tmp, "exc")
    path = None
    raised = None
    try:
        with env(**dict(NO_SPOTD, SPOTD_CKPT_DIR=root)):
            with spotd.checkpoint(name="broken") as ck:
                path = ck.path
                with ck.open("model.pt") as f:
                    f.write(b"half")
                raise KeyError("disk on fire")
    except KeyError as e:
        raised = e
    c.check(raised is not None, "the exception leaves the block unchanged")
    c.check(path is not None and os.path.isdir(path) and
            not os.path.exists(os.path.join(path, MARKER)) and
            not ck.complete, "no marker after an exception")


def test_no_spotd(c, tmp):
    cwd = os.getcwd()
    work = os.path.join(tmp, "plain")
    os.makedirs(work)
    os.chdir(work)
    try:
        with env(**NO_SPOTD):
            c.check(not spotd.under_spotd(), "under_spotd() is False")
            c.check(spotd.ckpt_root() == os.path.join(work, "checkpoints"),
                    "ckpt_root() is ./checkpoints", spotd.ckpt_root())
            c.check(spotd.resume_dir() is None and spotd.rank() == 0 and
                    spotd.restart_count() == 0,
                    "resume_dir None, rank 0, restart 0")
            with spotd.checkpoint(step=1) as ck:
                with ck.open("a") as f:
                    f.write(b"a")
            c.check(os.path.isfile(os.path.join(work, "checkpoints",
                                                "step-000001", MARKER)),
                    "a checkpoint without spotd lands in ./checkpoints")
            os.makedirs("manual")
            name = spotd.done("manual")
            c.check(name == "manual" and os.path.isfile(
                os.path.join(work, "manual", MARKER)),
                "done(DIR) marks a folder without spotd")
        with env(**dict(NO_SPOTD, SPOTD_RESUME_DIR="rel/step-000003",
                        SPOTD_RESTART_COUNT="2", RANK="3")):
            c.check(spotd.resume_dir() == os.path.join(work, "rel",
                                                       "step-000003"),
                    "resume_dir() is absolute", str(spotd.resume_dir()))
            c.check(spotd.restart_count() == 2 and spotd.rank() == 3,
                    "restart_count() and rank() from the environment")
    finally:
        os.chdir(cwd)


def test_signal(c, tmp):
    c.check(signal.getsignal(signal.SIGUSR1) is spotd._on_signal,
            "import installs the SIGUSR1 handler")
    c.check(not spotd.checkpoint_requested(), "no request before a signal")
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.05)
    c.check(spotd.checkpoint_requested(), "SIGUSR1 sets the flag")
    c.check(not spotd.checkpoint_requested(), "reading it clears it")
    # $SPOTD_SIGNAL in a fresh process: USR2 sets the flag.
    code = ("import os, signal, time, spotd\n"
            "os.kill(os.getpid(), signal.SIGUSR2)\n"
            "time.sleep(0.05)\n"
            "print(spotd.checkpoint_requested(), spotd._installed.name)\n")
    cp = subprocess.run([PY3, "-c", code], capture_output=True, text=True,
                        timeout=30, env=dict(os.environ, SPOTD_SIGNAL="USR2",
                                             PYTHONPATH=srcdir_path("python")))
    c.check(cp.returncode == 0 and cp.stdout.split() == ["True", "SIGUSR2"],
            "SPOTD_SIGNAL=USR2: SIGUSR2 sets the flag",
            cp.stdout + cp.stderr)


class FakeSpotd:
    """A Unix socket that answers each request line with self.answer and
    keeps the requests."""

    def __init__(self, path):
        self.path = path
        self.requests = []
        self.answer = {"v": 1, "id": 1, "ok": True, "result": {}}
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(4)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while not buf.endswith(b"\n"):
                    b = conn.recv(4096)
                    if not b:
                        break
                    buf += b
                self.requests.append(json.loads(buf))
                conn.sendall(json.dumps(self.answer).encode() + b"\n")

    def close(self):
        self.srv.close()


def test_done_socket(c, tmp):
    sock = os.path.join(tmp, "spotd.sock")
    fake = FakeSpotd(sock)
    root = os.path.join(tmp, "sockckpt")
    try:
        with env(**dict(NO_SPOTD, SPOTD_CKPT_DIR=root, SPOTD_SOCKET=sock)):
            c.check(spotd.under_spotd(), "under_spotd() with SPOTD_SOCKET")
            with spotd.checkpoint(step=3) as ck:
                with ck.open("m") as f:
                    f.write(b"m")
            req = fake.requests[-1] if fake.requests else {}
            c.check(req.get("cmd") == "done" and req.get("v") == 1 and
                    req.get("args", {}).get("dir") == "step-000003" and
                    os.path.isfile(os.path.join(ck.path, MARKER)),
                    "the marker is written and spotd told (cmd done, the "
                    "bare name of a folder of SPOTD_CKPT_DIR)", repr(req))
            other = os.path.join(tmp, "elsewhere")
            os.makedirs(other)
            spotd.done(other)
            req = fake.requests[-1] if fake.requests else {}
            c.check(req.get("args", {}).get("dir") == other,
                    "a folder elsewhere goes by its absolute path", repr(req))
            fake.answer = {"v": 1, "id": 1, "ok": False,
                           "error": "%s: already handled" % ck.path}
            os.makedirs(os.path.join(root, "again"))
            c.check(spotd.done(os.path.join(root, "again")) == "again",
                    "'already handled' (the folder watch was first) is fine")
            fake.answer = {"v": 1, "id": 1, "ok": False,
                           "error": "x is not a folder directly under y"}
            os.makedirs(os.path.join(root, "refused"))
            try:
                spotd.done(os.path.join(root, "refused"))
                got = None
            except RuntimeError as e:
                got = str(e)
            c.check(got is not None and "not a folder directly" in got,
                    "a refusal by spotd raises", repr(got))
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                with spotd.checkpoint(name="refused2") as ck:
                    pass
            c.check(ck.complete and os.path.isfile(os.path.join(
                ck.path, MARKER)) and "spotd: warning: spotd refused" in
                err.getvalue(), "in a checkpoint block a refusal is one "
                "warning line, the block completes", err.getvalue())
    finally:
        fake.close()


DIST_WORKER = r"""
import os, sys, time, signal
import spotd
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
root = sys.argv[1]
seen = []
for step in range(1, 31):
    if r == 1 and step == 5:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
    if spotd.checkpoint_requested():
        seen.append(step)
        with spotd.checkpoint(step=step, root=root) as ck:
            if ck.writer:
                with ck.open("model.pt") as f:
                    f.write(b"model")
            with ck.open("rng-rank%d.pt" % r) as f:
                f.write(b"rng")
            time.sleep(0.3 if r == 1 else 0)  # rank 1 is slower
# An exception on rank 1 only.
result = "none"
try:
    with spotd.checkpoint(name="failing", root=root) as ck:
        if r == 1:
            raise ValueError("rank 1 fails")
except spotd.CheckpointAbandoned:
    result = "abandoned"
except ValueError:
    result = "raised"
# A staged save: one folder, written and marked by local rank 0.
w = torch.full((1000,), float(r))
saver = spotd.StagedSaver(limit="64M", root=root + "-staged")
h = saver.stage({"w": w, "rank": r}, step=3)
w.add_(10.0)
h.wait(60)
dist.barrier()
saved = None
if h.staged:
    got = torch.load(os.path.join(h.path, "state.pt"))
    saved = "%d:%g" % (got["rank"], float(got["w"].sum()))
print("staged rank=%d staged=%s name=%s saved=%s" % (r, h.staged, h.name,
                                                      saved), flush=True)
print("rank=%d seen=%s writer=%s failing=%s" % (r, seen, ck.writer, result),
      flush=True)
dist.destroy_process_group()
"""


DIST_CHAN_WORKER = r"""
import sys
import spotd
import torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
seen = [s for s in range(1, 11) if spotd.checkpoint_requested()]
print("rank=%d chan=%s seen=%s" % (r, spotd.request_channel() is not None,
                                   seen), flush=True)
dist.destroy_process_group()
"""


DIST_LATE_WORKER = r"""
import os, sys, time
import spotd
import torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
flag = sys.argv[1]
seen, first = [], None
for call in range(1, 7):
    if r == 1 and call == 3:
        spotd.request()
    if r == 1 and call == 5:
        end = time.monotonic() + 30
        while not os.path.exists(flag) and time.monotonic() < end:
            time.sleep(0.01)
        first = os.path.exists(flag)
    if spotd.checkpoint_requested():
        seen.append(call)
    if r == 0 and call == 5:
        open(flag, "w").close()
print("rank=%d seen=%s" % (r, seen) +
      (" r0_first=%s" % first if r == 1 else ""), flush=True)
dist.destroy_process_group()
"""


# Every launcher's local-rank variable (none of them LOCAL_RANK's).
LAUNCHER_VARS = ["SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                 "MV2_COMM_WORLD_LOCAL_RANK", "SPOTD_LOCAL_RANK"]

DIST_LOCAL_WORKER = r"""
import os, sys
import spotd
import torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
names = sys.argv[2].split(",")
calls = []
real_done = spotd.done
def done(path, strict=True, **kw):
    calls.append(path)
    return real_done(path, strict, **kw)
spotd.done = done
out = []
for var in names:
    for v in names + ["LOCAL_RANK"]:
        os.environ.pop(v, None)
    os.environ[var] = str(r)  # one node, its two processes
    del calls[:]
    with spotd.checkpoint(name=var.lower(), root=sys.argv[1]) as ck:
        pass
    out.append("%s:%s:%d" % (var, ck.writer, len(calls)))
print("rank=%d %s" % (r, " ".join(out)), flush=True)
dist.destroy_process_group()
"""


def test_local_rank(c, tmp):
    """The local rank from every launcher; one marker per node."""
    clear = {v: None for v in LAUNCHER_VARS + ["LOCAL_RANK"]}
    got = {}
    for var in LAUNCHER_VARS + ["LOCAL_RANK"]:
        with env(**dict(clear, **{var: "3"})):
            got[var] = spotd.local_rank()
    c.check(all(v == 3 for v in got.values()),
            "local_rank() from torchrun, srun, Open MPI, MPICH, PMI, "
            "MVAPICH2 and spotd's own variable", repr(got))
    with env(**dict(clear, LOCAL_RANK="2", SLURM_LOCALID="0")):
        c.check(spotd.local_rank() == 2, "torchrun under srun: the "
                "worker's LOCAL_RANK, not the launcher task's SLURM_LOCALID")
    with env(**clear):
        c.check(spotd.local_rank() == 0, "no launcher: local rank 0")
    cp = subprocess.run([PY3, "-c", "import torch.distributed as d; "
                         "assert d.is_available()"], capture_output=True)
    if cp.returncode != 0:
        return
    root = os.path.join(tmp, "local")
    script = os.path.join(tmp, "local_worker.py")
    with open(script, "w") as f:
        f.write(DIST_LOCAL_WORKER)
    outs = run_ranks(script, [root, ",".join(LAUNCHER_VARS)],
                     lambda r: {"LOCAL_RANK": ""})
    detail = "\n".join("rc=%d\n%s" % o for o in outs)
    lines = [o[1].strip().splitlines()[-1] if o[1].strip() else ""
             for o in outs]
    want = ["rank=%d %s" % (r, " ".join("%s:%s:%d" % (v, r == 0, r == 0)
                                        for v in LAUNCHER_VARS))
            for r in (0, 1)]
    c.check(all(o[0] == 0 for o in outs) and lines == want,
            "two processes of one node started by srun, Open MPI, MPICH, "
            "PMI, MVAPICH2 or with SPOTD_LOCAL_RANK: only local rank 0 is "
            "the writer and marks the folder (one marker per node)", detail)


def run_ranks(script, args, env_of, timeout=120):
    """Starts ranks 0 and 1 of script (gloo on loopback); [(rc, output)]."""
    port = str(free_port())
    procs = []
    for r in (0, 1):
        e = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                 PYTHONPATH=srcdir_path("python"))
        for k in ("SPOTD_SOCKET", "SPOTD_CKPT_DIR", "SPOTD_SIGNAL",
                  "SPOTD_REQUEST_FILE"):
            e.pop(k, None)
        e.update(env_of(r))
        procs.append(subprocess.Popen([PY3, script] + args, env=e,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outs.append((p.returncode, out))
    return outs


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed(c, tmp):
    cp = subprocess.run([PY3, "-c", "import torch.distributed as d; "
                         "assert d.is_available()"], capture_output=True)
    if cp.returncode != 0:
        print("     (torch.distributed not importable: part 6 not run)")
        return
    root = os.path.join(tmp, "dist")
    script = os.path.join(tmp, "worker.py")
    with open(script, "w") as f:
        f.write(DIST_WORKER)
    outs = run_ranks(script, [root], lambda r: {})
    detail = "\n".join("rc=%d\n%s" % o for o in outs)
    lines = [o[1].strip().splitlines()[-1] if o[1].strip() else ""
             for o in outs]
    c.check(all(o[0] == 0 for o in outs), "both ranks exit 0", detail)
    c.check(lines[0].startswith("rank=0 seen=[6] writer=True") and
            lines[1].startswith("rank=1 seen=[6] writer=False"),
            "signal on rank 1 only at step 5: both ranks save at step 6 (the "
            "agreement is read one call later); local rank 0 is the writer",
            detail)
    folder = os.path.join(root, "step-000006")
    files = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    c.check(files == sorted([MARKER, "model.pt", "rng-rank0.pt",
                             "rng-rank1.pt"]),
            "one folder: the writer's model, each rank's file, one marker",
            repr(files))
    c.check(sorted(os.listdir(root)) == ["failing", "step-000006"],
            "no other folder was made", repr(os.listdir(root)))
    c.check(lines[0].endswith("failing=abandoned") and
            lines[1].endswith("failing=raised") and
            not os.path.exists(os.path.join(root, "failing", MARKER)),
            "an exception on rank 1: no marker, rank 0 gets "
            "CheckpointAbandoned", detail)
    # Staged saves under torch.distributed (the same workers): one folder,
    # written and marked by local rank 0 (the state as staged), nothing
    # by rank 1.
    sroot = root + "-staged"
    slines = [[x for x in o[1].splitlines() if x.startswith("staged ")]
              for o in outs]
    slines = [x[-1] if x else "" for x in slines]
    files = sorted(os.listdir(sroot)) if os.path.isdir(sroot) else []
    inner = sorted(os.listdir(os.path.join(sroot, files[0]))) \
        if len(files) == 1 else []
    c.check(all(o[0] == 0 for o in outs) and
            slines == ["staged rank=0 staged=True name=step-000003 "
                       "saved=0:0",
                       "staged rank=1 staged=False name=step-000003 "
                       "saved=None"] and
            files == ["step-000003"] and inner == [MARKER, "state.pt"],
            "staged saves, 2 ranks: one folder, local rank 0's state as "
            "staged (before its in-place change) and one marker; rank 1 "
            "writes nothing", "%s\nfiles %r %r" % (detail, files, inner))
    # Only rank 1's request channel holds a request (rank 0 has none).
    req = os.path.join(tmp, "rank1.req")
    make_req(req, seq=1)
    script = os.path.join(tmp, "chan_worker.py")
    with open(script, "w") as f:
        f.write(DIST_CHAN_WORKER)
    outs = run_ranks(script, [], lambda r: {"SPOTD_REQUEST_FILE": req}
                     if r == 1 else {})
    detail = "\n".join("rc=%d\n%s" % o for o in outs)
    lines = [o[1].strip().splitlines()[-1] if o[1].strip() else ""
             for o in outs]
    c.check(all(o[0] == 0 for o in outs) and
            lines == ["rank=0 chan=False seen=[1]",
                      "rank=1 chan=True seen=[1]"],
            "a request in rank 1's channel only: both ranks agree at the "
            "first poll, and only once", detail)
    # A rank that is late does not hold the other one's call back: rank 1
    # makes its call 5 only once rank 0's call 5 has returned (or after
    # 30 s). With an agreement that waits for every rank at each call,
    # rank 0's call 5 returns only after rank 1 made it.
    script = os.path.join(tmp, "late_worker.py")
    with open(script, "w") as f:
        f.write(DIST_LATE_WORKER)
    outs = run_ranks(script, [os.path.join(tmp, "r0-call5")], lambda r: {})
    detail = "\n".join("rc=%d\n%s" % o for o in outs)
    lines = [o[1].strip().splitlines()[-1] if o[1].strip() else ""
             for o in outs]
    c.check(all(o[0] == 0 for o in outs) and
            lines == ["rank=0 seen=[4]", "rank=1 seen=[4] r0_first=True"],
            "rank 0's call returns while rank 1 is late (no wait for the "
            "slowest rank); a request at call 3 is answered at call 4 on "
            "both", detail)



REQ_SIZE = 4096


def make_req(path, seq=0, served=0, polls=0, magic=b"SPOTDREQ", version=2):
    """Writes a request file as spotd does."""
    with open(path, "wb") as f:
        f.write(magic + struct.pack("<IIQQQ", version, 0, seq, served, polls)
                + b"\0" * (REQ_SIZE - 40))


def set_req(path, **kv):
    """Sets fields of an existing request file in place (seq, served,
    polls, deadline), through the file as spotd's separate mapping would."""
    offs = {"seq": 16, "served": 24, "polls": 32, "deadline": 48}
    with open(path, "r+b") as f:
        for k, v in kv.items():
            f.seek(offs[k])
            f.write(struct.pack("<Q", v))


def read_req(path):
    with open(path, "rb") as f:
        d = f.read(REQ_SIZE)
    return dict(zip(("seq", "served", "polls", "attached"),
                    struct.unpack_from("<QQQQ", d, 16)))


CHAN_CHILD = r"""
import json, os, signal, sys
import spotd
def maps(pid):
    with open("/proc/%d/maps" % pid) as f:
        return os.environ["SPOTD_REQUEST_FILE"] in f.read()
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "poll":
        out = spotd.checkpoint_requested()
    elif cmd[0] == "pending":
        out = spotd.pending()
    elif cmd[0] == "deadline":
        import time
        t0 = time.time()
        dl = spotd.deadline()
        out = [dl, t0, time.time(), maps(os.getpid())]
    elif cmd[0] == "info":
        rt = int(os.environ.get("SPOTD_SIGNAL") or 0)
        out = {"channel": spotd.request_channel(),
               "usr1": signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
               "rt": rt and signal.getsignal(rt) == signal.SIG_DFL,
               "installed": spotd._installed is not None,
               "mapped": maps(os.getpid())}
    elif cmd[0] == "fork":
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            res = [maps(os.getpid()), spotd.checkpoint_requested(),
                   spotd.checkpoint_requested()]
            os.write(w, json.dumps(res).encode())
            os._exit(0)
        os.close(w)
        data = b""
        while True:
            b = os.read(r, 4096)
            if not b:
                break
            data += b
        os.waitpid(pid, 0)
        out = json.loads(data)
    elif cmd[0] == "exec":
        code = ("import os; "
                "f = os.environ['SPOTD_REQUEST_FILE']; "
                "m = lambda: f in open('/proc/self/maps').read(); "
                "before = m(); import spotd; "
                "print(before, m(), spotd.request_channel() == f, flush=True)")
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-c", code])
    print(json.dumps(out), flush=True)
"""


class ChanChild:
    """A Python process that imports spotd with SPOTD_REQUEST_FILE=path
    and answers one command per line (poll, pending, info, fork, exec)."""

    def __init__(self, path, **extra):
        e = dict(os.environ, PYTHONPATH=srcdir_path("python"),
                 SPOTD_REQUEST_FILE=path)
        for k in ("SPOTD_SIGNAL", "RANK", "WORLD_SIZE"):
            e.pop(k, None)
        e.update(extra)
        self.p = subprocess.Popen([PY3, "-c", CHAN_CHILD], env=e, text=True,
                                  stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            return None
        if cmd == "exec":
            return line.split()
        return json.loads(line)

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        return self.p.stderr.read()


def test_channel(c, tmp):
    req = os.path.join(tmp, "spotd.sock.req")
    make_req(req, seq=1)  # made before the process could take it
    ch = ChanChild(req, SPOTD_SIGNAL=str(signal.SIGRTMIN + 4))
    try:
        info = ch.ask("info")
        c.check(info == {"channel": req, "usr1": True, "rt": True,
                         "installed": False, "mapped": False},
                "with the request file: no signal handler (SIGUSR1 and the "
                "real-time SPOTD_SIGNAL at default), not mapped before the "
                "first poll (a process that never polls takes the signal)",
                repr(info))
        dl = ch.ask("deadline")
        c.check(dl[0] is None and dl[3] is False,
                "deadline(): None while the slot is 0, and the file is not "
                "mapped by it", repr(dl))
        at = time.time() + 30.0
        set_req(req, deadline=int(at * 1000))
        dl = ch.ask("deadline")
        c.check(dl[0] is not None and
                int(at * 1000) / 1000.0 - 0.002 <= dl[1] + dl[0] and
                dl[2] + dl[0] <= int(at * 1000) / 1000.0 + 0.002
                and dl[3] is False,
                "deadline(): the seconds to the time in the slot, between "
                "the reads before and after (%r, want %.3f)" % (dl, at))
        set_req(req, deadline=int((time.time() - 5.0) * 1000))
        c.check(ch.ask("deadline")[0] == 0.0, "deadline(): 0.0 once past")
        set_req(req, deadline=0)
        c.check(read_req(req)["polls"] == 0, "no poll counted at import")
        c.check(read_req(req)["attached"] == 1, "the import is counted "
                "(attached)", repr(read_req(req)))
        c.check(ch.ask("pending") is True,
                "a request made before the process started is pending")
        c.check(ch.ask("poll") is True, "its first poll takes it")
        c.check(ch.ask("info")["mapped"] is True,
                "mapped for good once it polled")
        c.check(ch.ask("poll") is False and ch.ask("pending") is False,
                "a taken request is not answered again")
        c.check(read_req(req)["polls"] == 1,
                "the first checkpoint_requested() marks polls, the next "
                "leave it (pending() does not count)", repr(read_req(req)))
        set_req(req, served=1)
        c.check(ch.ask("poll") is False, "served: nothing pending")
        set_req(req, seq=2)
        c.check(ch.ask("poll") is True and ch.ask("poll") is False,
                "a new request (seq 2) is taken once")
        set_req(req, seq=3)
        got = ch.ask("fork")
        c.check(got == [True, True, False],
                "a forked child keeps the mapping and takes the pending "
                "request once", repr(got))
        c.check(ch.ask("poll") is True,
                "the parent still takes it (taken is per process)")
        set_req(req, served=3)
        got = ch.ask("exec")
        c.check(got == ["False", "False", "True"],
                "after exec the new image uses the channel again (mapped "
                "at its first poll)", repr(got))
    finally:
        err = ch.close()
    c.check(err == "", "no warning with a valid request file", err)
    # Served before a new process started: it does not take it.
    ch = ChanChild(req)
    try:
        c.check(ch.ask("poll") is False,
                "a request served before the process started is not taken")
    finally:
        ch.close()
    c.check(read_req(req)["seq"] == 3 and read_req(req)["served"] == 3,
            "the helper never writes seq or served", repr(read_req(req)))


def test_fallback(c, tmp):
    rt = str(signal.SIGRTMIN + 4)
    code = ("import os, signal, time, spotd\n"
            "print(spotd.request_channel(), spotd._installed, "
            "signal.getsignal(%s) is spotd._on_signal, "
            "os.environ['SPOTD_REQUEST_FILE'] in open('/proc/self/maps')"
            ".read())\n"
            "os.kill(os.getpid(), %s)\n"
            "time.sleep(0.05)\n"
            "print(spotd.checkpoint_requested(), spotd.checkpoint_requested())\n"
            % (rt, rt))
    bad = os.path.join(tmp, "foreign.req")
    make_req(bad, magic=b"NOTSPOTD")
    short = os.path.join(tmp, "short.req")
    with open(short, "wb") as f:
        f.write(b"SPOTDREQ")
    for what, path in (("a missing", os.path.join(tmp, "nope.req")),
                       ("a foreign", bad), ("a short", short)):
        cp = subprocess.run([PY3, "-c", code], capture_output=True, text=True,
                            timeout=30, env=dict(
                                os.environ, SPOTD_SIGNAL=rt,
                                SPOTD_REQUEST_FILE=path,
                                PYTHONPATH=srcdir_path("python")))
        warn = [l for l in cp.stderr.splitlines() if "warning" in l]
        c.check(cp.returncode == 0 and cp.stdout.split() ==
                ["None", rt, "True", "False", "True", "False"] and len(warn) == 1 and
                path in warn[0],
                "%s request file: one warning, not left mapped, the real-time "
                "SPOTD_SIGNAL %s handler sets the flag" % (what, rt),
                cp.stdout + cp.stderr)
    cp = subprocess.run([PY3, "-c", "import spotd; print(spotd._installed)"],
                        capture_output=True, text=True, timeout=30,
                        env=dict(os.environ, SPOTD_SIGNAL="RTMIN+4",
                                 PYTHONPATH=srcdir_path("python")))
    c.check(cp.stdout.strip() == rt, "SPOTD_SIGNAL=RTMIN+4 is %s" % rt,
            cp.stdout + cp.stderr)


def test_light_import(c, tmp):
    code = ("import sys, spotd, spotd.hf, spotd.lightning, spotd.dcp\n"
            "heavy = [m for m in ('torch', 'transformers', 'lightning', "
            "'pytorch_lightning', 'numpy') if m in sys.modules]\n"
            "print(heavy)\n")
    cp = subprocess.run([PY3, "-c", code], capture_output=True, text=True,
                        timeout=30, env=dict(os.environ,
                                             PYTHONPATH=srcdir_path("python")))
    c.check(cp.returncode == 0 and cp.stdout.strip() == "[]",
            "import spotd and its integrations imports no torch, "
            "transformers, lightning or numpy", cp.stdout + cp.stderr)
    code = ("import spotd.dcp\n"
            "try:\n    import torch.distributed.checkpoint\n"
            "    print('has-dcp')\n"
            "except ImportError:\n"
            "    try:\n        spotd.dcp.save({}, step=1)\n"
            "    except RuntimeError as e:\n        print(e)\n")
    cp = subprocess.run([PY3, "-c", code], capture_output=True, text=True,
                        timeout=60, env=dict(os.environ,
                                             PYTHONPATH=srcdir_path("python")))
    out = cp.stdout.strip()
    if out == "has-dcp":
        print("     (this torch has torch.distributed.checkpoint: fw_dcp "
              "tests spotd.dcp)")
    else:
        c.check("needs torch.distributed.checkpoint (torch 2.0 or newer)"
                in out and "this Python has " in out,
                "spotd.dcp without DCP: a RuntimeError naming what is "
                "missing and which torch is there", cp.stdout + cp.stderr)


STAGED_CODE = r"""
import contextlib, io, json, os, sys, threading
import torch
import spotd
out = {}
gate = threading.Event()
entered = threading.Event()
def writer(snap, folder, filename):
    entered.set()
    gate.wait(30)
    if snap.get("fail"):
        raise OSError(28, "No space left on device")
    spotd.staged._torch_save(snap, folder, filename)
torch.manual_seed(0)
w = torch.randn(256, 256)
state = {"model": {"w": w, "tied": w, "b": torch.zeros(8)},
         "meta": {"lr": [0.1]}, "step": 7}
ref = w.clone()
s = spotd.StagedSaver(limit="16M", writer=writer)
h = s.stage(state, step=7)
w.add_(1.0)                      # the optimizer, in place
state["meta"]["lr"][0] = 0.5
entered.wait(30)
out["unmarked_while_persisting"] = not os.path.exists(
    os.path.join(h.path, spotd.MARKER))
out["persisting_is_handle"] = s.persisting is h
gate.set()
h.wait(30)
with open(os.path.join(h.path, spotd.MARKER)) as f:
    out["marker"] = f.read()
got = torch.load(os.path.join(h.path, "state.pt"))
out["equal_at_stage"] = bool(torch.equal(got["model"]["w"], ref))
out["tied_one"] = got["model"]["w"].data_ptr() == \
    got["model"]["tied"].data_ptr()
out["plain_copied"] = got["meta"]["lr"] == [0.1]
out["persisting_after"] = s.persisting is None
ptrs = {k: b.data_ptr() for k, b in s._bufs.items()}
gate.clear(); entered.clear()
h2 = s.stage(state, step=8)
out["reused"] = ptrs == {k: b.data_ptr() for k, b in s._bufs.items()}
entered.wait(30)
err = io.StringIO()
threading.Timer(0.3, gate.set).start()
with contextlib.redirect_stderr(err):
    h3 = s.stage(state, step=9)
out["wait_line"] = err.getvalue()
h3.wait(30)
big = spotd.StagedSaver(limit=1024, writer=writer)
err = io.StringIO()
with contextlib.redirect_stderr(err):
    h4 = big.stage(state, step=10)
out["sync_line"] = err.getvalue()
out["sync_marked"] = (not h4.staged) and os.path.exists(
    os.path.join(h4.path, spotd.MARKER))
sp_gate = threading.Event()
def sp_writer(snap, folder, filename):
    sp_gate.wait(30)
    spotd.staged._torch_save(snap, folder, filename)
sp = spotd.StagedSaver(limit="16M", writer=sp_writer)
a = torch.tensor([1., 0, 0, 0]).to_sparse()
b = torch.tensor([0., 0, 0, 7]).to_sparse()
sp_gate.set()
sp.stage({"sp": a}, step=20).wait(30)
sp_gate.clear()
hb = sp.stage({"sp": b}, step=21)
b.mul_(100)                      # changed before the writer runs
sp_gate.set()
hb.wait(30)
out["sparse_user_kept"] = a.to_dense().tolist() == [1.0, 0.0, 0.0, 0.0]
out["sparse_at_stage"] = torch.load(os.path.join(hb.path, "state.pt"))[
    "sp"].to_dense().tolist() == [0.0, 0.0, 0.0, 7.0]
state["fail"] = True
err = io.StringIO()
with contextlib.redirect_stderr(err):
    h5 = s.stage(state, step=11)
    try:
        h5.wait(30)
        out["fail_raised"] = False
    except RuntimeError as e:
        out["fail_raised"] = "No space" in str(e)
    out["fail_unmarked"] = not os.path.exists(
        os.path.join(h5.path, spotd.MARKER))
    try:
        s.stage(state, step=12)
        out["next_raised"] = False
    except RuntimeError:
        out["next_raised"] = True
out["fail_line"] = err.getvalue()
out["sizes"] = [spotd.staged.parse_size(x) for x in ("512M", "8G", "1024")]
# the copy on threads: a 40 MiB tensor in pieces, an odd-strided one whole
torch.manual_seed(1)
big_t = torch.randn(10 << 20)
odd = torch.randn(64, 48).t()
ref_big, ref_odd = big_t.clone(), odd.clone()
mt = spotd.StagedSaver(limit="256M", threads=3, writer=writer)
gate.clear(); entered.clear()
hm = mt.stage({"big": big_t, "odd": odd}, step=30)
out["copy_threads"] = sorted({t.name.rsplit("_", 1)[0] for t in
                              threading.enumerate()
                              if t.name.startswith("spotd-copy")})
big_t.mul_(-1); odd.add_(1)      # the optimizer, in place
entered.wait(30); gate.set(); hm.wait(30)
got = torch.load(os.path.join(hm.path, "state.pt"))
out["mt_equal"] = bool(torch.equal(got["big"], ref_big)) and \
    bool(torch.equal(got["odd"], ref_odd))
smaps = open("/proc/self/smaps").read().split("\n")
addr = mt._bufs[("big",)].data_ptr() if ("big",) in mt._bufs else \
    next(b.data_ptr() for b in mt._bufs.values() if b.numel() == 10 << 20)
out["big_advised"] = False
for i, line in enumerate(smaps):
    head = line.split(" ", 1)[0]
    if "-" in head and all(c in "0123456789abcdef-" for c in head):
        lo, hi = (int(x, 16) for x in head.split("-"))
        if lo <= addr < hi:
            for l2 in smaps[i + 1:i + 30]:
                if l2.startswith("VmFlags:"):
                    out["big_advised"] = " hg" in l2
                    break
            break
bad = []
for arg, env in ((0, None), (True, None), (None, "two")):
    if env is not None:
        os.environ[spotd.staged.ENV_THREADS] = env
    try:
        spotd.StagedSaver(threads=arg)
        bad.append(None)
    except ValueError as e:
        bad.append(str(e))
    os.environ.pop(spotd.staged.ENV_THREADS, None)
out["bad_threads"] = bad
print(json.dumps(out))
"""


def test_staged(c, tmp):
    if subprocess.run([PY3, "-c", "import torch"],
                      capture_output=True).returncode != 0:
        print("     (no torch: the staged-save checks are skipped)")
        return
    wd = os.path.join(tmp, "staged")
    os.makedirs(wd)
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("SPOTD_")}
    e.update(PYTHONPATH=srcdir_path("python"),
             SPOTD_CKPT_DIR=os.path.join(wd, "ck"))
    cp = subprocess.run([PY3, "-c", STAGED_CODE], capture_output=True,
                        text=True, timeout=120, cwd=wd, env=e)
    try:
        r = json.loads(cp.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        c.check(False, "staged: the checks ran", cp.stdout + cp.stderr)
        return
    what = cp.stdout + cp.stderr
    c.check(r["unmarked_while_persisting"] and r["persisting_is_handle"],
            "staged: stage() returns while its writer runs, no marker yet, "
            "saver.persisting is the handle", what)
    c.check(r["marker"] == "step=7\n" and r["persisting_after"],
            "staged: SPOTD_COMPLETE (step=7) once persisted", what)
    c.check(r["equal_at_stage"] and r["plain_copied"] and r["tied_one"],
            "staged: the saved state is the state at stage() time (tensors "
            "changed in place after it; plain objects copied; a tied "
            "tensor saved once)", what)
    c.check(r["reused"], "staged: the next stage() of the same layout "
            "reuses the buffers", what)
    c.check("step-000009 waits for the previous one (step-000008)"
            in r["wait_line"], "staged: a stage() during a persist waits "
            "for it, one line says so", r["wait_line"])
    c.check("does not fit the staging limit" in r["sync_line"] and
            "synchronously" in r["sync_line"] and r["sync_marked"],
            "staged: a state over the limit is saved synchronously, one "
            "line says so", r["sync_line"])
    c.check(r["fail_raised"] and r["fail_unmarked"] and r["next_raised"]
            and "not saved (no marker)" in r["fail_line"],
            "staged: a failing persist leaves no marker; wait() and the "
            "next stage() raise; one line says so", what)
    c.check(r["sparse_user_kept"] and r["sparse_at_stage"],
            "staged: a sparse tensor is cloned, never kept as a buffer: the "
            "next stage() leaves the caller's earlier tensor alone and saves "
            "the state at stage() time", what)
    c.check(r["sizes"] == [512 << 20, 8 << 30, 1024],
            "staged: sizes parse (512M, 8G, 1024)", repr(r["sizes"]))
    c.check(r["copy_threads"] == ["spotd-copy"] and r["mt_equal"],
            "staged: threads=3 copies on the saver's copy threads, a large "
            "tensor in pieces and a strided one whole, and saves the state "
            "at stage() time", what)
    c.check(r["big_advised"], "staged: a CPU buffer of 2 MiB or more is "
            "mapped for huge pages (VmFlags hg)", what)
    bad = r["bad_threads"]
    c.check(len(bad) == 3 and all(bad) and "threads must be" in bad[0] and
            "SPOTD_STAGE_THREADS='two'" in bad[2],
            "staged: threads=0, threads=True and SPOTD_STAGE_THREADS=two "
            "are refused with a line that says why", repr(bad))


def main():
    if os.environ.get("SPOTD_TEST_PYTHON_RAN"):
        # tools/test's ASan run: this tests Python code only (no spotd,
        # no C), and it ran in the gcc run already
        print("SKIP: Python only, it ran in the gcc run")
        sys.exit(77)
    c = Checks()
    tmp = tempfile.mkdtemp(prefix="spot-pyhelper-")
    try:
        test_complete_after_files(c, tmp)
        test_exception(c, tmp)
        test_no_spotd(c, tmp)
        test_signal(c, tmp)
        test_done_socket(c, tmp)
        test_channel(c, tmp)
        test_fallback(c, tmp)
        test_light_import(c, tmp)
        test_staged(c, tmp)
        test_distributed(c, tmp)
        test_local_rank(c, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
