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
"""
import spotd

__all__ = ["available", "load", "save"]


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
