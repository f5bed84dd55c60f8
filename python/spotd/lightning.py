"""spotd for PyTorch Lightning, imported on use:

    import spotd.lightning
    import lightning.pytorch as pl        # or pytorch_lightning

    trainer = pl.Trainer(callbacks=[spotd.lightning.SpotdCheckpoint()])
    trainer.fit(model, data, ckpt_path=spotd.lightning.ckpt_path())

SpotdCheckpoint, after each optimizer step (on_train_batch_end, at the
end of a gradient-accumulation cycle):

- asks spotd.checkpoint_requested() on every rank. Under torch.distributed
  (DDP, FSDP, DeepSpeed) that is the helper's collective (one all_reduce),
  otherwise the strategy's reduce_boolean_decision: every rank takes the
  same decision, which trainer.save_checkpoint needs (it is collective).
- saves inside spotd.checkpoint(step=trainer.global_step): a new folder
  SPOTD_CKPT_DIR/step-NNNNNN, trainer.save_checkpoint(folder/last.ckpt)
  on every rank (the strategy decides who writes: global rank 0 for DDP,
  every rank its shards for FSDP or DeepSpeed), then, after every rank has
  left the block, one SPOTD_COMPLETE per node by its local rank 0.

Lightning needs no signal from spotd: the request comes through spotd's
request channel. (A process that loads LLVM, which Lightning's stack may
do, can lose a SIGUSR1 handler to it; the channel has no such problem.)

ckpt_path() is the file to resume from (in $SPOTD_RESUME_DIR) or None.

`import spotd.lightning` imports neither lightning nor torch; the first
use of SpotdCheckpoint imports lightning.pytorch (else pytorch_lightning).
"""
import os

import spotd

__all__ = ["SpotdCheckpoint", "ckpt_path", "FILENAME"]

FILENAME = "last.ckpt"


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


def _build():
    pl = _pl()

    class SpotdCheckpoint(pl.Callback):
        """Saves into a new folder of SPOTD_CKPT_DIR when spotd asks (a
        collective decision) and marks it complete once per node."""

        def __init__(self, filename=FILENAME, report_steps=True):
            super().__init__()
            self.filename = filename
            self.report_steps = report_steps
            self.saved = []  # folders saved (and marked) by this callback

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
                self.save(trainer)

        def save(self, trainer):
            """Saves now (on every rank) into a new folder and marks it."""
            with spotd.checkpoint(step=trainer.global_step) as ck:
                trainer.save_checkpoint(os.path.join(ck.path, self.filename))
            self.saved.append(ck.path)
            return ck.path

    return SpotdCheckpoint


_built = {}


def __getattr__(name):
    if name == "SpotdCheckpoint":
        if name not in _built:
            _built[name] = _build()
        return _built[name]
    raise AttributeError("module 'spotd.lightning' has no attribute %r"
                         % name)
