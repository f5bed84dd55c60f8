"""A small Lightning training run for the framework tests (test_fw_*.py),
run as spotd would run it: spotd.lightning.SpotdCheckpoint saves when
spotd asks, fit(ckpt_path=spotd.lightning.ckpt_path()) resumes.

    fw_lightning_trainer.py --steps N [--devices 2] [--sleep S]
                            [--signals STEP:SIG,...]

A Linear-Dropout-Linear model on 64 fixed samples, a plain DataLoader
(batch 4, shuffle=True with a seeded generator; under DDP Lightning's
DistributedSampler), SGD; several epochs. Every rank prints after each
optimizer step

    step G rank R epoch E batch I,J,.. loss HEX

(the sample indices of the batch and the loss as float.hex(): dropout
draws change it) and at the end `final rank R SHA256` of the weights."""
import argparse
import hashlib
import os
import signal
import sys
import time

import spotd
import spotd.lightning
import torch

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl


def say(line):
    """One line in one write: the ranks share stdout."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


class Tiny(pl.LightningModule):
    def __init__(self, sleep, signals):
        super().__init__()
        self.signals = signals
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16),
                                       torch.nn.Dropout(0.5),
                                       torch.nn.Linear(16, 1))
        self.sleep = sleep
        self.last = None

    def training_step(self, batch, i):
        idx, x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.last = (idx.tolist(), loss.item())
        return loss

    def on_train_batch_end(self, out, batch, i):
        idx, loss = self.last
        say("step %d rank %d epoch %d batch %s loss %s" %
            (self.trainer.global_step, self.global_rank,
             self.trainer.current_epoch, ",".join(map(str, idx)),
             float(loss).hex()))
        sig = self.signals.get(self.trainer.global_step)
        if sig:  # as if the scheduler sent it
            os.kill(os.getpid(), getattr(signal, "SIG" + sig))
            time.sleep(0.2)
        if self.sleep:
            time.sleep(self.sleep)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--signals", default="",
                    help="STEP:SIG,...: send SIG to itself after STEP")
    ap.add_argument("--staged-delay", type=float, default=None,
                    help="staged saves (spotd.lightning.StagedCheckpointIO)"
                    ", the background write held SEC seconds first")
    a = ap.parse_args()
    signals = {int(k): v for k, v in (x.split(":") for x in
                                      a.signals.split(",") if x)}
    pl.seed_everything(7, workers=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    ds = torch.utils.data.TensorDataset(torch.arange(64), x,
                                        x.sum(1, keepdim=True))
    data = torch.utils.data.DataLoader(
        ds, batch_size=4, shuffle=True,
        generator=torch.Generator().manual_seed(3))
    model = Tiny(a.sleep, signals)
    kw = {}
    if a.devices > 1:
        kw["strategy"] = "ddp"
    cb = spotd.lightning.SpotdCheckpoint()
    if a.staged_delay is not None:
        class SlowStaged(spotd.lightning.StagedCheckpointIO):
            """The background write (the default one: torch.save into
            last.ckpt) after a delay: the steps go on meanwhile and
            change the live tensors in place (a snapshot that only
            referenced them would save a later state)."""
            def _write(self, snap, folder, filename):
                time.sleep(a.staged_delay)
                super()._write(snap, folder, filename)

        kw["plugins"] = [SlowStaged()]
    trainer = pl.Trainer(max_steps=a.steps, accelerator="cpu",
                         devices=a.devices, logger=False,
                         enable_checkpointing=False,
                         enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[cb], **kw)
    trainer.fit(model, data, ckpt_path=spotd.lightning.ckpt_path())
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode() + v.detach().cpu().numpy().tobytes())
    say("final rank %d %s" % (trainer.global_rank, h.hexdigest()))
    if cb.saved:
        say("saved rank %d %s" % (trainer.global_rank, ",".join(
            os.path.basename(p) for p in cb.saved)))
    if getattr(cb, "skipped", 0):  # a replayed epoch
        say("skipped rank %d %d" % (trainer.global_rank, cb.skipped))


if __name__ == "__main__":
    sys.exit(main())
