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

DCP needs torch 2.0 or newer (save/load with checkpoint_id from 2.2;
older 2.x use save_state_dict/load_state_dict): with an older torch,
save() and load() raise RuntimeError saying so. `import spotd.dcp` does
not import torch.
"""
import spotd

__all__ = ["available", "load", "save"]


def _dcp():
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError as e:
        try:
            import torch
            have = "torch %s" % torch.__version__
        except ImportError:
            have = "no torch"
        raise RuntimeError(
            "spotd.dcp needs torch.distributed.checkpoint (torch 2.0 or "
            "newer); this Python has %s" % have) from e
    return dcp


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
