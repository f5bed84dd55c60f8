"""spotd's trainer contract in a few lines (standard library; torch optional).

    import spotd
    import torch
    ...
    if spotd.resume_dir():
        step = load(spotd.resume_dir())
    while step < steps:
        train_one_step()
        step += 1
        if spotd.checkpoint_requested():      # once per step, every rank
            with spotd.checkpoint(step=step) as ck:
                if ck.writer:
                    with ck.open("model.pt") as f:
                        torch.save(model.state_dict(), f)

What it does for you:

- How a request reaches the trainer. Under spotd the trainer's
  environment names a small shared file, $SPOTD_REQUEST_FILE (spotd's
  request channel). Importing this module checks it and counts itself in
  it (attached); the first checkpoint_requested() opens and maps it and
  keeps both for the life of the process (it reads the file with pread(),
  never through the mapping, which only shows spotd whom it serves): a
  forked child inherits them, an exec'd program that imports spotd opens
  it again. spotd counts a
  request in it (seq) and marks it served once the checkpoint is complete;
  checkpoint_requested() reads those two counters, so every process of the
  job sees a request whatever its session, process group or threads, and
  no signal is involved: with the channel the module installs no signal
  handler, and spotd sends its checkpoint signal only to processes that
  do not map the file (a program that imports spotd only for
  report_step() or done() and handles the checkpoint signal itself still
  gets the signal: it never polls). A request made before the trainer
  could take it
  (still starting, waiting in its rendezvous) is taken once, at its first
  checkpoint_requested(). The first call also marks the file (polls),
  which tells spotd the trainer has reached its training loop.
- Without the channel (no spotd, or a spotd that has none; a file that
  cannot be mapped prints one warning) importing it in the main thread
  installs a handler for the checkpoint signal ($SPOTD_SIGNAL, a number
  or a name, else SIGUSR1) that only sets a flag; `kill -USR1 PID` then
  asks for a checkpoint by hand. request() sets the same flag.
- checkpoint_requested() is meant for a safe point (between optimizer
  steps). Under torch.distributed (initialised) the ranks agree on a CPU flag
  (MAX over a gloo group of the helper's own, reduced in the background
  and read at the next call), so every rank saves at the same step, one
  step after the first rank saw the request, with no host-device
  synchronisation and no wait for a slower rank. With nothing pending and no torch.distributed
  it costs about a microsecond (bench/helper_bench.py).
- checkpoint() makes the next folder under $SPOTD_CKPT_DIR (step-NNNNNN,
  or the name you give; a name already taken gets a suffix, a folder is
  never reused) and, when the with block ends without an exception (on
  every rank), fsyncs every file and the folders, then creates the empty
  SPOTD_COMPLETE marker. After an exception there is no marker: spotd
  never uploads that folder.
- Under torchrun (one spotd per node): every rank enters the block; the
  folder is created once per node and the marker is written once per node
  by the node's local rank 0 after every rank left the block. ck.writer is
  True on that process: DDP weights are replicated, so it alone writes the
  model and optimizer; any rank may also write files of its own (say
  rng-rank{K}.pt, or torch.distributed.checkpoint shards) into ck.path.
- resume_dir(), rank(), restart_count(), done(dir) (what `spotctl done`
  does: mark a folder complete and tell spotd), report_step(n) (the
  trainer's step, for `spotctl history`'s lost steps; call it after each
  optimizer step, it sends at most ten requests a second), deadline()
  (seconds left to complete the checkpoint spotd asks for after a notice,
  spotd's upload time already kept out; None when no deadline is known).
- Staged saves (spotd.staged): StagedSaver().stage(state, step=N), or
  stage(state, step=N), copies the state's tensors into reused host
  buffers and returns; a thread writes it into step-NNNNNN/state.pt and
  marks it only then (see that module).
- Framework integrations live in submodules that import their framework
  only when used: spotd.hf (Hugging Face Trainer), spotd.lightning
  (PyTorch Lightning), spotd.dcp (torch.distributed.checkpoint).
  `import spotd` itself imports none of them, nor torch.

Without spotd (a plain local run) everything works the same: checkpoints
go to ./checkpoints (or $SPOTD_CKPT_DIR if you set it), resume_dir() is
$SPOTD_RESUME_DIR if you set it, `kill -USR1 PID` asks for a checkpoint.
"""
import atexit
import errno
import json
import mmap
import os
import signal
import socket
import struct
import sys
import threading
import time
import weakref

__all__ = [
    "CheckpointAbandoned", "Checkpoint", "MARKER", "checkpoint",
    "checkpoint_requested", "ckpt_root", "deadline", "done", "install",
    "local_rank", "pending", "rank", "report_step", "request", "request_channel",
    "restart_count", "resume_dir", "under_spotd", "world_size",
    "StagedSave", "StagedSaver", "stage",
]

MARKER = "SPOTD_COMPLETE"
DEFAULT_ROOT = "checkpoints"  # without spotd: ./checkpoints

_flag = threading.Event()
_installed = None  # the signal our handler is installed for


class CheckpointAbandoned(RuntimeError):
    """Raised on the ranks that did not fail when another rank's checkpoint
    block raised: the folder gets no marker on any rank."""


# ------------------------------------------------------- request channel
# $SPOTD_REQUEST_FILE: its layout is lib/core/reqfile.h (a test compares
# these constants with it). 4096 bytes, little-endian:
#   0 magic "SPOTDREQ", 8 u32 version (2), 12 u32 reserved,
#   16 u64 seq (spotd: the id of the newest request; 0 = none yet),
#   24 u64 served (spotd: = seq once that checkpoint is complete or the
#   request was dropped), 32 u64 polls (this module: made nonzero at a
#   poll that finds it 0; spotd zeroes it when it starts the trainer and
#   only tests it for zero), 40 u64 attached (this module: one more per
#   import), 48 i64 deadline (spotd, with every request: 0 = none known,
#   else unix ms by which the checkpoint must be complete; deadline()),
#   the rest reserved (zero).
# A request is pending when seq > served and seq is not the seq this
# process took last: anything may have been written into the file, so
# seq is not trusted to only grow (a garbage seq is taken once; spotd's
# next request has another). The counters are read with pread() on a
# descriptor kept open, never through the mapping: a file truncated under
# a mapping kills the process that reads it (SIGBUS). The mapping
# (PROT_READ, never read) is how spotd recognises a process this module
# serves (the file's device and inode in /proc/PID/maps), so it is made at
# the first poll (not at import: a process that never polls takes the
# signal) and never closed. $SPOTD_REQUEST_ID ("DEV:INO") names spotd's
# file: another file at the path (renamed over it) is refused.

REQ_SIZE = 4096
REQ_MAGIC = b"SPOTDREQ"
REQ_VERSION = 2
REQ_ENV_ID = "SPOTD_REQUEST_ID"
_OFF_VERSION, _OFF_SEQ, _OFF_SERVED = 8, 16, 24
_OFF_POLLS, _OFF_ATTACHED = 32, 40
_OFF_DEADLINE = 48
_U64X3 = struct.Struct("<QQQ")
_U64 = struct.Struct("<Q")
_U64_MASK = (1 << 64) - 1

_req = None        # (fd, mmap) of $SPOTD_REQUEST_FILE once polled, or None
_req_path = None   # its path, when the channel is usable
_taken = 0         # the seq this process took last (process-local)


def _open_channel(path, mapped=True):
    """(fd, mapping or None) of the request file at path, or raises
    OSError or ValueError saying why it cannot serve."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        want = os.environ.get(REQ_ENV_ID)
        if want and want != "%d:%d" % (st.st_dev, st.st_ino):
            raise ValueError("not spotd's file (%s is %d:%d)"
                             % (REQ_ENV_ID, st.st_dev, st.st_ino))
        head = os.pread(fd, 12, 0)
        if len(head) < 12 or head[0:8] != REQ_MAGIC or \
                struct.unpack_from("<I", head, _OFF_VERSION)[0] != REQ_VERSION:
            raise ValueError("not a spotd request file (header %r)" % head)
        m = None
        if mapped:  # not ours: spotd must not count this process as served
            m = mmap.mmap(fd, REQ_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        return fd, m
    except BaseException:
        os.close(fd)
        raise


def _read_counters(fd):
    """(seq, served, polls); zeros when the file was cut short. spotd
    writes seq and served in one pwrite(); a read that saw a request is
    read again, so a torn read does not make one up."""
    b = os.pread(fd, 24, _OFF_SEQ)
    if len(b) < 24:
        return 0, 0, 0
    a = _U64X3.unpack(b)
    if a[0] > a[1] and a[0] != _taken:
        b = os.pread(fd, 24, _OFF_SEQ)
        a = _U64X3.unpack(b) if len(b) == 24 else (0, 0, 0)
    return a


def _read_stable(fd, off):
    """8 bytes at off, read until two reads agree (at most 4): spotd may
    rewrite the slot while it is read, and a torn value would be a
    made-up deadline."""
    b = os.pread(fd, 8, off)
    for _ in range(3):
        again = os.pread(fd, 8, off)
        if again == b:
            break
        b = again
    return b


def request_channel():
    """The path of the request file this process serves through, or None
    (no spotd, or the signal fallback)."""
    return _req_path


def _mapped():
    """The descriptor of the channel, opened and mapped at the first use;
    None without."""
    global _req, _req_path
    if _req is None and _req_path is not None:
        try:
            _req = _open_channel(_req_path)
        except (OSError, ValueError) as e:
            print("spotd: warning: request file %s unusable (%s)" %
                  (_req_path, e), file=sys.stderr, flush=True)
            _req_path = None
    return _req[0] if _req is not None else None


def _pending_seq():
    """The seq of the request pending for this process, or 0."""
    fd = _mapped()
    if fd is None:
        return 0
    try:
        seq, served, _ = _read_counters(fd)
    except OSError:
        return 0
    if seq > served and seq != _taken:
        return seq
    return 0


def pending():
    """True when spotd's request channel holds a request this process has
    not taken yet (or the local flag is set). Local: no collective, does
    not count as a poll and takes nothing; checkpoint_requested() is the
    call for a training loop."""
    return _pending_seq() > 0 or _flag.is_set()


def deadline():
    """Seconds left (a float, 0.0 once it passed) until the checkpoint
    spotd asks for must be complete (its SPOTD_COMPLETE marker written)
    for spotd to commit it before the node goes away, or None when no
    deadline is known (no notice or SIGTERM yet, no spotd, the signal
    fallback). spotd has already kept its own upload time out of it (its
    last upload's size at its measured rate, when one was measured): a
    trainer short of time saves less, or nothing, rather than a
    checkpoint that cannot be committed. Local: no collective, not a
    poll; it reads the file without mapping it."""
    if _req_path is None:
        return None
    try:
        if _req is not None:
            b = _read_stable(_req[0], _OFF_DEADLINE)
        else:  # not mapped: spotd must not count this process as served
            fd, _ = _open_channel(_req_path, mapped=False)
            try:
                b = _read_stable(fd, _OFF_DEADLINE)
            finally:
                os.close(fd)
    except (OSError, ValueError):
        return None
    ms = struct.unpack("<q", b)[0] if len(b) == 8 else 0
    if ms <= 0:
        return None
    return max(0.0, ms / 1000.0 - time.time())


# ---------------------------------------------------------------- signal

def _parse_signal(sig):
    """A signal number (int) from an int, a number ("38"), a name ("USR1",
    "SIGUSR2") or SIGRTMIN+N / SIGRTMAX-N. Real-time signals have no
    signal.Signals member, so plain ints come back for them."""
    def known(n):
        try:
            return signal.Signals(n)
        except ValueError:
            if 1 <= n < signal.NSIG:
                return n
            raise ValueError("unknown signal: %s" % sig) from None
    if isinstance(sig, int):
        return known(sig)
    name = str(sig).strip().upper()
    if name.isdigit():
        return known(int(name))
    if not name.startswith("SIG"):
        name = "SIG" + name
    for base in ("SIGRTMIN", "SIGRTMAX"):
        if name.startswith(base) and name != base:
            rest = name[len(base):]
            if rest[:1] in "+-" and rest[1:].isdigit():
                return known(int(getattr(signal, base)) + int(rest))
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError("unknown signal: %s" % sig) from None


def _on_signal(signum, frame):
    # Only a flag: the training state is consistent only between steps.
    _flag.set()


def install(sig=None):
    """Installs the checkpoint-signal handler: sig, else $SPOTD_SIGNAL,
    else SIGUSR1. Done at import only when there is no request channel;
    call it yourself to take the signal anyway. Only from the main thread.
    Returns the signal (a signal.Signals, or an int for a real-time one)."""
    global _installed
    s = _parse_signal(sig or os.environ.get("SPOTD_SIGNAL") or "USR1")
    if _installed is not None and _installed != s:
        signal.signal(_installed, signal.SIG_DFL)
    signal.signal(s, _on_signal)
    _installed = s
    return s


def request():
    """Asks for a checkpoint from inside the program (as the signal does)."""
    _flag.set()


_dist_mod = []  # torch.distributed once torch is imported (a cache)


def _dist():
    """torch.distributed when it is imported and initialised, else None.
    Never imports torch itself."""
    if not _dist_mod:
        if "torch" not in sys.modules:
            return None
        try:
            import torch.distributed as dist
        except ImportError:
            return None
        if not dist.is_available():
            return None
        _dist_mod.append(dist)
    dist = _dist_mod[0]
    if not dist.is_initialized():
        return None
    return dist


def _agree_max(dist, value):
    """The maximum of an int over all ranks (one all_reduce)."""
    import torch
    dev = "cpu"
    if dist.get_backend() == "nccl":
        dev = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([int(value)], dtype=torch.int32, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


# The ranks' agreement in checkpoint_requested(): a CPU flag all-reduced
# (MAX) over a gloo group of its own, started without waiting and waited
# for at the next call. Every rank makes the same calls, so every rank
# gets the same answer at the same call, one call after a rank saw the
# request; nothing touches a device, and a call waits only for the ranks
# to have made the previous one (the first call waits for its own result:
# a request made before the start is answered there).
_agree = {"group": None, "work": None, "buf": None, "pid": None,
          "world": None, "atexit": False}

# How long the exit hook waits for the last posted flag to be reduced.
_AGREE_EXIT_WAIT = 10.0


def _agree_close():
    """At interpreter exit (atexit, while Python is still whole): waits for
    the last posted agreement and frees the helper's group. Left to the
    interpreter's finalisation, a gloo group destroyed then can take the
    process down with SIGABRT ("terminate called without an active
    exception"), after a clean destroy_process_group() of the trainer's
    own: the helper's group is not in torch's map any more, only here."""
    if _agree["pid"] != os.getpid() or _agree["group"] is None:
        return
    work = _agree["work"]
    if work is not None:
        end = time.monotonic() + _AGREE_EXIT_WAIT
        try:
            while not work.is_completed() and time.monotonic() < end:
                time.sleep(0.005)
            if not work.is_completed():
                return  # a peer is gone: freeing would wait on it
        except RuntimeError:
            pass
    group = _agree["group"]
    _agree.update(group=None, work=None, buf=None, world=None)
    dist = _dist_mod[0] if _dist_mod else None
    try:
        if dist is not None and dist.is_initialized():
            dist.destroy_process_group(group)
    except (RuntimeError, ValueError):
        pass
    del group


def _agree_next(dist, local):
    """The MAX over the ranks of the local flags posted at the previous
    call (at the first call: of this one); posts this call's flag, or 0
    when the answer is True (what it takes is not asked again)."""
    import torch
    world = getattr(dist.group, "WORLD", None)
    known = _agree["world"]() if _agree["world"] is not None else None
    if _agree["group"] is None or _agree["pid"] != os.getpid() or \
            known is not world:
        # First call, a forked child, or a new default process group (held
        # weakly: the trainer's destroy_process_group() frees it).
        _agree.update(group=dist.new_group(backend="gloo"), work=None,
                      buf=None, pid=os.getpid(), world=weakref.ref(world) if world is not None else None)
        if not _agree["atexit"]:
            atexit.register(_agree_close)
            _agree["atexit"] = True
    group = _agree["group"]
    if _agree["work"] is None:
        buf = torch.tensor([int(local)], dtype=torch.int32)
        dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
    else:
        _agree["work"].wait()
        buf = _agree["buf"]
    asked = int(buf[0]) > 0
    nxt = torch.tensor([0 if asked else int(local)], dtype=torch.int32)
    _agree["work"] = dist.all_reduce(nxt, op=dist.ReduceOp.MAX, group=group,
                                     async_op=True)
    _agree["buf"] = nxt
    return asked


def checkpoint_requested():
    """True when a checkpoint was asked for since the last True: a request
    of spotd's channel this process has not taken, or the local flag (the
    signal fallback, or request()). Call it once per step at the safe
    point, on every rank under torch.distributed: it is then a collective
    and every rank gets the same answer at the same call, the call after
    the one where a rank first saw the request (the first call answers
    for itself). The ranks agree on a CPU flag over a gloo group of the
    helper's own, reduced in the background: no host-device
    synchronisation, and a call does not wait for a slower rank to reach
    it. A True takes the pending request: it is not answered again, spotd
    marks it served once the checkpoint is complete."""
    global _taken
    fd = _req[0] if _req is not None else _mapped()
    seq = 0
    local = False
    if fd is not None:
        try:
            seq, served, polls = _read_counters(fd)
            if polls == 0:  # the first poll since spotd started the trainer
                os.pwrite(fd, _U64.pack(1), _OFF_POLLS)
        except OSError:
            seq, served = 0, 0
        local = seq > served and seq != _taken
    local = local or _flag.is_set()
    dist = _dist()
    if dist is not None and dist.get_world_size() > 1:
        asked = _agree_next(dist, local)
    else:
        asked = local
    if asked:
        if local:
            _taken = seq
        _flag.clear()  # a signal during the save asks again
    return asked


# ----------------------------------------------------------- environment

def under_spotd():
    """True when this process was started by spotd."""
    return bool(os.environ.get("SPOTD_SOCKET"))


def ckpt_root():
    """The folder checkpoints go in (absolute): $SPOTD_CKPT_DIR, or
    ./checkpoints without spotd."""
    return os.path.abspath(os.environ.get("SPOTD_CKPT_DIR") or DEFAULT_ROOT)


def resume_dir():
    """The (absolute) folder to resume from, or None: $SPOTD_RESUME_DIR, set
    by spotd only when it restored a checkpoint before launch."""
    d = os.environ.get("SPOTD_RESUME_DIR")
    return os.path.abspath(d) if d else None


def restart_count():
    """How many times this job was relaunched ($SPOTD_RESTART_COUNT, 0)."""
    try:
        return int(os.environ.get("SPOTD_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def _env_int(*names, default=0):
    for n in names:
        v = os.environ.get(n)
        if v:
            try:
                return int(v)
            except ValueError:
                pass
    return default


def rank():
    """This process's global rank: torch.distributed's when initialised,
    else $RANK (torchrun), else $SPOTD_RANK (spotd --rank), else 0."""
    dist = _dist()
    if dist is not None:
        return dist.get_rank()
    return _env_int("RANK", "SPOTD_RANK")


def world_size():
    dist = _dist()
    if dist is not None:
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", default=1)


# Where launchers put the rank among the node's processes, first match
# wins: an explicit override, torchrun (also Lightning, accelerate,
# DeepSpeed), srun, Open MPI, MPICH/Intel MPI (Hydra), PMI, MVAPICH2.
# torchrun under srun: LOCAL_RANK (the worker) comes before SLURM_LOCALID
# (the launcher's task).
LOCAL_RANK_VARS = ("SPOTD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID",
                   "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                   "PMI_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")


def local_rank():
    """The rank among this node's processes: $SPOTD_LOCAL_RANK when set,
    else what the launcher set (torchrun's $LOCAL_RANK, srun's
    $SLURM_LOCALID, Open MPI's $OMPI_COMM_WORLD_LOCAL_RANK, MPICH's
    $MPI_LOCALRANKID, $PMI_LOCAL_RANK, MVAPICH2's
    $MV2_COMM_WORLD_LOCAL_RANK), else 0. The node's local rank 0 writes
    the marker and ck.writer's files: one of each per node."""
    return _env_int(*LOCAL_RANK_VARS)


# ------------------------------------------------------------ durability

def _fsync_path(path, directory=False):
    flags = os.O_RDONLY | (os.O_DIRECTORY if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path):
    """fsync every regular file and folder under path (path included)."""
    for d, dirs, files in os.walk(path):
        for n in files:
            p = os.path.join(d, n)
            if os.path.isfile(p) and not os.path.islink(p):
                _fsync_path(p)
        _fsync_path(d, directory=True)


def _notify(path, timeout=5.0):
    """Tells the spotd of $SPOTD_SOCKET that path is complete (the request
    `spotctl done` sends). No socket: nothing to do (the marker is enough).
    Returns spotd's answer, or None."""
    sock_path = os.environ.get("SPOTD_SOCKET")
    if not sock_path:
        return None
    # A folder of SPOTD_CKPT_DIR goes by its bare name: spotd resolves it
    # against its own (maybe relative) --ckpt-dir.
    arg = path
    if os.environ.get("SPOTD_CKPT_DIR") and \
            os.path.dirname(path) == ckpt_root():
        arg = os.path.basename(path)
    return _call("done", {"dir": arg}, timeout)


def _call(cmd, args, timeout):
    """One request on $SPOTD_SOCKET; spotd's answer, or None."""
    sock_path = os.environ.get("SPOTD_SOCKET")
    if not sock_path:
        return None
    req = json.dumps({"v": 1, "id": 1, "cmd": cmd, "args": args})
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(sock_path)
            s.sendall(req.encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n") and len(buf) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
    except OSError:
        return None  # spotd gone or busy: its folder watch sees the marker
    try:
        return json.loads(buf.decode("utf-8", "replace"))
    except ValueError:
        return None


def _write_file(name, body):
    """Writes body into file name (made or truncated) and fsyncs it."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                 0o644)
    try:
        while body:
            body = body[os.write(fd, body):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_marker(path, body):
    """Writes path/SPOTD_COMPLETE whole: body into a file beside the folder
    whose name starts with a dot (spotd never takes one for a checkpoint),
    fsynced, then renamed into the folder. spotd may read the marker the
    moment it appears: written in place, it could be read empty between
    its creation and the write, and a folder named checkpoint-N would
    then be committed with no step. In place only where the rename cannot
    be done (the folder on another file system, a parent not writable)."""
    tmp = os.path.join(os.path.dirname(path), ".spotd-marker-%d-%d" % (
        os.getpid(), threading.get_ident()))
    try:
        _write_file(tmp, body)
        os.rename(tmp, os.path.join(path, MARKER))
        return
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    _write_file(os.path.join(path, MARKER), body)


def done(path, strict=True, step=None):
    """Marks the checkpoint folder path complete, as `spotctl done` does:
    fsyncs everything in it, creates SPOTD_COMPLETE (fsynced, with the
    folder and its parent), then tells spotd over $SPOTD_SOCKET when there
    is one. Call it only once every file is written. step: the training
    step the folder holds; the marker then says "step=N", and spotd orders
    checkpoints by it whatever their names (without it, an empty marker).
    Returns the folder's name. When spotd refuses the folder (not directly
    under its SPOTD_CKPT_DIR, say) it raises RuntimeError, or with
    strict=False prints one warning line on stderr."""
    path = os.path.abspath(path)
    body = b""
    if step is not None:
        step = int(step)
        if step < 0:
            raise ValueError("done(): step must be >= 0, not %d" % step)
        body = b"step=%d\n" % step
    _fsync_tree(path)
    _write_marker(path, body)
    _fsync_path(path, directory=True)
    _fsync_path(os.path.dirname(path), directory=True)
    ans = _notify(path)
    if ans is not None and not ans.get("ok") and \
            "already handled" not in str(ans.get("error", "")):
        msg = "spotd refused %s: %s" % (path, ans.get("error"))
        if strict:
            raise RuntimeError(msg)
        print("spotd: warning: " + msg, file=sys.stderr, flush=True)
    return os.path.basename(path)


# ------------------------------------------------------------------ step

_step_sent = [None, 0.0]  # last step sent, when (time.monotonic())
STEP_MIN_INTERVAL = 0.1  # seconds between two step reports


def report_step(step, force=False):
    """Tells spotd the trainer's current step (a completed optimizer step),
    for the job history: `spotctl history` then counts the steps each
    preemption lost. Cheap: at most one request per STEP_MIN_INTERVAL
    (force=True sends anyway); without spotd, or when spotd does not
    answer within 1 s, nothing happens. Returns True when sent."""
    step = int(step)
    if step < 0 or not os.environ.get("SPOTD_SOCKET"):
        return False
    now = time.monotonic()
    if not force and _step_sent[0] is not None and \
            now - _step_sent[1] < STEP_MIN_INTERVAL:
        return False
    _step_sent[0], _step_sent[1] = step, now
    ans = _call("step", {"step": step}, 1.0)
    return ans is not None and bool(ans.get("ok"))


# ------------------------------------------------------------ checkpoint

def _new_folder(root, base):
    """Creates root/base (root/base-1, ... when taken) and returns its path.
    A folder is never reused: spotd may be uploading it."""
    os.makedirs(root, exist_ok=True)
    for i in range(1000):
        path = os.path.join(root, base if i == 0 else "%s-%d" % (base, i))
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free checkpoint name", base)


class _SyncedFile:
    """A binary file that is flushed and fsynced when closed."""

    def __init__(self, path, mode):
        self._f = open(path, mode)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        if self._f.closed:
            return
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
        finally:
            self._f.close()


class Checkpoint:
    """A checkpoint folder being written; see checkpoint()."""

    def __init__(self, name=None, step=None, root=None):
        if name is None and step is None:
            raise ValueError("checkpoint(): give a name or a step")
        self.base = name if name is not None else "step-%06d" % step
        self.step = step
        if not self.base or "/" in self.base or self.base.startswith("."):
            raise ValueError("bad checkpoint name: %r" % self.base)
        self.root = os.path.abspath(root) if root else ckpt_root()
        self.path = None
        self.name = None
        self.complete = False
        self._dist = _dist()
        if self._dist is not None:
            self.writer = local_rank() == 0
        else:
            self.writer = True

    def open(self, filename, mode="wb"):
        """A file in the folder, fsynced when closed (use it with `with`)."""
        if os.path.isabs(filename) or ".." in filename.split("/"):
            raise ValueError("a file inside the checkpoint: %r" % filename)
        full = os.path.join(self.path, filename)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        return _SyncedFile(full, mode)

    def __enter__(self):
        dist = self._dist
        if self.step is not None and (dist is None or dist.get_rank() == 0):
            report_step(self.step, force=True)  # the state this one holds
        if dist is None or dist.get_world_size() == 1:
            self.path = _new_folder(self.root, self.base)
        else:
            # Global rank 0 picks the name (on its node); every node's local
            # leader creates that folder; nobody writes before it exists.
            name = [None]
            if dist.get_rank() == 0:
                name[0] = os.path.basename(_new_folder(self.root, self.base))
            dist.broadcast_object_list(name, src=0)
            self.path = os.path.join(self.root, name[0])
            if self.writer and dist.get_rank() != 0:
                os.makedirs(self.path, exist_ok=True)
            dist.barrier()
        self.name = os.path.basename(self.path)
        return self

    def __exit__(self, exc_type, exc, tb):
        failed = exc_type is not None
        dist = self._dist
        if dist is not None and dist.get_world_size() > 1:
            try:
                # Doubles as the barrier: every rank has left its block.
                any_failed = _agree_max(dist, failed) > 0
            except Exception:
                if failed:
                    return False  # keep the original exception
                raise
            if any_failed and not failed:
                raise CheckpointAbandoned(
                    "checkpoint %s abandoned: another rank failed" % self.name)
        if failed:
            return False  # no marker: spotd never uploads this folder
        if self.writer:
            # a refusal must not kill training
            done(self.path, strict=False, step=self.step)
        self.complete = True
        return False


def checkpoint(name=None, step=None, root=None):
    """A context manager for one checkpoint:

        with spotd.checkpoint(step=step) as ck:   # ck.path, ck.name
            with ck.open("model.pt") as f:
                torch.save(model.state_dict(), f)

    The folder is root (default ckpt_root()) / name, or step-NNNNNN for a
    step; a taken name gets a suffix (-1, -2, ...). SPOTD_COMPLETE is
    written when the block ends without an exception, after every file
    and folder is fsynced; never after an exception."""
    return Checkpoint(name=name, step=step, root=root)


def _setup():
    """At import: the request channel when spotd offers one, else the
    signal handler (main thread only)."""
    global _req_path
    path = os.environ.get("SPOTD_REQUEST_FILE")
    if path:
        try:
            fd, _ = _open_channel(path, mapped=False)
            try:
                b = os.pread(fd, 8, _OFF_ATTACHED)
                att = _U64.unpack(b)[0] if len(b) == 8 else 0
                os.pwrite(fd, _U64.pack((att + 1) & _U64_MASK), _OFF_ATTACHED)
            finally:
                os.close(fd)  # opened and mapped for good at the first poll
            _req_path = path
            return  # served through the channel: no signal handler
        except (OSError, ValueError) as e:
            print("spotd: warning: request file %s unusable (%s); taking "
                  "checkpoint requests by signal" % (path, e),
                  file=sys.stderr, flush=True)
    if threading.current_thread() is threading.main_thread():
        try:
            install()
        except ValueError as e:  # a bad $SPOTD_SIGNAL
            print("spotd: %s; using SIGUSR1" % e, file=sys.stderr)
            install("USR1")


_setup()

# Staged saves (python/spotd/staged.py): imports torch only when used.
from spotd.staged import StagedSave, StagedSaver, stage  # noqa: E402
