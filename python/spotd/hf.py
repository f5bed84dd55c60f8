"""spotd for the Hugging Face Trainer (transformers), imported on use:

    import spotd.hf
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=spotd.hf.output_dir(),
                             save_total_limit=None, ...)
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[spotd.hf.SpotdCallback()])
    trainer.train(resume_from_checkpoint=spotd.resume_dir())

SpotdCallback does two things:

- on_step_end (the Trainer runs callbacks on every rank): when
  spotd.checkpoint_requested() says so, control.should_save = True, and
  the Trainer saves output_dir/checkpoint-<global step> at the end of
  that step. Under torch.distributed the call is the helper's collective,
  so every rank decides the same step.
- on_save (after the Trainer wrote checkpoint-N, on every rank): a barrier,
  so that every rank has written its files (rng_state_K.pth, the shards
  of FSDP or DeepSpeed), then the node's local rank 0 marks the folder
  complete with spotd.done(folder, step=global step): one SPOTD_COMPLETE
  per node, stating the step, so spotd orders checkpoint-N folders by it
  (their names state none it reads). Saves the
  Trainer makes on its own schedule (save_steps) are marked too, and
  spotd uploads them as well.

The Trainer must write into $SPOTD_CKPT_DIR (output_dir=output_dir()):
spotd only uploads folders directly under it. Leave save_total_limit
unset: the Trainer's rotation deletes old checkpoint folders, maybe the
one spotd is uploading (spotd's --keep prunes the store instead). On
several nodes with node-local disks set save_on_each_node=True, so every
node's folder holds the whole checkpoint. The callback warns once about
each of these at the start of training.

`import spotd.hf` does not import transformers; the first use of
SpotdCallback does.
"""
import os
import sys

import spotd

__all__ = ["SpotdCallback", "output_dir"]


def output_dir():
    """Where the Trainer must save: $SPOTD_CKPT_DIR (absolute), or
    ./checkpoints without spotd."""
    return spotd.ckpt_root()


def _warn(msg):
    print("spotd.hf: warning: " + msg, file=sys.stderr, flush=True)


def _barrier():
    dist = spotd._dist()
    if dist is not None and dist.get_world_size() > 1:
        dist.barrier()


def _build():
    from transformers import TrainerCallback

    class SpotdCallback(TrainerCallback):
        """Saves when spotd asks (collective) and marks every checkpoint
        the Trainer writes complete, once per node after every rank."""

        def __init__(self, report_steps=True):
            super().__init__()
            self.report_steps = report_steps
            self.marked = []  # folders marked by this process

        def on_train_begin(self, args, state, control, **kwargs):
            if not state.is_local_process_zero:
                return control
            out = os.path.realpath(args.output_dir)
            if spotd.under_spotd() and out != os.path.realpath(
                    spotd.ckpt_root()):
                _warn("output_dir %s is not $SPOTD_CKPT_DIR (%s): spotd "
                      "will not upload its checkpoints" %
                      (args.output_dir, spotd.ckpt_root()))
            if getattr(args, "save_total_limit", None):
                _warn("save_total_limit=%s deletes checkpoint folders spotd "
                      "may be uploading; leave it unset (spotd --keep "
                      "prunes the store)" % args.save_total_limit)
            world = spotd._env_int("WORLD_SIZE", default=1)
            local = spotd._env_int("LOCAL_WORLD_SIZE", default=world)
            if world > local and not getattr(args, "save_on_each_node",
                                             False):
                _warn("several nodes and save_on_each_node=False: only the "
                      "first node's folder holds the model; set it when "
                      "each node has its own disk")
            return control

        def on_step_end(self, args, state, control, **kwargs):
            if self.report_steps and state.is_world_process_zero:
                spotd.report_step(state.global_step)
            if spotd.checkpoint_requested():  # every rank, same answer
                control.should_save = True
            return control

        def on_save(self, args, state, control, **kwargs):
            folder = os.path.join(args.output_dir,
                                  "checkpoint-%d" % state.global_step)
            _barrier()  # every rank has written its part of the folder
            if state.is_local_process_zero and os.path.isdir(folder):
                spotd.done(folder, strict=False, step=state.global_step)
                self.marked.append(os.path.abspath(folder))
            return control

    return SpotdCallback


_built = {}


def __getattr__(name):
    if name == "SpotdCallback":
        if name not in _built:
            _built[name] = _build()
        return _built[name]
    raise AttributeError("module 'spotd.hf' has no attribute %r" % name)
