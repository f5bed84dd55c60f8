"""spotd.hf.SpotdCallback on a real Hugging Face Trainer (CPU, a tiny model
with dropout, gradient accumulation, a DataLoader worker) under `spotd
run`: a spot notice, the Trainer's checkpoint-N committed to the store
(exit 75), a fresh node restores it and resumes with
train(resume_from_checkpoint=spotd.resume_dir()); every later step (each
micro-batch's sample ids and loss) and the final weights equal an
uninterrupted run's (fwlib.run).

The same with spotd.hf.StagedTrainer (--staged), fewer steps: the
Trainer's checkpoint is staged and persisted in the background, its
persist held (the trainer's knob) until the loop has finished the next
step, so the optimizer changed the weights while it ran; the folder gets
its marker only after that, spotd commits it, and the resume from it is
bit-identical to the uninterrupted (unstaged) run.

Then the callback alone, on the Trainer's own argument and state objects:
- save_only_model=True is warned about at the start of training;
- spotd.hf.StagedTrainer on a GPT-2 with tied embeddings (a
  PreTrainedModel: save_pretrained) writes the files the Trainer writes,
  byte-identical but for optimizer.pt (its tensors compared) and
  training_args.bin;
- spotd.hf.StagedTrainer: a request that comes while a staged save is
  being written is answered by that save (the callback asks for none);
- spotd.hf.StagedTrainer with save_total_limit=1 (a real training of a
  tiny model, saving every 2 steps): each persist finds the previous
  checkpoint still there and marked, and the rotation deletes it only
  after the new one has its marker;
- a checkpoint saved during a hyperparameter search
  (output_dir/run-<trial>/checkpoint-N) gets its marker;
- with the Trainer's SIGTERM checkpointing on (enable_jit_checkpoint,
  here a stand-in handler): SIGTERM after a checkpoint spotd asked for
  ends the process without a second save; before one, the Trainer's
  handler runs.

Needs transformers: tools/test gives it (the frameworks archive,
$SPOTD_TEST_PYTHONUSERBASE; then a missing import fails); otherwise skips
(77) when /usr/bin/python3 does not import it. Skips without the test S3
server."""
import os
import re
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402
import fwlib  # noqa: E402

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "fw_hf_trainer.py")
STEPS = 20  # 64 samples, 8 per optimizer step: 8 steps per epoch
STAGED_STEPS = 20  # time for the commit before the run ends

UNIT = r"""
import os, signal, struct, sys, time
import spotd, spotd.hf
from transformers import TrainingArguments
from transformers.trainer_callback import TrainerControl, TrainerState

mode, root = sys.argv[1], sys.argv[2]
args = TrainingArguments(output_dir=root, report_to=[],
                         save_only_model=(mode == "save_only_model"))
state, control = TrainerState(), TrainerControl()
cb = spotd.hf.SpotdCallback(report_steps=False)
if mode == "save_only_model":
    cb.on_train_begin(args, state, control)
elif mode == "hp_search":
    d = os.path.join(root, "run-0", "checkpoint-3")
    os.makedirs(d)
    open(os.path.join(d, "model.safetensors"), "wb").close()
    state.global_step = 3
    cb.on_save(args, state, control)
    print("marked", os.path.exists(os.path.join(d, "SPOTD_COMPLETE")))
elif mode in ("staged-rotate", "staged-answer"):
    import threading
    import torch
    from transformers import TrainerCallback

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.lin(x), labels)}

    class D(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            x = torch.full((2,), float(i))
            return {"x": x, "labels": x.sum(0, keepdim=True)}

    def folders():
        return [(d, os.path.exists(os.path.join(root, d, "SPOTD_COMPLETE")))
                for d in sorted(os.listdir(root))]

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if answer and state.global_step == 2:  # step 3 after the ask
                asked.wait(120)

        def on_step_end(self, args, state, control, **kw):
            with cv:
                done[0] = state.global_step
                cv.notify_all()

    class T(spotd.hf.StagedTrainer):
        def _spotd_before_persist(self, folder):
            # its own file: the Trainer's end-of-training print on stdout
            # may interleave with a print from this (the persist's) thread
            with open(root + ".persist", "a") as f:
                f.write("persist %s %s\n" % (os.path.basename(folder),
                                               folders()))
            if answer and folder.endswith("-2"):
                # a request (seq 1) while this save persists (step 3
                # starts after it), held until the loop has finished step 3
                with open(os.environ["SPOTD_REQUEST_FILE"], "r+b") as f:
                    f.seek(16)
                    f.write(struct.pack("<Q", 1))
                asked.set()
                with cv:
                    cv.wait_for(lambda: done[0] >= 3, timeout=120)

    cv, done, answer = threading.Condition(), [0], mode == "staged-answer"
    asked = threading.Event()
    args = TrainingArguments(output_dir=root, report_to=[],
                             max_steps=4 if answer else 6, save_steps=2,
                             save_total_limit=None if answer else 1,
                             use_cpu=True,
                             per_device_train_batch_size=2, disable_tqdm=True,
                             logging_strategy="no",
                             remove_unused_columns=False)
    T(model=M(), args=args, train_dataset=D(),
      callbacks=[cb, Steps()]).train()
    print("left", folders(), flush=True)
elif mode == "staged-gpt2":
    import filecmp
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, set_seed

    class D(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 100, (16,), generator=g)
            return {"input_ids": ids, "labels": ids}

    def train(cls, out):
        set_seed(3)
        m = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=2,
                                       n_head=2, n_positions=32))
        a = TrainingArguments(output_dir=out, max_steps=4, save_steps=2,
                              report_to=[], use_cpu=True, disable_tqdm=True,
                              logging_strategy="no",
                              per_device_train_batch_size=4)
        cls(model=m, args=a, train_dataset=D(), callbacks=[
            spotd.hf.SpotdCallback(report_steps=False)]).train()

    plain, staged = os.path.join(root, "plain"), os.path.join(root, "staged")
    train(Trainer, plain)
    train(spotd.hf.StagedTrainer, staged)
    for d in ("checkpoint-2", "checkpoint-4"):
        fs = sorted(os.listdir(os.path.join(plain, d)))
        same = [f for f in fs if f not in ("training_args.bin",
                                           "optimizer.pt") and
                filecmp.cmp(os.path.join(plain, d, f),
                            os.path.join(staged, d, f), shallow=False)]
        a = torch.load(os.path.join(plain, d, "optimizer.pt"))
        b = torch.load(os.path.join(staged, d, "optimizer.pt"))
        opt = a["param_groups"] == b["param_groups"] and all(
            torch.equal(v, b["state"][i][k]) if torch.is_tensor(v)
            else v == b["state"][i][k]
            for i in a["state"] for k, v in a["state"][i].items())
        print(d, fs == sorted(os.listdir(os.path.join(staged, d))), same,
              "optimizer", opt, flush=True)
else:  # jit-after, jit-before
    def jit(signum, frame):
        print("jit save", flush=True)
        os._exit(3)
    signal.signal(signal.SIGTERM, jit)  # what the Trainer installs
    args.enable_jit_checkpoint = True
    cb.on_train_begin(args, state, control)
    state.global_step = 4
    cb.on_step_end(args, state, control)
    if control.should_save:
        os.makedirs(os.path.join(root, "checkpoint-4"))
        cb.on_save(args, state, control)
    print("saved", [os.path.basename(p) for p in cb.requested], flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    print("survived", flush=True)
"""


def unit(c, env):
    with tempfile.TemporaryDirectory(prefix="spotd-hf-unit-") as tmp:
        def run(mode, seq=0):
            root = os.path.join(tmp, mode)
            req = os.path.join(tmp, mode + ".req")
            sl.write_request_file(req, seq)
            e = dict(env, SPOTD_CKPT_DIR=root, SPOTD_REQUEST_FILE=req,
                     SPOTD_SOCKET=os.path.join(tmp, "no-spotd.sock"))
            return sl.run([sl.PY3, "-c", UNIT, mode, root], env=e,
                          timeout=300)

        cp = run("save_only_model")
        c.check(cp.returncode == 0 and "save_only_model=True" in cp.stderr,
                "HF: save_only_model=True is warned about",
                cp.stdout + cp.stderr[-2000:])
        cp = run("hp_search")
        c.check(cp.returncode == 0 and "marked True" in cp.stdout,
                "HF: a hyperparameter-search checkpoint "
                "(output_dir/run-0/checkpoint-3) gets its marker",
                cp.stdout + cp.stderr[-2000:])
        cp = run("staged-rotate")
        want = ["persist checkpoint-2 [('checkpoint-2', False)]",
                "persist checkpoint-4 [('checkpoint-2', True), "
                "('checkpoint-4', False)]",
                "persist checkpoint-6 [('checkpoint-4', True), "
                "('checkpoint-6', False)]",
                "left [('checkpoint-6', True)]"]
        try:
            with open(os.path.join(tmp, "staged-rotate.persist")) as f:
                got = f.read().splitlines()
        except OSError:
            got = []
        got += [x for x in cp.stdout.splitlines() if x.startswith("left ")]
        c.check(cp.returncode == 0 and got == want,
                "HF StagedTrainer: save_total_limit=1 rotates only after the "
                "new checkpoint is written and marked", "\n".join(got) +
                cp.stderr[-2000:])
        cp = run("staged-answer")
        got = [x for x in cp.stdout.splitlines() if x.startswith("left ")]
        c.check(cp.returncode == 0 and got == [
            "left [('checkpoint-2', True), ('checkpoint-4', True)]"],
                "HF StagedTrainer: a request while checkpoint-2 persists is "
                "answered by it (no checkpoint-3)", "\n".join(got) +
                cp.stderr[-2000:])
        cp = run("staged-gpt2")
        got = [x for x in cp.stdout.splitlines() if x.startswith("check")]
        files = ("['SPOTD_COMPLETE', 'config.json', 'generation_config.json', "
                 "'model.safetensors', 'rng_state.pth', 'scheduler.pt', "
                 "'trainer_state.json']")
        c.check(cp.returncode == 0 and got == [
            "checkpoint-%d True %s optimizer True" % (n, files)
            for n in (2, 4)],
                "HF StagedTrainer: a GPT-2 (tied embeddings) saved staged "
                "and by the Trainer itself: the same files, byte-identical "
                "(model.safetensors, config, random and trainer state, "
                "scheduler), the optimizer state equal",
                "\n".join(got) + cp.stderr[-2000:])
        cp = run("jit-after", seq=1)
        c.check(cp.returncode == -15 and "saved ['checkpoint-4']" in
                cp.stdout and "jit save" not in cp.stdout,
                "HF: SIGTERM after spotd's checkpoint ends the trainer; the "
                "Trainer's own SIGTERM save does not start",
                "rc=%d\n%s%s" % (cp.returncode, cp.stdout, cp.stderr[-2000:]))
        cp = run("jit-before")
        c.check(cp.returncode == 3 and "jit save" in cp.stdout,
                "HF: SIGTERM before any spotd checkpoint: the Trainer's own "
                "SIGTERM save runs", "rc=%d\n%s%s" % (
                    cp.returncode, cp.stdout, cp.stderr[-2000:]))


def main():
    sl.daemon_env()
    env = fwlib.fw_env(["torch", "transformers"],
                       "the Hugging Face Trainer integration (spotd.hf)")
    c = sl.Checks()
    cmd = [sl.PY3, TRAINER, "--steps", str(STEPS)]

    def folder(c, path):
        files = os.listdir(path) if os.path.isdir(path) else []
        c.check("SPOTD_COMPLETE" in files and "trainer_state.json" in files
                and "optimizer.pt" in files and "rng_state.pth" in files,
                "HF: the committed folder holds the Trainer's files and the "
                "marker", repr(sorted(files)))

    staged = [sl.PY3, TRAINER, "--steps", str(STAGED_STEPS), "--staged"]

    def held(c, name, lines):
        m = [re.match(r"^persist %s after step (\d+)$" % re.escape(name), x)
             for x in lines]
        after = [int(x.group(1)) for x in m if x]
        c.check(after and after[0] > fwlib.step_of(name),
                "HF StagedTrainer: %s was persisted (and only then marked) "
                "while the loop trained on: after step %s" % (
                    name, after[0] if after else "?"), repr(after))

    t = threading.Thread(target=unit, args=(c, env))  # beside the runs
    t.start()
    fwlib.run(c, "HF Trainer", cmd + ["--sleep", "0.3"], env, STEPS, 1,
              notice_at=4, resume_cmd=cmd, folder_check=folder)
    fwlib.run(c, "HF StagedTrainer", staged + ["--sleep", "0.3"], env,
              STAGED_STEPS, 1, notice_at=3, resume_cmd=staged,
              ref_cmd=cmd[:2] + ["--steps", str(STAGED_STEPS)],
              folder_check=folder, node0_check=held)
    t.join()
    sl.kill_started()
    c.finish()


if __name__ == "__main__":
    main()
