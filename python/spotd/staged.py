"""Staged saves: a checkpoint that costs the trainer a copy into memory.

    saver = spotd.StagedSaver()                 # or spotd.stage(...)
    ...
    if spotd.checkpoint_requested():
        if saver.persisting is None:            # else: that one answers it
            saver.stage({"model": model.state_dict(),
                         "optim": opt.state_dict(),
                         "rng": torch.get_rng_state()}, step=step)
    ...
    saver.wait()                                # before the trainer exits

stage() copies every tensor of the state (nested dicts, lists and tuples
of tensors and plain objects) into host buffers the saver keeps between
checkpoints, deep-copies everything else, and returns: training goes on
while a background thread writes the snapshot into a new checkpoint
folder (torch.save into FILENAME), fsyncs it, and only then writes
SPOTD_COMPLETE through spotd.done(step=N). Until the marker spotd does
not upload the folder, so a trainer killed during the persist (kill -9
included) leaves no torn checkpoint: the previous one stays LATEST.

- The snapshot is a real copy: the optimizer may change the tensors in
  place right after stage() returns. CPU tensors are copied with
  Tensor.copy_ on several threads (the caller's and a small pool of its
  own; the threads argument, else $SPOTD_STAGE_THREADS, else the usable
  CPUs up to MAX_THREADS, divided by torch's intra-op threads), a large
  tensor in pieces of PIECE bytes so that the threads share it; CUDA
  tensors into pinned host buffers with non_blocking copies and one
  synchronisation at the end.
- The buffers are allocated at the first stage() (or by reserve()) and
  reused while the state keeps its layout (same paths, shapes, dtypes):
  a fresh buffer pays a page fault per page on first touch, a reused one
  does not. A CPU buffer of HUGE bytes or more is anonymous memory
  advised for transparent huge pages (MADV_HUGEPAGE): a fault per 2 MiB
  instead of per 4 KiB, at the first touch and wherever the kernel or a
  hypervisor makes the pages fault again. One set of buffers: a stage()
  while the previous persist still runs waits for it (one line on stderr
  says so).
- Bounded: the buffers never exceed the limit (the limit argument, else
  $SPOTD_STAGE_MEMORY: bytes or a size such as 8G or 512M; default half
  the machine's memory). A state that does not fit is saved synchronously
  (torch.save + done(), as without staging), with one line on stderr. 0
  turns staging off. The buffers are the trainer's memory: they do not
  count against spotd's --memory (spotd's own buffers).
- A request while a persist runs: spotd marks a request served when a
  checkpoint folder gets its marker after the request, so the save in
  flight answers it; `saver.persisting` (the handle, or None) tells.
  Staging again then would wait for that persist and write a second
  checkpoint.
- Errors of the background persist (disk full...) leave no marker; they
  are printed on stderr when they happen and raised by the handle's
  wait() (and by the next stage()).
- Under torch.distributed (world size > 1) stage() is a collective, as
  spotd.checkpoint() is: global rank 0 names the folder, every node's
  local rank 0 creates it, snapshots the state, persists it and writes
  that node's marker; the other ranks copy nothing and return a handle
  that is done. This is DDP's case (the state is replicated); a sharded
  state (FSDP) is saved with spotd.checkpoint() or spotd.dcp.
- At interpreter exit the persist in flight is finished (the thread is
  not a daemon thread); a signal that kills the trainer leaves no marker.

Reading a staged checkpoint back: torch.load(os.path.join(
spotd.resume_dir(), spotd.staged.FILENAME)) gives the state as staged.
"""
import copy
import itertools
import mmap
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import spotd

__all__ = ["StagedSaver", "StagedSave", "stage", "FILENAME", "ENV_MEMORY",
           "ENV_THREADS", "parse_size"]

FILENAME = "state.pt"
ENV_MEMORY = "SPOTD_STAGE_MEMORY"
ENV_THREADS = "SPOTD_STAGE_THREADS"
MAX_THREADS = 8  # the default's cap: a few threads fill the memory bus
PIECE = 16 << 20  # bytes: a large CPU tensor is copied in pieces this big
HUGE = 2 << 20  # bytes: a CPU buffer this large is mapped for huge pages

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30,
          "T": 1 << 40}


def parse_size(text):
    """Bytes from "1073741824", "512M", "8G", "1.5G", "64KiB"."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$",
                 str(text), re.I)
    if not m:
        raise ValueError("not a size: %r (bytes, or a number with K, M, G "
                         "or T)" % text)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _default_limit():
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return total // 2


def _threads_arg(threads):
    """The copy threads asked for (threads=, else $SPOTD_STAGE_THREADS),
    or None for the default."""
    if threads is None:
        env = os.environ.get(ENV_THREADS, "").strip()
        if not env:
            return None
        try:
            threads = int(env)
        except ValueError:
            raise ValueError("%s=%r: not a number of threads"
                             % (ENV_THREADS, env)) from None
    if isinstance(threads, bool) or not isinstance(threads, int) or \
            threads < 1:
        raise ValueError("StagedSaver: threads must be an integer >= 1, "
                         "not %r" % (threads,))
    return int(threads)


def default_threads():
    """The copy threads of a saver given none: the CPUs this process may
    run on, at most MAX_THREADS, divided by torch's intra-op threads
    (each copy_ of a thread may use them all), at least 1."""
    import torch
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_THREADS) // max(1, torch.get_num_threads()))


def _gib(n):
    if n >= 1 << 30:
        return "%.2f GiB" % (n / float(1 << 30))
    return "%.1f MiB" % (n / float(1 << 20))


def _say(msg):
    print("spotd: " + msg, file=sys.stderr, flush=True)


def _torch_save(state, folder, filename):
    """The default writer: torch.save into folder/filename (done() fsyncs
    it with the folder before the marker)."""
    import torch
    with open(os.path.join(folder, filename), "wb") as f:
        torch.save(state, f)


class StagedSave:
    """One staged checkpoint (what stage() returns): path, name, step,
    staged (False: saved synchronously, or not this rank's to save),
    error (the persist's exception, or None)."""

    def __init__(self, path, step, staged):
        self.path = path
        self.name = os.path.basename(path) if path else None
        self.step = step
        self.staged = staged
        self.error = None
        self.seconds = None  # how long the persist took
        self.filename = FILENAME
        self.mark = True
        self._done = threading.Event()

    def done(self):
        """True once the persist is over (marked, or failed)."""
        return self._done.is_set()

    def wait(self, timeout=None):
        """Waits until the checkpoint is persisted and marked; raises the
        persist's error. Returns False on a timeout, else True."""
        if not self._done.wait(timeout):
            return False
        if self.error is not None:
            raise RuntimeError("staged checkpoint %s failed: %s"
                               % (self.name, self.error)) from self.error
        return True

    def _finish(self, error=None, seconds=None):
        self.error = error
        self.seconds = seconds
        self._done.set()


class StagedSaver:
    """Staged checkpoints with buffers kept between them; see the module.

    limit: the most bytes of staging buffers (default $SPOTD_STAGE_MEMORY,
    else half the machine's memory; 0: always synchronous). filename: the
    file in the checkpoint folder. writer(snapshot, folder, filename):
    what the background thread runs to write the snapshot (default
    torch.save); it must leave every file in folder (done() fsyncs them
    before the marker). root: the checkpoints' folder (spotd.ckpt_root()).
    threads: how many threads copy the CPU tensors in stage(), the
    caller's included (default $SPOTD_STAGE_THREADS, else
    default_threads(); 1: the calling thread alone).
    """

    def __init__(self, limit=None, filename=FILENAME, writer=None,
                 root=None, threads=None):
        if limit is None:
            env = os.environ.get(ENV_MEMORY)
            limit = parse_size(env) if env else _default_limit()
        elif isinstance(limit, str):
            limit = parse_size(limit)
        if int(limit) < 0:
            raise ValueError("StagedSaver: limit must be >= 0")
        self.limit = int(limit)
        self.threads = _threads_arg(threads)  # None: default_threads()
        self.filename = filename
        self.writer = writer or _torch_save
        self.root = root
        self._bufs = {}       # path in the state -> host tensor
        self._inflight = None  # (StagedSave, thread)
        self._last_error = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ state
    @property
    def persisting(self):
        """The StagedSave whose persist is still running, or None."""
        cur = self._inflight
        if cur is not None and not cur[0].done():
            return cur[0]
        return None

    @property
    def staged_bytes(self):
        """Bytes of the staging buffers held now."""
        return sum(_nbytes(b) for b in self._bufs.values())

    def wait(self, timeout=None):
        """Waits for the persist in flight, if any (raises its error)."""
        cur = self._inflight
        if cur is None:
            return True
        return cur[0].wait(timeout)

    def release(self):
        """Waits for the persist in flight and frees the buffers."""
        cur = self._inflight
        if cur is not None:
            cur[1].join()
        self._bufs = {}

    def reserve(self, state):
        """Allocates (and touches) the buffers for state's layout ahead of
        the first stage(), outside the checkpoint's stall. Returns the
        bytes reserved, or 0 when the state does not fit the limit."""
        leaves = self._leaves(state)
        need = sum(_nbytes(t) for _, t in leaves)
        if need > self.limit:
            return 0
        with self._lock:
            self._wait_previous(None)
            self._buffers(leaves)
        return need

    def _leaves(self, state):
        """(key, tensor) of every tensor of state, as the buffers are
        keyed."""
        leaves = []
        _walk(state, (), leaves, {})
        return leaves

    # ------------------------------------------------------------ stage
    def stage(self, state, step=None, name=None, folder=None,
              filename=None, mark=True):
        """Snapshots state into host memory and persists it in the
        background into a new checkpoint folder (step-NNNNNN for step, or
        name), marked with step. Returns a StagedSave at once (once the
        copy is done).

        folder: an existing folder to write into instead (no new folder,
        no collective: the caller made it, as spotd.lightning does);
        filename: instead of the saver's; mark=False: no marker (the
        file alone, in the background)."""
        import torch
        if name is None and step is None and folder is None:
            raise ValueError("stage(): give a step or a name")
        with self._lock:
            return self._stage(torch, state, step, name, folder, filename,
                               mark)

    def _stage(self, torch, state, step, name, folder, filename, mark):
        what = step if step is not None else (name or folder)
        if folder is None:
            # A collective follows (the folder): every rank learns whether
            # a writer's previous persist failed and raises alike, rather
            # than the writers raising alone and the others waiting in
            # the collective for ever.
            err = self._join_previous(what)
            dist = spotd._dist()
            failed = 1 if err is not None else 0
            if dist is not None and dist.get_world_size() > 1:
                failed = spotd._agree_max(dist, failed)
            if failed:
                if err is not None:
                    raise RuntimeError("staged checkpoint %s failed: %s"
                                       % (err[0], err[1])) from err[1]
                raise RuntimeError("a staged checkpoint failed on another "
                                   "rank (its writer says why)")
        else:
            self._wait_previous(what)
        filename = filename or self.filename
        if folder is None:
            ck = spotd.Checkpoint(name=name, step=step, root=self.root)
            ck.__enter__()  # the folder (a collective under torch.distributed)
            path, writer = ck.path, ck.writer
        else:
            path, writer = os.path.abspath(folder), True
        h = StagedSave(path, step, False)
        h.filename, h.mark = filename, mark
        if not writer:  # another rank of the node writes and marks it
            h._finish()
            return h
        leaves = []
        _walk(state, (), leaves, {})
        need = sum(_nbytes(t) for _, t in leaves)
        if need > self.limit:
            _say("staged save of %s: the state (%s) does not fit the staging "
                 "limit (%s, %s): saving it synchronously"
                 % (os.path.join(h.name, filename), _gib(need),
                    _gib(self.limit), ENV_MEMORY))
            self._bufs = {}
            t0 = time.monotonic()
            try:
                self._write(h, state)
            except BaseException as e:
                h._finish(e, time.monotonic() - t0)
                raise
            h._finish(None, time.monotonic() - t0)
            return h
        bufs = self._copy(torch, leaves)
        snap = _rebuild(state, (), bufs, {})
        h.staged = True
        th = threading.Thread(target=self._persist, args=(h, snap),
                              name="spotd-persist", daemon=False)
        self._inflight = (h, th)
        th.start()
        return h

    def _copy(self, torch, leaves):
        """This saver's buffers for leaves, each holding its tensor's bytes
        as they are now (CUDA copies queued first, CPU tensors copied by
        the copy threads meanwhile, then the CUDA copies waited for once
        per device); a leaf without a buffer maps to itself."""
        bufs = self._buffers(leaves)
        devices = set()
        pieces = []  # (buffer, source) of CPU tensors, large ones split
        for key, t in leaves:
            b = bufs[key]
            if b is t:
                continue  # no buffer (not strided): cloned in _rebuild
            t = t.detach()
            if t.is_cuda:
                devices.add(t.device)
                b.copy_(t, non_blocking=True)
            elif t.device.type == "cpu":
                _pieces(b, t, pieces)
            else:
                b.copy_(t)
        _copy_pieces(pieces, self.threads)
        for dev in devices:  # the copies are queued: wait for them once
            torch.cuda.synchronize(dev)
        return bufs

    def _join_previous(self, what):
        """Waits for the persist in flight; (its name, its error) when it
        failed, else None."""
        cur = self._inflight
        if cur is None:
            return None
        h, th = cur
        if not h.done() and what is not None:
            _say("staged save of %s waits for the previous one (%s) to "
                 "persist: one set of staging buffers"
                 % (_label(what), h.name))
        th.join()
        self._inflight = None
        return (h.name, h.error) if h.error is not None else None

    def _wait_previous(self, what):
        err = self._join_previous(what)
        if err is not None:
            raise RuntimeError("staged checkpoint %s failed: %s"
                               % (err[0], err[1])) from err[1]

    def _buffers(self, leaves):
        """The host buffer of every leaf: reused when the layout is the
        same, else allocated (and touched); buffers of paths gone are
        dropped first, so the total stays within the limit."""
        import torch
        keep = {}
        for key, t in leaves:
            b = self._bufs.get(key)
            if b is not None and t.layout == torch.strided and \
                    b.shape == t.shape and b.dtype == t.dtype and \
                    b.is_pinned() == bool(t.is_cuda):
                keep[key] = b
        self._bufs = keep  # what is not reused is freed before allocating
        out = dict(keep)
        for key, t in leaves:
            if key in keep:
                continue
            if t.layout != torch.strided:
                # sparse and the like: no buffer, cloned in _rebuild; never
                # kept in _bufs (the user's tensor is no buffer to copy into)
                out[key] = t
                continue
            b = _host_empty(torch, t)
            b.zero_()  # the first touch now, not in a checkpoint's stall
            keep[key] = b
            out[key] = b
        return out

    def _write(self, h, state):
        self.writer(state, h.path, h.filename)
        if h.mark:
            spotd.done(h.path, strict=False, step=h.step)

    def _persist(self, h, snap):
        t0 = time.monotonic()
        try:
            self._write(h, snap)
        except BaseException as e:  # noqa: B902 - reported, never raised here
            _say("staged checkpoint %s not saved (no marker): %s"
                 % (h.name, e))
            h._finish(e, time.monotonic() - t0)
            return
        h._finish(None, time.monotonic() - t0)


def _label(what):
    return "step-%06d" % what if isinstance(what, int) else str(what)


def _nbytes(t):
    return t.numel() * t.element_size()


def _host_empty(torch, t):
    """An uninitialised host tensor shaped as t: pinned for a CUDA tensor;
    for any other of HUGE bytes or more, anonymous memory advised for huge
    pages (the tensor keeps the mapping; it is unmapped with the tensor);
    else, or where that fails, torch.empty."""
    nbytes = _nbytes(t)
    if not t.is_cuda and nbytes >= HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m = mmap.mmap(-1, nbytes,
                          flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            try:
                m.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass  # THP off: 4 KiB pages, as torch.empty's
            return torch.frombuffer(m, dtype=t.dtype,
                                    count=t.numel()).view(t.shape)
        except (OSError, ValueError, TypeError, RuntimeError):
            pass  # a dtype frombuffer lacks, no memory: torch's allocator
    return torch.empty(t.shape, dtype=t.dtype, device="cpu",
                       pin_memory=bool(t.is_cuda))


def _pieces(b, t, out):
    """Appends to out the (buffer, source) pairs that copy CPU tensor t
    into its buffer b: a contiguous tensor larger than PIECE in pieces of
    about PIECE bytes (flat views of both), so that the copy threads
    share it; any other whole."""
    nbytes = _nbytes(t)
    if nbytes <= PIECE or t.dtype != b.dtype or t.is_quantized or \
            t.is_conj() or t.is_neg() or not t.is_contiguous() or \
            not b.is_contiguous():
        out.append((b, t))
        return
    fb, ft = b.view(-1), t.view(-1)
    n = ft.numel()
    step = -(-n // -(-nbytes // PIECE))
    for i in range(0, n, step):
        out.append((fb[i:i + step], ft[i:i + step]))


_pool = {"ex": None, "size": 0, "pid": None}
_pool_lock = threading.Lock()


def _submit(n, fn):
    """Runs fn on n threads of the process's copy pool (made at the first
    use, reused, made again larger or after a fork: a child has none of
    its parent's threads); their futures."""
    with _pool_lock:
        ex = _pool["ex"]
        if ex is None or _pool["size"] < n or _pool["pid"] != os.getpid():
            if ex is not None and _pool["pid"] == os.getpid():
                ex.shutdown(wait=False)  # its idle threads end
            ex = ThreadPoolExecutor(max_workers=n,
                                    thread_name_prefix="spotd-copy")
            _pool.update(ex=ex, size=n, pid=os.getpid())
        return [ex.submit(fn) for _ in range(n)]


def _copy_pieces(pieces, threads):
    """copy_ of every (buffer, source) pair, on threads threads (None:
    default_threads()), the caller's included; returns once all are
    copied (raises the first error). copy_ releases the GIL: the threads
    copy in parallel. A piece is taken by whichever thread is free, so a
    thread the machine runs less (other processes) holds nobody up."""
    n = threads or default_threads()
    n = min(n, len(pieces))
    if n <= 1 or sum(_nbytes(t) for _, t in pieces) < 2 * PIECE:
        for b, t in pieces:
            b.copy_(t)
        return
    nxt = itertools.count()  # next() of it is atomic under the GIL
    stop = []

    def run():
        while not stop:
            i = next(nxt)
            if i >= len(pieces):
                return
            b, t = pieces[i]
            b.copy_(t)

    futs = _submit(n - 1, run)
    err = None
    try:
        run()
    except BaseException as e:  # noqa: B902 - raised below, once all stop
        stop.append(1)
        err = e
    for f in futs:  # none may still write into the buffers on return
        try:
            f.result()
        except BaseException as e:  # noqa: B902
            stop.append(1)
            err = err or e
    if err is not None:
        raise err


def _is_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _walk(obj, key, out, seen):
    """The tensors of obj with their path, once per tensor object."""
    if _is_tensor(obj):
        if id(obj) not in seen:
            seen[id(obj)] = key
            out.append((key, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, key + (k,), out, seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, key + (i,), out, seen)


def _rebuild(obj, key, bufs, seen):
    """obj with every tensor replaced by its buffer and everything else
    deep-copied (a tensor met twice is one buffer, as torch.save keeps)."""
    if _is_tensor(obj):
        first = seen.setdefault(id(obj), key)
        b = bufs.get(first)
        if b is None or b is obj:
            return obj.detach().clone()  # a layout without buffer
        return b
    if isinstance(obj, dict):
        if type(obj) is dict:
            out = {}
        else:  # an OrderedDict (a state_dict keeps _metadata on it)
            try:
                out = copy.copy(obj)
                out.clear()
                if getattr(obj, "__dict__", None):
                    out.__dict__.update(copy.deepcopy(obj.__dict__))
            except Exception:  # noqa: BLE001 - an odd mapping: a plain dict
                out = {}
        for k, v in obj.items():
            out[k] = _rebuild(v, key + (k,), bufs, seen)
        return out
    if isinstance(obj, list):
        return [_rebuild(v, key + (i,), bufs, seen) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        items = [_rebuild(v, key + (i,), bufs, seen)
                 for i, v in enumerate(obj)]
        if hasattr(obj, "_fields"):  # a namedtuple
            return type(obj)(*items)
        return tuple(items)
    return copy.deepcopy(obj)


_default = []


def stage(state, step=None, name=None):
    """StagedSaver.stage() on the process's default saver (made at the
    first call, with $SPOTD_STAGE_MEMORY's limit)."""
    if not _default:
        _default.append(StagedSaver())
    return _default[0].stage(state, step=step, name=name)


def default_saver():
    """The saver stage() uses (made at the first call)."""
    if not _default:
        _default.append(StagedSaver())
    return _default[0]
