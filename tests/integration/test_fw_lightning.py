"""spotd.lightning.SpotdCheckpoint on a real PyTorch Lightning Trainer
(CPU, a tiny model), spotd's request channel played by this test (seq 1
before the start, seq 2 written after step 5): the callback saves
step-000001/last.ckpt and step-000005/last.ckpt, each marked
SPOTD_COMPLETE; a second run with ckpt_path=spotd.lightning.ckpt_path()
continues at step 6. Skips (77) when neither lightning nor
pytorch_lightning is importable by /usr/bin/python3 (Debian has no
package for them: CI here skips it)."""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

RUN = r"""
import json, os, struct, sys
import spotd, spotd.lightning
import torch
try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

g = torch.Generator().manual_seed(0)
x = torch.randn(256, 4, generator=g)
data = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

steps_seen = []
class Spotd(pl.Callback):  # plays spotd: a second request after step 5
    def on_train_batch_end(self, trainer, m, out, batch, i):
        steps_seen.append(trainer.global_step)
        if trainer.global_step == 5:
            with open(os.environ["SPOTD_REQUEST_FILE"], "r+b") as f:
                f.seek(16)
                f.write(struct.pack("<Q", 2))

cb = spotd.lightning.SpotdCheckpoint()
trainer = pl.Trainer(max_steps=int(sys.argv[1]), accelerator="cpu",
                     devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[Spotd(), cb])
trainer.fit(Tiny(), data, ckpt_path=spotd.lightning.ckpt_path())
print(json.dumps({"first": steps_seen[0], "last": trainer.global_step,
                  "saved": [os.path.basename(p) for p in cb.saved]}))
"""


def main():
    cp = subprocess.run([sl.PY3, "-c", "try:\n import lightning.pytorch\n"
                         "except ImportError:\n import pytorch_lightning"],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        sl.skip("neither lightning nor pytorch_lightning is importable by "
                "%s: the Lightning integration (spotd.lightning) is not "
                "tested here" % sl.PY3)
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-lightning-") as tmp:
        env, root, req = sl.played_request_env(tmp, drop=("LOCAL_RANK",))
        cp = sl.run([sl.PY3, "-c", RUN, "8"], timeout=600, env=env)
        out = cp.stdout.strip().splitlines()
        got = json.loads(out[-1]) if cp.returncode == 0 and out else {}
        c.check(got.get("saved") == ["step-000001", "step-000005"],
                "the callback saved step-000001 (request before the start) "
                "and step-000005", cp.stdout + cp.stderr[-3000:])
        for n in ("step-000001", "step-000005"):
            d = os.path.join(root, n)
            files = sorted(os.listdir(d)) if os.path.isdir(d) else []
            c.check(files == ["SPOTD_COMPLETE", "last.ckpt"],
                    "%s holds last.ckpt and the marker" % n, repr(files))
        with open(req, "r+b") as f:
            f.seek(24)
            f.write(struct.pack("<Q", 2))  # served
        env["SPOTD_RESUME_DIR"] = os.path.join(root, "step-000005")
        cp = sl.run([sl.PY3, "-c", RUN, "8"], timeout=600, env=env)
        out = cp.stdout.strip().splitlines()
        got = json.loads(out[-1]) if cp.returncode == 0 and out else {}
        c.check(got.get("first") == 6 and got.get("last") == 8 and
                got.get("saved") == [],
                "fit(ckpt_path=spotd.lightning.ckpt_path()): the rerun "
                "continues at step 6", cp.stdout + cp.stderr[-3000:])
    c.finish()


if __name__ == "__main__":
    main()
