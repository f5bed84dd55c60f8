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

Staged saves: StagedTrainer (a Trainer) or StagedTrainerMixin (put it
before your own Trainer subclass) makes the Trainer's checkpoint cost the
training loop a copy into host memory:

    trainer = spotd.hf.StagedTrainer(model=model, args=args, ...,
                                     callbacks=[spotd.hf.SpotdCallback()])

Its _save_checkpoint() runs the Trainer's own, with the writes caught:
the model's state_dict, optimizer.state_dict(), the scheduler's, the
random states and trainer_state.json are snapshotted (tensors copied into
spotd.StagedSaver's buffers, reused from one checkpoint to the next, the
rest deep-copied) and it returns; a thread then writes checkpoint-N in
the Trainer's layout with the Trainer's own code (_save with the
snapshot's state_dict: model.safetensors or pytorch_model.bin, config,
tokenizer, training_args.bin; optimizer.pt, scheduler.pt, rng_state.pth,
trainer_state.json), fsyncs it and only then marks it (spotd.done(step=
N)): resume_from_checkpoint and spotd's restore read it unchanged. A
kill during the persist leaves the folder without a marker: the previous
checkpoint stays LATEST. SpotdCallback leaves such a folder to the
persist (it marks none itself), and a request that comes while a
staged save is being written is answered by that save's marker (the
callback asks for no second one). save_total_limit's rotation runs after
the marker, in the persist, so it never deletes the last complete
checkpoint before the new one is; train() waits for the persist in
flight before it returns. The staging limit and its line when the state
does not fit are StagedSaver's (limit=, $SPOTD_STAGE_MEMORY).

Saved synchronously, as the Trainer does (one line on stderr says so
once): several processes (world size > 1: every rank's files must be
written before the node's marker, a collective the background thread
cannot make), DeepSpeed, FSDP, XLA/TPU, SageMaker MP, NPU/MLU/MUSA random
states and push_to_hub. What the thread reads besides the snapshot (the
model's config and class, the tokenizer, TrainingArguments) must not
change during training, as with the Trainer itself.

`import spotd.hf` does not import transformers; the first use of
SpotdCallback or StagedTrainer does.
"""
import glob
import os
import signal
import sys
import threading

import spotd

__all__ = ["SpotdCallback", "StagedTrainer", "StagedTrainerMixin",
           "output_dir"]


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
            self.staged_requested = []  # StagedSave of staged ones asked for
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
                busy = _persisting()
                if busy is not None:
                    # A StagedTrainer's save is still being written: its
                    # marker answers the request (spotd serves it with the
                    # next folder marked); a second save would wait for it.
                    self.staged_requested.append(busy)
                else:
                    control.should_save = True
                    self._asked = True
            return control

        def on_save(self, args, state, control, **kwargs):
            folder = _saved_folder(args.output_dir, state.global_step)
            _barrier()  # every rank has written its part of the folder
            staged = _staged.pop(os.path.abspath(folder), None) \
                if folder is not None else None
            if staged is not None:
                # A StagedTrainer's save: its persist marks the folder
                # once written; a request is answered by that marker.
                if self._asked:
                    self.staged_requested.append(staged)
            elif state.is_local_process_zero and folder is not None:
                spotd.done(folder, strict=False, step=state.global_step)
                self.marked.append(os.path.abspath(folder))
            if self._asked and folder is not None and staged is None:
                self.requested.append(os.path.abspath(folder))
            self._asked = False
            return control

        def _requested_done(self):
            """A checkpoint spotd asked for is saved and marked."""
            return bool(self.requested) or any(
                h.done() and h.error is None for h in self.staged_requested)

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
                if cb._requested_done():  # spotd's checkpoint is complete
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                prev(signum, frame)

            signal.signal(signal.SIGTERM, on_sigterm)
            self.jit_guarded = True

    return SpotdCallback


# Checkpoint folders (absolute) a StagedTrainer staged, until SpotdCallback's
# on_save for them: their persist writes the marker, not the callback.
_staged = {}
_last = [None]  # the StagedSave of the last staged save of this process


def _persisting():
    """The StagedSave still being written (a StagedTrainer's), or None.
    Staging is one process's (world size 1), so every rank agrees."""
    h = _last[0]
    return h if h is not None and not h.done() else None
_OPTIMIZER = "optimizer.pt"
_SCHEDULER = "scheduler.pt"


def _sync_reason(trainer):
    """Why this Trainer's checkpoint cannot be staged, or None."""
    args = trainer.args
    if getattr(args, "world_size", 1) > 1:
        return "several processes (world size %d)" % args.world_size
    if getattr(trainer, "is_deepspeed_enabled", False):
        return "DeepSpeed"
    if getattr(trainer, "is_fsdp_enabled", False):
        return "FSDP"
    if getattr(args, "push_to_hub", False):
        return "push_to_hub"
    from transformers import utils
    for what, fn in (("XLA", "is_torch_xla_available"),
                     ("SageMaker MP", "is_sagemaker_mp_enabled"),
                     ("NPU", "is_torch_npu_available"),
                     ("MLU", "is_torch_mlu_available"),
                     ("MUSA", "is_torch_musa_available")):
        f = getattr(utils, fn, None)
        if f is not None and f():
            return what
    return None


def _dedup_shared(sd):
    """sd with the tensors that are views of the same memory (tied
    weights) as one object, so the snapshot keeps them shared, as the
    Trainer's save_pretrained expects."""
    import copy
    import torch
    out = copy.copy(sd)
    seen = {}
    for k, v in sd.items():
        if isinstance(v, torch.Tensor) and v.numel() > 0 and \
                v.layout == torch.strided:
            key = (str(v.device), v.data_ptr(), v.dtype, tuple(v.shape),
                   tuple(v.stride()))
            out[k] = seen.setdefault(key, v)
    return out


class StagedTrainerMixin:
    """A Trainer whose checkpoints are staged (see the module): put it
    before the Trainer class, class MyTrainer(StagedTrainerMixin,
    Trainer). spotd_stage_limit: the staging limit (StagedSaver's limit;
    default $SPOTD_STAGE_MEMORY, else half the memory). spotd_saver: its
    StagedSaver; spotd_saver.persisting is the save in flight."""

    def __init__(self, *args, spotd_stage_limit=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.spotd_saver = spotd.staged.StagedSaver(
            limit=spotd_stage_limit, writer=self._spotd_write)
        self._spotd_sync_said = False

    def _save_checkpoint(self, model, trial, metrics=None):
        why = _sync_reason(self)
        if why is not None:
            if not self._spotd_sync_said:
                print("spotd.hf: checkpoints are saved synchronously, not "
                      "staged: %s" % why, file=sys.stderr, flush=True)
                self._spotd_sync_said = True
            return super()._save_checkpoint(model, trial, metrics=metrics)
        import warnings
        # The previous persist ends (marker, rotation) before this folder
        # exists: its rotation never counts an unfinished folder.
        self.spotd_saver.wait()
        cap = {}

        def save(output_dir=None, state_dict=None):
            output_dir = output_dir or self.args.output_dir
            os.makedirs(output_dir, exist_ok=True)
            cap["dir"] = output_dir
            cap["model"] = _dedup_shared(
                state_dict if state_dict is not None
                else self.model.state_dict())

        def optimizer_and_scheduler(output_dir):
            os.makedirs(output_dir, exist_ok=True)
            cap["dir"] = output_dir
            if self.args.should_save:
                cap["optimizer"] = self.optimizer.state_dict()
                with warnings.catch_warnings(record=True):
                    cap["scheduler"] = self.lr_scheduler.state_dict()

        def rotate(use_mtime=False, output_dir=None):
            cap["rotate"] = {"use_mtime": use_mtime, "output_dir": output_dir}

        # The Trainer's own _save_checkpoint with its big writes caught;
        # rng_state.pth and trainer_state.json (small) it writes itself,
        # into the folder that has no marker yet.
        self._save = save
        self._save_optimizer_and_scheduler = optimizer_and_scheduler
        self._rotate_checkpoints = rotate
        try:
            super()._save_checkpoint(model, trial, metrics=metrics)
        finally:
            del self._save, self._save_optimizer_and_scheduler, \
                self._rotate_checkpoints
        folder = cap.get("dir") or os.path.join(
            self._get_output_dir(trial=trial),
            "checkpoint-%d" % self.state.global_step)
        snap = {k: cap[k] for k in ("model", "optimizer", "scheduler")
                if k in cap}
        snap["_spotd"] = {"step": self.state.global_step,
                          "rotate": cap.get("rotate")}
        h = self.spotd_saver.stage(snap, step=self.state.global_step,
                                   folder=folder, mark=False)
        _staged[os.path.abspath(folder)] = h
        _last[0] = h
        return None

    def _spotd_write(self, snap, folder, filename):
        """The persist (background thread): the Trainer's files from the
        snapshot, the marker, then the rotation."""
        import torch
        self._spotd_before_persist(folder)
        if "model" in snap:
            type(self)._save(self, folder, state_dict=snap["model"])
        if "optimizer" in snap:
            torch.save(snap["optimizer"], os.path.join(folder, _OPTIMIZER))
        if "scheduler" in snap:
            torch.save(snap["scheduler"], os.path.join(folder, _SCHEDULER))
        meta = snap["_spotd"]
        spotd.done(folder, strict=False, step=meta["step"])
        if meta["rotate"] is not None:
            type(self)._rotate_checkpoints(self, **meta["rotate"])

    def _spotd_before_persist(self, folder):
        """Called by the persist before it writes (a hook for tests)."""

    def _load_best_model(self):
        self.spotd_saver.wait()  # the best may be the one persisting
        return super()._load_best_model()

    def train(self, *args, **kwargs):
        ok = False
        try:
            out = super().train(*args, **kwargs)
            ok = True
            return out
        finally:
            if ok:
                self.spotd_saver.wait()  # raises a failed persist's error
            else:
                try:
                    self.spotd_saver.wait()
                except Exception:  # noqa: BLE001 - the train() error wins
                    pass


def _build_trainer():
    from transformers import Trainer

    class StagedTrainer(StagedTrainerMixin, Trainer):
        """transformers.Trainer with staged checkpoints (see the module)."""

    return StagedTrainer


_built = {}


def __getattr__(name):
    if name == "SpotdCallback":
        if name not in _built:
            _built[name] = _build()
        return _built[name]
    if name == "StagedTrainer":
        if name not in _built:
            _built[name] = _build_trainer()
        return _built[name]
    raise AttributeError("module 'spotd.hf' has no attribute %r" % name)
