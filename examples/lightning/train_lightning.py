#!/usr/bin/env python3
"""A PyTorch Lightning job under spotd: a small MLP on synthetic data, with
spotd.lightning.SpotdCheckpoint.

    spotd run --job J --store s3://B/P -- \\
        python examples/lightning/train_lightning.py --steps 2000 --devices 2

(Lightning starts the other processes of --devices N itself.)

The two lines that make it a spotd job:

- callbacks=[spotd.lightning.SpotdCheckpoint()]: after each optimizer step
  the ranks decide together whether spotd asked (one all_reduce); when it
  did, every rank calls trainer.save_checkpoint into a new folder
  SPOTD_CKPT_DIR/step-NNNNNN/last.ckpt and, once every rank is done, the
  node's local rank 0 marks it complete.
- trainer.fit(..., ckpt_path=spotd.lightning.ckpt_path()): after a
  preemption the run continues from the checkpoint spotd restored (None:
  a fresh start).

No signal handler is involved: spotd's request comes through a shared
file the helper maps, so nothing that takes SIGUSR1 during fit (LLVM,
loaded by parts of the stack, registers its own SIGUSR1 handler) can
swallow it.

Needs torch 2.x and lightning (pip install lightning).
"""
import argparse
import os
import sys

try:
    import spotd
except ImportError:  # run from a source tree, not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "..", "..", "python"))
    import spotd
import spotd.lightning

import torch
try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl


class MLP(pl.LightningModule):
    def __init__(self, d_in=64, hidden=512, classes=10, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(d_in, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, classes))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def data(n, seed, batch):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g)
    y = (x[:, :10].argmax(1)).long()
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=True,
        generator=torch.Generator().manual_seed(seed))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    pl.seed_everything(a.seed)
    trainer = pl.Trainer(
        max_steps=a.steps, accelerator=a.accelerator, devices=a.devices,
        strategy="ddp" if a.devices > 1 else "auto",
        callbacks=[spotd.lightning.SpotdCheckpoint()],
        enable_checkpointing=False,  # spotd's callback does the saving
        logger=False)
    trainer.fit(MLP(), data(200000, a.seed, 64),
                ckpt_path=spotd.lightning.ckpt_path())


if __name__ == "__main__":
    main()
