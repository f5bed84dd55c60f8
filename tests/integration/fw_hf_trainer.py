"""A small Hugging Face Trainer run for the framework tests
(test_fw_hf.py), run as spotd would run it: spotd.hf.SpotdCallback saves
when spotd asks, train(resume_from_checkpoint=spotd.resume_dir())
resumes.

    fw_hf_trainer.py --steps N [--sleep S] [--staged]

A Linear-Dropout-Linear model on 64 fixed samples, batches of 4, two
batches per optimizer step (gradient accumulation), one DataLoader
worker, the Trainer's shuffled sampler and seed. After each optimizer
step it prints

    step G rank R batch I,J,..;K,L,.. loss HEX;HEX

(the sample indices and the loss of each micro-batch, float.hex():
dropout draws change it) and at the end `final rank R SHA256` of the
weights.

--staged: spotd.hf.StagedTrainer. Its persist of checkpoint-N waits
(the test's knob, through the trainer's hook) until the training loop
has finished step N+1, so the optimizer changed the weights in place
while the snapshot was persisting, and prints

    persist checkpoint-N after step M"""
import argparse
import hashlib
import os
import sys
import threading
import time

import spotd
import spotd.hf
import torch
from transformers import (Trainer, TrainerCallback, TrainingArguments,
                          set_seed)


def say(line):
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16),
                                       torch.nn.Dropout(0.5),
                                       torch.nn.Linear(16, 1))
        self.seen = []

    def forward(self, x, labels, idx):
        loss = torch.nn.functional.mse_loss(self.net(x), labels)
        if self.training:
            self.seen.append((idx.tolist(), loss.item()))
        return {"loss": loss}


class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(64, 4, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.x[i].sum(0, keepdim=True),
                "idx": torch.tensor(i)}


STEPPED = threading.Condition()
PROGRESS = {"step": 0, "ended": False}


def staged_trainer():
    class Held(spotd.hf.StagedTrainer):
        def _spotd_before_persist(self, folder):
            n = int(folder.rsplit("-", 1)[1])
            with STEPPED:
                STEPPED.wait_for(lambda: PROGRESS["step"] > n or
                                 PROGRESS["ended"], timeout=300)
                say("persist %s after step %d" % (os.path.basename(folder),
                                                  PROGRESS["step"]))
    return Held


class Log(TrainerCallback):
    def __init__(self, model, sleep):
        self.model, self.sleep = model, sleep

    def on_train_end(self, args, state, control, **kw):
        with STEPPED:
            PROGRESS["ended"] = True
            STEPPED.notify_all()

    def on_step_end(self, args, state, control, **kw):
        with STEPPED:
            PROGRESS["step"] = state.global_step
            STEPPED.notify_all()
        seen, self.model.seen = self.model.seen, []
        say("step %d rank %d batch %s loss %s" % (
            state.global_step, args.process_index,
            ";".join(",".join(map(str, i)) for i, _ in seen),
            ";".join(float(v).hex() for _, v in seen)))
        if self.sleep:
            time.sleep(self.sleep)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--staged", action="store_true")
    a = ap.parse_args()
    set_seed(7)  # the initial weights
    model = Tiny()
    args = TrainingArguments(
        output_dir=spotd.hf.output_dir(), max_steps=a.steps, seed=7,
        per_device_train_batch_size=4, gradient_accumulation_steps=2,
        learning_rate=0.05, save_strategy="no", logging_strategy="no",
        report_to=[], dataloader_num_workers=1, use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False)
    cls = staged_trainer() if a.staged else Trainer
    trainer = cls(model=model, args=args, train_dataset=Data(),
                callbacks=[Log(model, a.sleep), spotd.hf.SpotdCallback()])
    trainer.train(resume_from_checkpoint=spotd.resume_dir())
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode() + v.detach().cpu().numpy().tobytes())
    say("final rank %d %s" % (args.process_index, h.hexdigest()))


if __name__ == "__main__":
    sys.exit(main())
