"""spotd.hf.SpotdCallback on a real Hugging Face Trainer (CPU, a tiny
model), spotd's request channel played by this test (a request file with
seq 1 before the start, seq 2 written at step 5, as spotd writes them):
the Trainer saves checkpoint-1 and checkpoint-5, each gets SPOTD_COMPLETE
after the Trainer's files; a second run with
resume_from_checkpoint=spotd.resume_dir() (checkpoint-5) continues at
step 6. Skips (77) when transformers is not importable by /usr/bin/python3
(Debian has no package for it: CI here skips it)."""
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
import spotd, spotd.hf
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def forward(self, x, labels=None):
        out = self.lin(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 256
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(4, generator=g)
        return {"x": x, "labels": x.sum(0, keepdim=True)}

steps_seen = []
class Spotd(TrainerCallback):  # plays spotd: a second request at step 5
    def on_step_end(self, args, state, control, **kw):
        steps_seen.append(state.global_step)
        if state.global_step == 5:
            with open(os.environ["SPOTD_REQUEST_FILE"], "r+b") as f:
                f.seek(16)
                f.write(struct.pack("<Q", 2))

args = TrainingArguments(output_dir=spotd.hf.output_dir(),
                         max_steps=int(sys.argv[1]),
                         per_device_train_batch_size=4, save_strategy="no",
                         logging_strategy="no", report_to=[],
                         dataloader_num_workers=0)
cb = spotd.hf.SpotdCallback()
trainer = Trainer(model=Tiny(), args=args, train_dataset=Data(),
                  callbacks=[Spotd(), cb])
trainer.train(resume_from_checkpoint=spotd.resume_dir())
print(json.dumps({"first": steps_seen[0], "last": trainer.state.global_step,
                  "marked": [os.path.basename(m) for m in cb.marked]}))
"""


def main():
    cp = subprocess.run([sl.PY3, "-c", "import transformers"],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        sl.skip("transformers is not importable by %s: the Hugging Face "
                "Trainer integration (spotd.hf) is not tested here" % sl.PY3)
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-hf-") as tmp:
        env, root, req = sl.played_request_env(tmp)
        cp = sl.run([sl.PY3, "-c", RUN, "8"], timeout=600, env=env)
        out = cp.stdout.strip().splitlines()
        got = json.loads(out[-1]) if cp.returncode == 0 and out else {}
        c.check(got.get("marked") == ["checkpoint-1", "checkpoint-5"],
                "the Trainer saved and the callback marked checkpoint-1 "
                "(request before the start) and checkpoint-5", cp.stdout +
                cp.stderr[-3000:])
        for n in ("checkpoint-1", "checkpoint-5"):
            files = os.listdir(os.path.join(root, n)) if os.path.isdir(
                os.path.join(root, n)) else []
            c.check("SPOTD_COMPLETE" in files and "trainer_state.json" in files
                    and any(f.startswith(("model.safetensors",
                                          "pytorch_model")) for f in files),
                    "%s holds the Trainer's files and the marker" % n,
                    repr(files))
        c.check(sorted(os.listdir(root)) == ["checkpoint-1", "checkpoint-5"],
                "no other folder", repr(os.listdir(root)))
        # The rerun resumes from checkpoint-5 (its own request file: none).
        with open(req, "r+b") as f:
            f.seek(24)
            f.write(struct.pack("<Q", 2))  # served
        env["SPOTD_RESUME_DIR"] = os.path.join(root, "checkpoint-5")
        cp = sl.run([sl.PY3, "-c", RUN, "8"], timeout=600, env=env)
        out = cp.stdout.strip().splitlines()
        got = json.loads(out[-1]) if cp.returncode == 0 and out else {}
        c.check(got.get("first") == 6 and got.get("last") == 8 and
                got.get("marked") == [],
                "resume_from_checkpoint=spotd.resume_dir(): the rerun "
                "continues at step 6, no new request", cp.stdout +
                cp.stderr[-3000:])
    c.finish()


if __name__ == "__main__":
    main()
