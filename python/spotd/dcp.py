"""spotd for torch.distributed.checkpoint (DCP), imported on use:

    import spotd.dcp
    state = {"model": model.state_dict(), "optim": optim.state_dict()}
    if spotd.dcp.load(state):                 # from $SPOTD_RESUME_DIR
        model.load_state_dict(state["model"])
        ...
    while step < steps:
        train_one_step()
        step += 1
        if spotd.checkpoint_requested():      # every rank
            spotd.dcp.save(state, step=step)  # every rank

save() runs on every rank: inside spotd.checkpoint(step=...) each rank
writes its own shard files (and global rank 0 DCP's .metadata) into the
same new folder SPOTD_CKPT_DIR/step-NNNNNN; the marker comes after all of
them (the block's end is a barrier), once per node, by the node's local
rank 0. For FSDP, pass the sharded state dict (FSDP.state_dict_type(...,
SHARDED_STATE_DICT), or torch.distributed.checkpoint.state_dict's
get_state_dict).

DCP's folder is one checkpoint across all ranks: with several nodes,
SPOTD_CKPT_DIR should be on storage every node sees (a node-local folder
holds only that node's shards and, on nodes other than the first, no
.metadata).

DCP comes with torch 2.0 and newer (save/load with checkpoint_id from
2.2; older 2.x use save_state_dict/load_state_dict). On torch 1.13 the
same API is a prototype, torch.distributed._shard.checkpoint, which
spotd.dcp uses when there is no torch.distributed.checkpoint; that
prototype writes a plain (not sharded) tensor from rank 0 only, so there
save() refuses (RuntimeError, on every rank) a state dict whose keys
differ between ranks: keep per-rank state out of it (write it with
spotd.checkpoint's ck.open, one file per rank) or use ShardedTensor.
Where neither imports (torch 1.13's prototype does not import under
Python 3.11 as Debian ships it), save() and load() raise RuntimeError
saying so. `import spotd.dcp` does not import torch.

Staged saves: stage() (or a StagedSaver of your own) in place of save()
stops training only for a copy into host memory:

    saver = spotd.dcp.StagedSaver()           # limit: $SPOTD_STAGE_MEMORY
    ...
        if spotd.checkpoint_requested():      # every rank, same answer
            saver.stage(state, step=step)     # every rank; returns at once
    ...
    saver.wait()                              # before destroy_process_group()

- stage() is a collective, like save(): every rank copies its own state
  dict into host buffers of its own (spotd.staged's machinery: allocated
  and touched once, reused while the layout stays; CUDA tensors into
  pinned buffers), a ShardedTensor's local shards and a DTensor's local
  tensor included (rebuilt around the buffers with the same metadata,
  mesh and placements), and returns. It is a real copy: the optimizer
  may change the tensors in place at once.
- A background thread on every rank then runs DCP's save of the
  snapshot into the new folder (each rank its shard files, global rank 0
  .metadata; DCP's FileSystemWriter fsyncs each of them), then the ranks
  agree (one MAX over the persist group): only when every rank wrote its
  part does the node's local rank 0 write SPOTD_COMPLETE through
  spotd.done(step=N), as save() does. A write failing on any rank fails
  it on every rank (DCP gathers each rank's error, and the agreement
  covers the rest): no marker, one line on stderr, wait() and the next
  stage() raise on every rank. A rank killed during the persist (kill
  -9) makes the other ranks' collectives fail at once (gloo sees the
  connection go): they raise, they do not hang, and the folder stays
  unmarked: spotd never uploads it and the previous checkpoint stays
  LATEST.
- Its collectives run on a gloo group of the persist's own
  (dist.new_group(backend="gloo"), made at the first stage() and kept),
  never on the default group: DCP's plan, write and metadata exchange
  run from the background thread, and on the default group they would
  interleave with the trainer's own collectives in the main thread
  (DDP's all-reduce, the next checkpoint_requested(), a barrier) and
  pair one rank's DCP gather with another's gradient all-reduce. Both
  DCPs take the group (process_group=): torch 2.x's save() and torch
  1.13's prototype save_state_dict(), which has no async_save; that is
  what spotd.dcp uses on every version. torch 2.x's own dcp.async_save
  is not used: it would still need the same group, the agreement and the
  marker after its future, and it stages into memory of its own rather
  than the staging buffers and limit the rest of spotd's staged saves
  share. The group and the background thread are why the trainer must
  wait() before destroy_process_group().
- One set of buffers per rank, at most limit bytes (limit=, else
  $SPOTD_STAGE_MEMORY, else half the machine's memory; 0: always
  synchronous). A stage() while the previous persist runs waits for it
  (one line on stderr). When any rank's state does not fit, every rank
  saves synchronously (one line on stderr), still on the persist group.
- A request that comes while a staged save persists is answered by that
  save (spotd serves a request with the next marked folder). Whether to
  stage again must be decided alike on every rank: `saver.persisting` is
  this rank's view and may differ between ranks by a moment, so call
  stage() on every rank (it waits for the persist in flight) rather
  than decide on it.
- storage_writer=: a function of the folder giving the DCP StorageWriter
  (default FileSystemWriter(path)). A state dict is flat on torch 1.13's
  prototype, and there, as for save(), the ranks' keys must be the same.
"""

import atexit
import copy
import os
import sys
import threading
import time
import weakref

import spotd
import spotd.staged as _st

__all__ = ["available", "load", "save", "stage", "StagedSaver",
           "default_saver"]


def _dcp():
    """torch.distributed.checkpoint, else torch 1.13's prototype of it;
    RuntimeError saying what is missing when neither imports."""
    try:
        import torch.distributed.checkpoint as dcp
        return dcp
    except ImportError as e:
        first = e
    try:
        import torch.distributed._shard.checkpoint as dcp
        if hasattr(dcp, "save_state_dict") and \
                hasattr(dcp, "FileSystemWriter"):
            return dcp
    except Exception as e:  # noqa: BLE001 - 1.13 under 3.11: a TypeError
        first = e
    try:
        import torch
        have = "torch %s" % torch.__version__
    except ImportError:
        have = "no torch"
    raise RuntimeError(
        "spotd.dcp needs torch.distributed.checkpoint (torch 2.0 or newer) "
        "or torch 1.13's prototype torch.distributed._shard.checkpoint; "
        "this Python has %s, where neither imports (%s: %s)" %
        (have, type(first).__name__, first)) from first


def _prototype(dcp):
    return dcp.__name__.endswith("_shard.checkpoint")


def _same_keys(state_dict):
    """On torch 1.13's prototype: RuntimeError on every rank when the
    ranks' keys differ (it would save rank 0's plain tensors only)."""
    dist = spotd._dist()
    if dist is None or dist.get_world_size() == 1:
        return
    keys = sorted(str(k) for k in state_dict)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, keys)
    if any(k != every[0] for k in every):
        raise RuntimeError(
            "spotd.dcp: torch 1.13's prototype DCP saves plain tensors from "
            "rank 0 only, and the ranks' state dicts have different keys: "
            "their own entries would be lost; save per-rank state in files "
            "of their own (spotd.checkpoint, ck.open) or as ShardedTensor")


def available():
    """True when this torch has torch.distributed.checkpoint."""
    try:
        _dcp()
    except RuntimeError:
        return False
    return True


def save(state_dict, step=None, name=None, root=None):
    """Every rank: writes state_dict with DCP into a new checkpoint folder
    (step-NNNNNN or name, see spotd.checkpoint) and marks it complete once
    every rank has written its shards. Returns the folder."""
    dcp = _dcp()
    if _prototype(dcp):
        _same_keys(state_dict)
    with spotd.checkpoint(name=name, step=step, root=root) as ck:
        if hasattr(dcp, "save"):
            dcp.save(state_dict, checkpoint_id=ck.path)
        else:
            dcp.save_state_dict(state_dict,
                                storage_writer=dcp.FileSystemWriter(ck.path))
    return ck.path


def load(state_dict, path=None):
    """Every rank: loads path (default spotd.resume_dir()) into state_dict
    in place. Returns the folder, or None when there is nothing to resume
    from."""
    path = path or spotd.resume_dir()
    if not path:
        return None
    dcp = _dcp()
    if hasattr(dcp, "load"):
        dcp.load(state_dict, checkpoint_id=path)
    else:
        dcp.load_state_dict(state_dict,
                            storage_reader=dcp.FileSystemReader(path))
    return path


# ------------------------------------------------------------- staged

# The persist's collectives (DCP's plan/write/metadata exchange and the
# ranks' agreement) run on a gloo group of their own, made at the first
# stage() (a collective: every rank is there) and kept for the process:
# run from the background thread on the default group they would
# interleave with the trainer's own collectives (DDP's all-reduces, the
# next checkpoint_requested(), a barrier) and pair a rank's DCP gather
# with another rank's gradient all-reduce. A gloo group is on the CPU and
# has connections of its own, so the persist never waits on the
# trainer's group nor the trainer on it. Held with the default group it
# was made under (weakly): a new default group gets a new one.
_persist = {"group": None, "pid": None, "world": None, "atexit": False}


def _persist_close():
    """At interpreter exit (after the persist threads are joined: they
    are not daemon threads): frees the persist group while Python is
    whole (a gloo group freed at finalisation can abort the process)."""
    group = _persist["group"]
    if group is None or _persist["pid"] != os.getpid():
        return
    _persist.update(group=None, world=None)
    dist = spotd._dist()
    try:
        if dist is not None:
            dist.destroy_process_group(group)
    except (RuntimeError, ValueError, KeyError):
        pass
    del group


def _persist_group(dist):
    """The gloo group of the persists (made at the first call, on every
    rank)."""
    world = getattr(dist.group, "WORLD", None)
    known = _persist["world"]() if _persist["world"] is not None else None
    if _persist["group"] is None or _persist["pid"] != os.getpid() or \
            known is not world:
        _persist.update(group=dist.new_group(backend="gloo"),
                        pid=os.getpid(),
                        world=weakref.ref(world) if world is not None
                        else None)
        if not _persist["atexit"]:
            atexit.register(_persist_close)
            _persist["atexit"] = True
    return _persist["group"]


def _sharded_types():
    """(ShardedTensor or None, DTensor or None) of the torch imported."""
    st = dt = None
    m = sys.modules.get("torch.distributed._shard.sharded_tensor")
    if m is not None:
        st = getattr(m, "ShardedTensor", None)
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        m = sys.modules.get(name)
        if m is not None and getattr(m, "DTensor", None) is not None:
            dt = m.DTensor
            break
    return st, dt


def _walk(obj, key, out, seen, types):
    """staged._walk, with a ShardedTensor's local shards and a DTensor's
    local tensor as the leaves (their global shape is no buffer's)."""
    st, dt = types
    if st is not None and isinstance(obj, st):
        if id(obj) not in seen:
            seen[id(obj)] = key
            for i, sh in enumerate(obj.local_shards()):
                out.append((key + ("\0shard", i), sh.tensor))
    elif dt is not None and isinstance(obj, dt):
        if id(obj) not in seen:
            seen[id(obj)] = key
            out.append((key + ("\0local",), obj.to_local()))
    elif _st._is_tensor(obj):
        _st._walk(obj, key, out, seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, key + (k,), out, seen, types)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, key + (i,), out, seen, types)


def _leaf(bufs, key, t):
    b = bufs.get(key)
    if b is None or b is t:
        return t.detach().clone()  # a layout without buffer
    return b


def _rebuild(obj, key, bufs, seen, types):
    """staged._rebuild, rebuilding a ShardedTensor (same metadata, same
    process group) and a DTensor (same mesh and placements) around the
    buffers of their local tensors."""
    st, dt = types
    if st is not None and isinstance(obj, st):
        first = seen.setdefault(id(obj), key)
        shard = sys.modules["torch.distributed._shard.sharded_tensor"].Shard
        shards = [shard(_leaf(bufs, first + ("\0shard", i), sh.tensor),
                        copy.deepcopy(sh.metadata))
                  for i, sh in enumerate(obj.local_shards())]
        return st._init_from_local_shards_and_global_metadata(
            shards, copy.deepcopy(obj.metadata()),
            process_group=getattr(obj, "_process_group", None),
            sharding_spec=obj.sharding_spec())
    if dt is not None and isinstance(obj, dt):
        first = seen.setdefault(id(obj), key)
        local = _leaf(bufs, first + ("\0local",), obj.to_local())
        try:
            return dt.from_local(local, obj.device_mesh, obj.placements,
                                 run_check=False, shape=obj.shape,
                                 stride=obj.stride())
        except TypeError:  # torch 2.0: no shape, stride
            return dt.from_local(local, obj.device_mesh, obj.placements,
                                 run_check=False)
    if _st._is_tensor(obj):
        return _st._rebuild(obj, key, bufs, seen)
    if isinstance(obj, dict):
        out = {}
        if type(obj) is not dict:  # an OrderedDict: as staged._rebuild
            try:
                out = copy.copy(obj)
                out.clear()
                if getattr(obj, "__dict__", None):
                    out.__dict__.update(copy.deepcopy(obj.__dict__))
            except Exception:  # noqa: BLE001 - an odd mapping: a plain dict
                out = {}
        for k, v in obj.items():
            out[k] = _rebuild(v, key + (k,), bufs, seen, types)
        return out
    if isinstance(obj, (list, tuple)):
        items = [_rebuild(v, key + (i,), bufs, seen, types)
                 for i, v in enumerate(obj)]
        if isinstance(obj, list):
            return items
        if hasattr(obj, "_fields"):  # a namedtuple
            return type(obj)(*items)
        return tuple(items)
    return copy.deepcopy(obj)


class StagedSaver(_st.StagedSaver):
    """Staged DCP saves with buffers kept between them; see stage().

    limit: the most bytes of this rank's staging buffers (default
    $SPOTD_STAGE_MEMORY, else half the machine's memory; 0: always
    synchronous). storage_writer(path): the DCP StorageWriter to write
    with (default DCP's FileSystemWriter(path)). root: the checkpoints'
    folder (spotd.ckpt_root()). threads: the copy threads (see
    spotd.StagedSaver)."""

    def __init__(self, limit=None, storage_writer=None, root=None,
                 threads=None):
        super().__init__(limit=limit, root=root, threads=threads)
        self.storage_writer = storage_writer

    def _leaves(self, state_dict):
        """This rank's tensors (a sharded tensor's local shards): what
        reserve() allocates buffers for; reserve() is not a collective."""
        leaves = []
        _walk(state_dict, (), leaves, {}, _sharded_types())
        return leaves

    def stage(self, state_dict, step=None, name=None, folder=None,
              filename=None, mark=True):
        """Every rank: snapshots state_dict and persists it with DCP in
        the background into a new checkpoint folder (step-NNNNNN for
        step, or name), marked with step once every rank has written.
        Returns a StagedSave once the copy is done."""
        import torch
        if folder is not None or filename is not None or not mark:
            raise ValueError("spotd.dcp.StagedSaver.stage(): a new folder "
                             "with its marker only (step or name)")
        if name is None and step is None:
            raise ValueError("stage(): give a step or a name")
        with self._lock:
            return self._stage_dcp(torch, state_dict, step, name)

    def _stage_dcp(self, torch, state_dict, step, name):
        dcp = _dcp()
        dist = spotd._dist()
        multi = dist is not None and dist.get_world_size() > 1
        # As staged.py: every rank learns whether a previous persist
        # failed (the agreement ended it alike on every rank, but a rank
        # may not have noticed yet) and raises alike.
        err = self._join_previous(step if step is not None else name)
        failed = 1 if err is not None else 0
        if multi:
            failed = spotd._agree_max(dist, failed)
        if failed:
            if err is not None:
                raise RuntimeError("staged checkpoint %s failed: %s"
                                   % (err[0], err[1])) from err[1]
            raise RuntimeError("a staged checkpoint failed on another rank "
                               "(its log says why)")
        if _prototype(dcp):
            _same_keys(state_dict)
        group = _persist_group(dist) if dist is not None else None
        ck = spotd.Checkpoint(name=name, step=step, root=self.root)
        ck.__enter__()  # the folder: a collective under torch.distributed
        h = _st.StagedSave(ck.path, step, False)
        h.filename, h.mark = None, ck.writer  # the node's local rank 0 marks
        types = _sharded_types()
        leaves = []
        _walk(state_dict, (), leaves, {}, types)
        need = sum(_st._nbytes(t) for _, t in leaves)
        # 2: this rank's copy failed; 1: its state does not fit the limit.
        verdict, copy_err, snap = (1 if need > self.limit else 0), None, None
        if not verdict:
            try:
                snap = self._snapshot(torch, state_dict, leaves, types)
            except Exception as e:  # noqa: BLE001 - every rank raises below
                verdict, copy_err = 2, e
        if multi:  # every rank persists, or none does
            verdict = spotd._agree_max(dist, verdict)
        if verdict == 2:
            e = copy_err or RuntimeError("the snapshot failed on another rank")
            h._finish(e, 0.0)
            raise RuntimeError("staged checkpoint %s not saved (no marker): "
                               "%s" % (h.name, e)) from e
        if verdict == 1:
            _st._say("staged save of %s: the state (%s on this rank) or "
                     "another rank's does not fit the staging limit (%s, "
                     "%s): saving it synchronously"
                     % (h.name, _st._gib(need), _st._gib(self.limit),
                        _st.ENV_MEMORY))
            if need > self.limit:
                self._bufs = {}
            self._persist_dcp(h, state_dict, group, multi, False)
            if h.error is not None:
                raise RuntimeError("checkpoint %s not saved (no marker): %s"
                                   % (h.name, h.error)) from h.error
            return h
        h.staged = True
        th = threading.Thread(target=self._persist_dcp,
                              args=(h, snap, group, multi, True),
                              name="spotd-dcp-persist", daemon=False)
        self._inflight = (h, th)
        th.start()
        return h

    def _snapshot(self, torch, state_dict, leaves, types):
        """The state with every tensor (local shard) copied into this
        saver's buffers."""
        bufs = self._copy(torch, leaves)
        return _rebuild(state_dict, (), bufs, {}, types)

    def _save(self, dcp, snap, path, group):
        """DCP's save of snap into path, its collectives on group."""
        sw = self.storage_writer(path) if self.storage_writer \
            else dcp.FileSystemWriter(path)
        if hasattr(dcp, "save"):  # torch 2.2 and newer
            dcp.save(snap, storage_writer=sw, process_group=group)
        elif group is None:  # no torch.distributed: one process
            dcp.save_state_dict(snap, storage_writer=sw, no_dist=True)
        else:
            dcp.save_state_dict(snap, storage_writer=sw, process_group=group)

    def _persist_dcp(self, h, snap, group, multi, background):
        """Writes snap (every rank its part: DCP's FileSystemWriter fsyncs
        each file and the metadata), agrees with the other ranks (one
        MAX over the persist group: a failure anywhere fails it
        everywhere), then the node's local rank 0 marks the folder."""
        import torch
        t0 = time.monotonic()
        err = None
        try:
            self._save(_dcp(), snap, h.path, group)
        except BaseException as e:  # noqa: B902 - agreed on, then reported
            err = e
        if multi:
            dist = spotd._dist()
            flag = torch.tensor([1 if err is not None else 0],
                                dtype=torch.int32)
            try:
                if dist is None:
                    raise RuntimeError("torch.distributed was shut down "
                                       "during the persist")
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
            except BaseException as e:  # noqa: B902 - a rank is gone
                err = err or e
                flag[0] = 1
            if int(flag[0]) and err is None:
                err = RuntimeError("the staged DCP checkpoint failed on "
                                   "another rank (its log says why)")
        if err is None and h.mark:
            try:
                spotd.done(h.path, strict=False, step=h.step)
            except BaseException as e:  # noqa: B902 - reported by wait()
                err = e
        if err is not None and background:
            _st._say("staged checkpoint %s not saved (no marker): %s"
                     % (h.name, err))
        h._finish(err, time.monotonic() - t0)


_default = []


def default_saver():
    """The StagedSaver spotd.dcp.stage() uses (made at the first call)."""
    if not _default:
        _default.append(StagedSaver())
    return _default[0]


def stage(state_dict, step=None, name=None):
    """Every rank: StagedSaver.stage() on the process's default saver
    (made at the first call, with $SPOTD_STAGE_MEMORY's limit)."""
    return default_saver().stage(state_dict, step=step, name=name)
