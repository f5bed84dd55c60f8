#!/usr/bin/python3
"""The Hugging Face Trainer's stall per checkpoint: spotd.hf.StagedTrainer
(the state staged into host memory, checkpoint-N written and marked in
the background) against the Trainer's own save plus the marker
SpotdCallback writes after it (spotd.done(): fsync, SPOTD_COMPLETE), on
the same Trainer, model and Adam state, side by side in one process, in
alternating rounds.

    PYTHONUSERBASE=... /usr/bin/python3 bench/hf_staged_bench.py \
        [--layers 6] [--width 4096] [--rounds 5] [--dir /tmp] [--markdown]

The model: --layers Linear(width, width) (fp32; 6 x 4096 = 101M
parameters, 0.38 GiB), trained one step with AdamW so the optimizer
holds its two moments: about 1.13 GiB of state in all, saved as
model.safetensors, optimizer.pt, scheduler.pt, rng_state.pth,
trainer_state.json. "sync" is Trainer._save_checkpoint + spotd.done();
"staged" is StagedTrainer._save_checkpoint (the stall), then the wait for
its persist ("persist": from the stall's end until the marker). The
first staged save allocates and touches the buffers (reported apart, not
in the medians). Needs transformers (and accelerate) on /usr/bin/python3.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
for k in ("SPOTD_SOCKET", "SPOTD_REQUEST_FILE"):
    os.environ.pop(k, None)
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

import spotd  # noqa: E402
import spotd.hf  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self, layers, width):
        super().__init__()
        self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width)
                                         for _ in range(layers)])

    def forward(self, x, labels):
        return {"loss": self.net(x).pow(2).mean() + 0 * labels.sum()}


class Data(torch.utils.data.Dataset):
    def __init__(self, width):
        self.width = width

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": torch.full((self.width,), 0.01 * i),
                "labels": torch.zeros(1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="spotd-hf-bench-", dir=a.dir)
    torch.manual_seed(1)
    model = Net(a.layers, a.width)
    args = TrainingArguments(output_dir=root, max_steps=1, report_to=[],
                             per_device_train_batch_size=2, use_cpu=True,
                             save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, remove_unused_columns=False)
    tr = spotd.hf.StagedTrainer(model=model, args=args,
                                train_dataset=Data(a.width))
    tr.train()
    nbytes = sum(t.numel() * t.element_size()
                 for t in model.state_dict().values())
    for st in tr.optimizer.state_dict()["state"].values():
        nbytes += sum(t.numel() * t.element_size() for t in st.values()
                      if isinstance(t, torch.Tensor))
    step = [tr.state.global_step]

    def folder():
        return os.path.join(root, "checkpoint-%d" % step[0])

    def sync():
        t0 = time.monotonic()
        Trainer._save_checkpoint(tr, tr.model, None)
        spotd.done(folder(), strict=False, step=step[0])
        return time.monotonic() - t0, None

    def staged():
        t0 = time.monotonic()
        tr._save_checkpoint(tr.model, None)
        t1 = time.monotonic()
        tr.spotd_saver.wait()
        return t1 - t0, time.monotonic() - t1

    def one(fn):
        step[0] += 1
        tr.state.global_step = step[0]
        out = fn()
        if not os.path.exists(os.path.join(folder(), "SPOTD_COMPLETE")):
            raise SystemExit("no marker in %s" % folder())
        shutil.rmtree(folder())
        return out

    first = one(staged)
    res = {"sync": [], "staged": [], "persist": []}
    for r in range(a.rounds):
        order = (sync, staged) if r % 2 == 0 else (staged, sync)
        for fn in order:
            s, p = one(fn)
            res[fn.__name__].append(s)
            if p is not None:
                res["persist"].append(p)
        print("round %d: sync %.3f s, staged %.3f s (persist %.3f s)" % (
            r + 1, res["sync"][-1], res["staged"][-1], res["persist"][-1]),
            file=sys.stderr, flush=True)
    shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    rows = [("state", "%.2f GiB (model + AdamW moments)"
             % (nbytes / float(1 << 30))),
            ("first staged save (buffers allocated)", "%.3f s" % first[0]),
            ("sync: Trainer._save_checkpoint + spotd.done()",
             "%.3f s" % med["sync"]),
            ("staged: StagedTrainer._save_checkpoint (stall)",
             "%.3f s" % med["staged"]),
            ("staged: background persist until the marker",
             "%.3f s" % med["persist"]),
            ("stall ratio staged / sync",
             "%.3fx" % (med["staged"] / med["sync"]))]
    if a.markdown:
        print("| median of %d alternating rounds | |\n|---|---|" % a.rounds)
        for k, v in rows:
            print("| %s | %s |" % (k, v))
    else:
        for k, v in rows:
            print("%-50s %s" % (k, v))


if __name__ == "__main__":
    main()
