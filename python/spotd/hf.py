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
node's folder holds the whole checkpoint. save_only_model=True writes no
optimizer, scheduler or random state: such a checkpoint cannot resume
the run. The callback warns once about each of these at the start of
training.

During a hyperparameter search the Trainer saves into
output_dir/run-<trial>/checkpoint-N: the callback marks that folder too,
but spotd uploads only folders directly under $SPOTD_CKPT_DIR (it says
so in one warning line): give each trial its own spotd job, or leave the
search's checkpoints local.

A Trainer with enable_jit_checkpoint=True (newer transformers) saves a
checkpoint of its own when it gets SIGTERM. spotd stops the trainer with
SIGTERM after the checkpoint it asked for is complete; a second save
started then would race the stop and never be uploaded. Under spotd the
callback wraps the Trainer's SIGTERM handler: once a checkpoint spotd
asked for is saved and marked, SIGTERM ends the process at once (its
default action); before that, the Trainer's own handler runs as usual.

`import spotd.hf` does not import transformers; the first use of
SpotdCallback does.
"""
import glob
import os
import signal
import sys
import threading

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


def _saved_folder(output_dir, step):
    """The folder the Trainer just saved for step: output_dir/
    checkpoint-N, or during a hyperparameter search output_dir/<run>/
    checkpoint-N (the newest such), else None."""
    name = "checkpoint-%d" % step
    folder = os.path.join(output_dir, name)
    if os.path.isdir(folder):
        return folder
    runs = [d for d in glob.glob(os.path.join(glob.escape(output_dir), "*",
                                              name)) if os.path.isdir(d)]
    if not runs:
        return None
    return max(runs, key=lambda d: os.stat(d).st_mtime_ns)


def _build():
    from transformers import TrainerCallback

    class SpotdCallback(TrainerCallback):
        """Saves when spotd asks (collective) and marks every checkpoint
        the Trainer writes complete, once per node after every rank."""

        def __init__(self, report_steps=True):
            super().__init__()
            self.report_steps = report_steps
            self.marked = []  # folders marked by this process
            self.requested = []  # those of them spotd asked for
            self._asked = False
            self.jit_guarded = False

        def on_train_begin(self, args, state, control, **kwargs):
            self._guard_jit(args)
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
            if getattr(args, "save_only_model", False):
                _warn("save_only_model=True: the checkpoints hold no "
                      "optimizer, scheduler or random state, so a run "
                      "resumed from them does not continue this one; leave "
                      "it False")
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
                self._asked = True
            return control

        def on_save(self, args, state, control, **kwargs):
            folder = _saved_folder(args.output_dir, state.global_step)
            _barrier()  # every rank has written its part of the folder
            if state.is_local_process_zero and folder is not None:
                spotd.done(folder, strict=False, step=state.global_step)
                self.marked.append(os.path.abspath(folder))
            if self._asked and folder is not None:
                self.requested.append(os.path.abspath(folder))
            self._asked = False
            return control

        def _guard_jit(self, args):
            """Under spotd, with the Trainer's SIGTERM checkpointing on:
            SIGTERM after a checkpoint spotd asked for ends the process
            instead of starting a second save."""
            if self.jit_guarded or not spotd.under_spotd() or \
                    not getattr(args, "enable_jit_checkpoint", False) or \
                    threading.current_thread() is not \
                    threading.main_thread():
                return
            prev = signal.getsignal(signal.SIGTERM)
            if not callable(prev):
                return
            cb = self

            def on_sigterm(signum, frame):
                if cb.requested:  # spotd's checkpoint is complete: stop
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                prev(signum, frame)

            signal.signal(signal.SIGTERM, on_sigterm)
            self.jit_guarded = True

    return SpotdCallback


_built = {}


def __getattr__(name):
    if name == "SpotdCallback":
        if name not in _built:
            _built[name] = _build()
        return _built[name]
    raise AttributeError("module 'spotd.hf' has no attribute %r" % name)
