"""spotd for PyTorch Lightning, imported on use:

    import spotd.lightning
    import lightning.pytorch as pl        # or pytorch_lightning

    trainer = pl.Trainer(callbacks=[spotd.lightning.SpotdCheckpoint()])
    trainer.fit(model, data, ckpt_path=spotd.lightning.ckpt_path())

SpotdCheckpoint, after each optimizer step (on_train_batch_end, at the
end of a gradient-accumulation cycle):

- asks spotd.checkpoint_requested() on every rank. Under torch.distributed
  (DDP, FSDP, DeepSpeed) that is the helper's collective, otherwise the
  strategy's reduce_boolean_decision: every rank takes the same decision,
  which trainer.save_checkpoint needs (it is collective).
- saves inside spotd.checkpoint(step=trainer.global_step): a new folder
  SPOTD_CKPT_DIR/step-NNNNNN, trainer.save_checkpoint(folder/last.ckpt)
  on every rank (the strategy decides who writes: global rank 0 for DDP,
  every rank its shards for FSDP or DeepSpeed), and each rank's data
  position (DATA_FILE, below); then, after every rank has left the block,
  one SPOTD_COMPLETE per node by its local rank 0.

Mid-epoch resume, exactly. Lightning alone restarts a resumed epoch from
its first batch when the DataLoader is a plain one (no state_dict), so
the batches before the checkpoint are trained twice and the epoch's later
ones never (Lightning 2.2 also counts the batch the checkpoint was taken
after as not done, and redoes it). The callback makes the resumed run
continue with the batch the interrupted one would have taken next, in the
same order, with the same random numbers:

- each rank writes step-NNNNNN/spotd-data-rank<R>.pt: the epoch, how many
  of its batches were consumed, the random state the epoch's data order
  came from (torch, Python, NumPy and CUDA generators, and the torch
  generators of the train DataLoader and its sampler, captured when the
  epoch's iterator was made) and the random state at the checkpoint;
  last.ckpt records that batch as complete (Lightning 2.5 and later
  count it themselves on restore: their last.ckpt is left as written);
- on resume (fit(ckpt_path=...) from such a folder), at the start of the
  resumed epoch (on_train_epoch_start; on_train_start with Lightning 2.5
  and later, which call no on_train_epoch_start for the epoch they
  resume in) each rank puts back the epoch's random state, makes the
  epoch's iterator again (after the sampler's set_epoch), reads and drops
  the consumed batches (they are loaded again, not trained), then puts
  back the random state of the checkpoint.

So that both runs make the epoch's iterator the same way, the callback
makes the first epoch's iterator again at on_train_epoch_start (Lightning
makes one earlier, before the random state can be captured). The data
order must come from those generators (a shuffled DataLoader, a seeded
generator, Lightning's DistributedSampler): an iterable dataset with
its own unseeded randomness, or a LightningModule.on_train_epoch_start
that draws random numbers, is not replayed. A DataLoader that has its
own state_dict (a resumable loader) is left to Lightning.

Lightning needs no signal from spotd: the request comes through spotd's
request channel. On Slurm, Lightning's SLURMEnvironment (on by default,
auto_requeue=True) catches the requeue signal (SIGUSR1), writes its own
hpc_ckpt_N.ckpt outside spotd's folder and runs `scontrol requeue`, and
it ignores SIGTERM, the signal spotd stops the trainer with. Under spotd
the callback turns that off at setup (auto_requeue = False, one line on
stderr): the requeue signal becomes a spotd checkpoint request (saved at
the next step, uploaded by spotd), requeueing is spotd's, and SIGTERM
stops the trainer again.

Staged saves: with the plugin StagedCheckpointIO the checkpoint costs
the training loop a copy into host memory, and last.ckpt is written in
the background:

    trainer = pl.Trainer(callbacks=[spotd.lightning.SpotdCheckpoint()],
                         plugins=[spotd.lightning.StagedCheckpointIO()])

Its save_checkpoint() snapshots the checkpoint Lightning made (every
tensor copied into buffers reused from one checkpoint to the next, the
rest deep-copied: spotd.StagedSaver) and returns; a thread writes the
file: torch.save streamed into last.ckpt (the file Lightning's own
TorchCheckpointIO writes, without its copy of the whole checkpoint in
memory first, whose large copies hold the GIL and stall the steps), or
with the checkpoint_io you give it.
Lightning's AsyncCheckpointIO would not do: it hands the live tensors to
its thread, which the next optimizer step changes while they are being
written. With the plugin, SpotdCheckpoint writes each rank's data
position first, waits for every rank (one collective), and the marker of
global rank 0's node comes from that thread once last.ckpt is fsynced
(another node's local rank 0 marks its folder at once: it holds only
data positions). A kill during the write leaves no marker. A request
while a staged write is running is answered by it (spotd serves a
request with the next folder marked): the callback saves no second
checkpoint then. The strategy must write the whole checkpoint from
global rank 0 (one process, DDP); with FSDP or DeepSpeed (each rank its
shards) do not use the plugin. Saves of other callbacks (ModelCheckpoint)
through the plugin are written in the background too, without a marker.
The limit and its lines are spotd.StagedSaver's ($SPOTD_STAGE_MEMORY).

ckpt_path() is the file to resume from (in $SPOTD_RESUME_DIR) or None.

`import spotd.lightning` imports neither lightning nor torch; the first
use of SpotdCheckpoint imports lightning.pytorch (else pytorch_lightning).
"""
import os
import random
import sys

import spotd

__all__ = ["SpotdCheckpoint", "StagedCheckpointIO", "ckpt_path",
           "FILENAME", "DATA_FILE"]

FILENAME = "last.ckpt"
DATA_FILE = "spotd-data-rank%d.pt"  # per global rank, next to FILENAME


def ckpt_path(filename=FILENAME):
    """The checkpoint to pass to fit(ckpt_path=...): $SPOTD_RESUME_DIR/
    filename when spotd restored one, else None (a fresh start)."""
    d = spotd.resume_dir()
    return os.path.join(d, filename) if d else None


def _pl():
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    return pl


def _say(msg):
    print("spotd.lightning: " + msg, file=sys.stderr, flush=True)


def _generators(trainer):
    """The torch generators the train DataLoaders draw their order from
    (the loader's, its sampler's, its batch sampler's sampler's), each
    once, in a fixed order."""
    import torch
    loader = getattr(trainer.fit_loop, "_combined_loader", None)
    out, seen = [], set()
    for dl in (loader.flattened if loader is not None else []):
        bs = getattr(dl, "batch_sampler", None)
        for obj in (dl, getattr(dl, "sampler", None),
                    getattr(bs, "sampler", None)):
            g = getattr(obj, "generator", None)
            if isinstance(g, torch.Generator) and id(g) not in seen:
                seen.add(id(g))
                out.append(g)
    return out


def _rng_get(trainer):
    import torch
    st = {"torch": torch.get_rng_state(), "python": random.getstate(),
          "gens": [g.get_state() for g in _generators(trainer)]}
    if "numpy" in sys.modules:
        st["numpy"] = sys.modules["numpy"].random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _rng_set(trainer, st):
    import torch
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    if "numpy" in st:
        import numpy
        numpy.random.set_state(st["numpy"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])
    gens = _generators(trainer)
    if len(gens) == len(st["gens"]):
        for g, s in zip(gens, st["gens"]):
            g.set_state(s)
    elif st["gens"]:
        _say("warning: the train DataLoader has %d generator(s), the "
             "checkpoint %d: its order is not restored" %
             (len(gens), len(st["gens"])))


def _fetcher(trainer):
    """The fit loop's data fetcher when the callback can replay it (a
    plain fetcher over non-resumable loaders), else None."""
    loop = trainer.fit_loop
    f = getattr(loop, "_data_fetcher", None)
    loader = getattr(loop, "_combined_loader", None)
    if f is None or loader is None or type(f).__name__ not in (
            "_DataFetcher", "_PrefetchDataFetcher"):
        return None
    if any(hasattr(dl, "state_dict") and hasattr(dl, "load_state_dict")
           for dl in loader.flattened):
        return None  # resumable loaders: Lightning restores them itself
    return f


def _set_sampler_epoch(trainer, epoch):
    """Gives the train DataLoaders' samplers (the loader's, its batch
    sampler's) their epoch, as the fit loop does before an epoch."""
    loader = getattr(trainer.fit_loop, "_combined_loader", None)
    for dl in (loader.flattened if loader is not None else []):
        bs = getattr(dl, "batch_sampler", None)
        done = set()
        for obj in (getattr(dl, "sampler", None),
                    getattr(bs, "sampler", None)):
            fn = getattr(obj, "set_epoch", None)
            if callable(fn) and id(obj) not in done:
                done.add(id(obj))
                fn(epoch)


def _skips_epoch_start(trainer):
    """True when Lightning resumes inside an epoch without calling
    on_train_epoch_start for it (Lightning 2.5 and later: the fit loop
    knows it restarted mid-epoch); False on 2.2, which calls it."""
    loop = trainer.fit_loop
    return bool(getattr(loop, "restarted_mid_epoch", False) or
                getattr(loop, "restarted_on_epoch_end", False))


def _counts_saved_batch(trainer):
    """True when Lightning itself counts, on restore, the batch a
    checkpoint saved in on_train_batch_end was taken after (2.5 and
    later); 2.2 does not."""
    return hasattr(trainer.fit_loop.epoch_loop,
                   "restarted_on_train_batch_end")


def _load(path):
    """This rank's data position: ours, with NumPy's random state in it,
    which torch 2.6's default torch.load(weights_only=True) refuses."""
    import torch
    try:
        return torch.load(path, weights_only=False)
    except TypeError:  # a torch without weights_only
        return torch.load(path)


def _slurm_guard(trainer):
    """Under spotd, turns off Lightning's Slurm auto-requeue (its own
    checkpoint and `scontrol requeue` on the requeue signal, SIGTERM
    ignored) and takes the requeue signal as a checkpoint request.
    Returns True when it changed something."""
    if not spotd.under_spotd():
        return False
    conn = getattr(trainer, "_accelerator_connector", None)
    env = getattr(conn, "cluster_environment", None)
    if env is None or type(env).__name__ != "SLURMEnvironment" or \
            not getattr(env, "auto_requeue", False):
        return False
    env.auto_requeue = False
    sig = getattr(env, "requeue_signal", None)
    how = "ignored"
    if sig is not None:
        try:
            spotd.install(sig)
            how = "a spotd checkpoint request"
        except ValueError:  # not the main thread
            pass
    if trainer.is_global_zero:
        _say("under spotd: Lightning's Slurm auto-requeue is off (spotd "
             "requeues and uploads); %s is %s, SIGTERM stops the trainer" %
             (getattr(sig, "name", sig), how))
    return True


def _build():
    pl = _pl()

    class SpotdCheckpoint(pl.Callback):
        """Saves into a new folder of SPOTD_CKPT_DIR when spotd asks (a
        collective decision), marks it complete once per node, and makes
        a mid-epoch resume continue the epoch's data where it stopped."""

        def __init__(self, filename=FILENAME, report_steps=True,
                     resume_data=True):
            super().__init__()
            self.filename = filename
            self.report_steps = report_steps
            self.resume_data = resume_data
            self.saved = []  # folders saved (and marked) by this callback
            self.skipped = 0  # batches dropped at the last resume
            self._epoch_rng = None  # random state the epoch's data came from
            self._resume = None  # this rank's data position to resume at
            self._first = True
            self._saving = False

        def setup(self, trainer, pl_module, stage):
            _slurm_guard(trainer)

        def on_fit_start(self, trainer, pl_module):
            self._first = True
            self._resume = None

        def on_train_start(self, trainer, pl_module):
            # After Lightning restored its loops (restarting is set then).
            skips = _skips_epoch_start(trainer)
            if skips:
                # Lightning 2.5+ calls no on_train_epoch_start for the
                # epoch it resumes in, and makes the next epoch's
                # iterator itself: no later epoch is this run's first.
                self._first = False
            path = trainer.ckpt_path
            if not self.resume_data or not path or \
                    not trainer.fit_loop.epoch_loop.restarting:
                return
            f = os.path.join(os.path.dirname(os.path.abspath(str(path))),
                             DATA_FILE % trainer.global_rank)
            if not os.path.isfile(f):
                _say("warning: %s has no data position for rank %d: the "
                     "epoch restarts from its first batch" %
                     (path, trainer.global_rank))
                return
            self._resume = _load(f)
            if skips:
                # Set the resumed epoch up here, samplers first (Lightning
                # sets the same epoch again after this hook); its
                # iterator, made before any hook, is made again.
                _set_sampler_epoch(
                    trainer, trainer.fit_loop.epoch_progress.current.processed)
                self._epoch_start(trainer, first=True)

        def on_train_epoch_start(self, trainer, pl_module):
            self._epoch_start(trainer)

        def _epoch_start(self, trainer, first=None):
            if first is None:
                first = self._first
            self._first = False
            res, self._resume = self._resume, None
            if not self.resume_data:
                return
            fetcher = _fetcher(trainer)
            if res is not None and res["epoch"] == trainer.current_epoch \
                    and fetcher is not None:
                # The resumed epoch: its order, its consumed batches
                # dropped, then the random state of the checkpoint.
                _rng_set(trainer, res["epoch_rng"])
                self._epoch_rng = res["epoch_rng"]
                iter(fetcher)
                n = 0
                for _ in range(res["batches"]):
                    try:
                        next(fetcher)
                    except StopIteration:
                        break
                    n += 1
                fetcher.fetched -= n  # Lightning adds the done batches
                _rng_set(trainer, res["rng"])
                self.skipped = n
                return
            if res is not None:
                # The checkpoint's batch closed its epoch (Lightning 2.5+
                # resumes in the next one): nothing to replay.
                if res["epoch"] + 1 != trainer.current_epoch:
                    _say("warning: cannot replay the data position of "
                         "epoch %d in epoch %d" %
                         (res["epoch"], trainer.current_epoch))
                _rng_set(trainer, res["rng"])
            self._epoch_rng = _rng_get(trainer)
            if first and fetcher is not None:
                # Lightning made this epoch's iterator before any hook
                # ran; make it again from the state just captured.
                iter(fetcher)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch,
                               batch_idx):
            acc = max(1, int(getattr(trainer, "accumulate_grad_batches",
                                     1) or 1))
            if (batch_idx + 1) % acc:
                return  # mid-accumulation: not a safe point
            if self.report_steps and trainer.is_global_zero:
                spotd.report_step(trainer.global_step)
            asked = spotd.checkpoint_requested()
            if spotd._dist() is None and trainer.world_size > 1:
                asked = trainer.strategy.reduce_boolean_decision(
                    asked, all=False)
            if asked:
                io = _staged_io(trainer)
                busy = io is not None and io.persisting is not None
                if spotd._dist() is not None and trainer.world_size > 1:
                    busy = spotd._agree_max(spotd._dist(), busy) > 0
                if busy:  # the write in flight answers this request
                    return
                self.save(trainer, batch_idx + 1)

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            if not self._saving or _counts_saved_batch(trainer):
                return
            # Saved after the batch's optimizer step, before Lightning
            # counts the batch as completed: count it, else the resumed
            # run does that batch again (Lightning 2.2; 2.5 and later
            # count it themselves on restore, and the checkpoint is left
            # as Lightning wrote it).
            loops = checkpoint.get("loops", {}).get("fit_loop", {})
            bp = loops.get("epoch_loop.batch_progress")
            if bp:
                for k in ("current", "total"):
                    if k in bp and "processed" in bp[k]:
                        bp[k]["completed"] = bp[k]["processed"]
                sd = loops.get("epoch_loop.state_dict", {})
                if "_batches_that_stepped" in sd:
                    sd["_batches_that_stepped"] += 1

        def save(self, trainer, batches=None):
            """Saves now (on every rank) into a new folder and marks it.
            batches: how many of the epoch's batches are consumed (given
            when called after a batch); the data position is saved then."""
            io = _staged_io(trainer)
            if io is not None:
                return self._save_staged(trainer, io, batches)
            with spotd.checkpoint(step=trainer.global_step) as ck:
                self._saving = batches is not None
                try:
                    trainer.save_checkpoint(
                        os.path.join(ck.path, self.filename),
                        weights_only=False)
                finally:
                    self._saving = False
                if batches is not None and self.resume_data and \
                        self._epoch_rng is not None:
                    import torch
                    pos = {"epoch": trainer.current_epoch,
                           "batches": int(batches),
                           "epoch_rng": self._epoch_rng,
                           "rng": _rng_get(trainer)}
                    with ck.open(DATA_FILE % trainer.global_rank) as f:
                        torch.save(pos, f)
            self.saved.append(ck.path)
            return ck.path

        def _data_pos(self, trainer, batches):
            return {"epoch": trainer.current_epoch, "batches": int(batches),
                    "epoch_rng": self._epoch_rng, "rng": _rng_get(trainer)}

        def _save_staged(self, trainer, io, batches):
            """save() with StagedCheckpointIO: the folder as checkpoint()
            makes it, this rank's data position written (fsynced) and
            every rank waited for, then last.ckpt staged; its thread
            marks the folder once written (global rank 0's node)."""
            import torch
            ck = spotd.Checkpoint(step=trainer.global_step)
            ck.__enter__()
            dist = spotd._dist()
            failed = False
            try:
                if batches is not None and self.resume_data and \
                        self._epoch_rng is not None:
                    with ck.open(DATA_FILE % trainer.global_rank) as f:
                        torch.save(self._data_pos(trainer, batches), f)
            except BaseException:
                failed = True
                if dist is None or dist.get_world_size() == 1:
                    raise
            if dist is not None and dist.get_world_size() > 1:
                if spotd._agree_max(dist, failed) > 0:
                    raise spotd.CheckpointAbandoned(
                        "checkpoint %s abandoned: a rank failed" % ck.name)
            io._next = (ck.path, trainer.global_step) \
                if trainer.is_global_zero else None
            self._saving = batches is not None
            try:
                trainer.save_checkpoint(os.path.join(ck.path, self.filename),
                                        weights_only=False)
            finally:
                self._saving = False
                io._next = None
            if ck.writer and not trainer.is_global_zero:
                spotd.done(ck.path, strict=False, step=trainer.global_step)
            self.saved.append(ck.path)
            return ck.path

    return SpotdCheckpoint


def _staged_io(trainer):
    """The trainer's StagedCheckpointIO, or None."""
    io = getattr(trainer.strategy, "checkpoint_io", None)
    cls = _built.get("StagedCheckpointIO")
    return io if cls is not None and isinstance(io, cls) else None


def _build_io():
    pl = _pl()
    try:
        from lightning.fabric.plugins import CheckpointIO, TorchCheckpointIO
    except ImportError:
        from lightning_fabric.plugins import CheckpointIO, TorchCheckpointIO

    class StagedCheckpointIO(CheckpointIO):
        """Lightning's CheckpointIO with staged saves: save_checkpoint()
        snapshots the checkpoint into host memory (spotd.StagedSaver) and
        returns; a thread writes it (default: torch.save streamed into
        the file, as TorchCheckpointIO saves it; else with checkpoint_io)
        and, for a save of SpotdCheckpoint, marks the folder after it.
        checkpoint_io also loads and removes (default TorchCheckpointIO).
        limit: the staging limit (StagedSaver's)."""

        def __init__(self, checkpoint_io=None, limit=None):
            super().__init__()
            self._direct = checkpoint_io is None
            self.checkpoint_io = checkpoint_io or TorchCheckpointIO()
            self._saver = spotd.StagedSaver(limit=limit, writer=self._write)
            self._next = None  # (folder, step) of SpotdCheckpoint's save

        def _write(self, snap, folder, filename):
            path = os.path.join(folder, filename)
            if not self._direct:
                self.checkpoint_io.save_checkpoint(snap, path)
                return
            # What TorchCheckpointIO writes (torch.save of the dict), but
            # streamed into the file: its _atomic_save serialises the whole
            # checkpoint into a BytesIO first, then copies it out, large
            # copies that hold the GIL for up to seconds each and stall
            # the training thread the write is meant to stay out of.
            import torch
            with open(path, "wb") as f:
                torch.save(snap, f)

        @property
        def persisting(self):
            """The StagedSave being written, or None."""
            return self._saver.persisting

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            if storage_options is not None:
                raise TypeError("StagedCheckpointIO takes no storage_options")
            path = os.path.abspath(str(path))
            folder, name = os.path.split(path)
            nxt = self._next
            mark = nxt is not None and nxt[0] == folder
            os.makedirs(folder, exist_ok=True)
            self._saver.stage(checkpoint, step=nxt[1] if mark else None,
                              folder=folder, filename=name, mark=mark)

        def load_checkpoint(self, path, map_location=None):
            self._saver.wait()
            return self.checkpoint_io.load_checkpoint(path, map_location)

        def remove_checkpoint(self, path):
            self._saver.wait()
            self.checkpoint_io.remove_checkpoint(path)

        def wait(self):
            """Waits for the write in flight (raises its error)."""
            return self._saver.wait()

        def teardown(self):
            self._saver.wait()
            self.checkpoint_io.teardown()

    del pl
    return StagedCheckpointIO


_built = {}


def __getattr__(name):
    if name == "SpotdCheckpoint":
        if name not in _built:
            _built[name] = _build()
        return _built[name]
    if name == "StagedCheckpointIO":
        if name not in _built:
            _built[name] = _build_io()
        return _built[name]
    raise AttributeError("module 'spotd.lightning' has no attribute %r"
                         % name)
