#!/usr/bin/env python3
"""A Hugging Face Trainer job under spotd: a small GPT-2 (built from a
config, no download) on random tokens, with spotd.hf.SpotdCallback.

    spotd run --job J --store s3://B/P -- \\
        torchrun --nproc_per_node 2 examples/huggingface/train_hf.py --steps 500

(one process: `spotd run ... -- python examples/huggingface/train_hf.py`).

The three lines that make it a spotd job:

- TrainingArguments(output_dir=spotd.hf.output_dir(), ...): the Trainer
  saves checkpoint-N folders directly under $SPOTD_CKPT_DIR, where spotd
  uploads from. save_total_limit stays unset (the Trainer's rotation would
  delete folders spotd may be uploading; spotd --keep prunes the store).
- callbacks=[spotd.hf.SpotdCallback()]: when spotd asks (a spot notice,
  --interval) every rank learns it at the same step, the Trainer saves
  checkpoint-N at the end of that step, and once every rank has written
  its files the node's local rank 0 marks the folder complete.
- trainer.train(resume_from_checkpoint=spotd.resume_dir()): after a
  preemption spotd restores the newest committed checkpoint and the run
  continues at its step (None: a fresh start).

Needs torch 2.x and transformers (not in Debian: pip install transformers).
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
import spotd.hf

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer,
                          TrainingArguments)


class RandomTokens(torch.utils.data.Dataset):
    """Sample i is a function of (seed, i) only: a resumed run sees the
    same data."""

    def __init__(self, n, length, vocab, seed):
        self.n, self.length, self.vocab, self.seed = n, length, vocab, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1000003 + i)
        ids = torch.randint(0, self.vocab, (self.length,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="the Trainer's own saves every N steps (0: only "
                   "when spotd asks)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    cfg = GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=8192,
                     n_positions=128)
    torch.manual_seed(a.seed)
    model = GPT2LMHeadModel(cfg)
    args = TrainingArguments(
        output_dir=spotd.hf.output_dir(),
        max_steps=a.steps, per_device_train_batch_size=a.batch,
        learning_rate=3e-4, seed=a.seed, logging_steps=10, report_to=[],
        save_strategy="steps" if a.save_every else "no",
        save_steps=a.save_every or 500, save_total_limit=None)
    trainer = Trainer(model=model, args=args,
                      train_dataset=RandomTokens(100000, 128, 8192, a.seed),
                      callbacks=[spotd.hf.SpotdCallback()])
    resume = spotd.resume_dir()
    if resume and trainer.is_world_process_zero():
        print("resuming from %s" % resume, flush=True)
    trainer.train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    main()
