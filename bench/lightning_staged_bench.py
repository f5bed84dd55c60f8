#!/usr/bin/python3
"""Lightning's stall per checkpoint: spotd.lightning.StagedCheckpointIO
(the checkpoint Lightning builds staged into host memory, last.ckpt
written and the folder marked in the background) against Lightning's own
save (TorchCheckpointIO) inside spotd's contract (SpotdCheckpoint.save:
a new folder, trainer.save_checkpoint, then spotd.done(): fsync,
SPOTD_COMPLETE), on the same Trainer, model and Adam state, side by side
in one process, in alternating rounds; and the time of the whole
interval between checkpoints (the checkpoint, STEPS real training steps
after it, then until the staged folder is marked) against the same steps
without a checkpoint: the background write shares the cores with the
steps, so its cost shows there, not in the stall.

    PYTHONUSERBASE=... /usr/bin/python3 bench/lightning_staged_bench.py \
        [--layers 6] [--width 4096] [--rounds 5] [--steps 10] \
        [--dir /tmp] [--markdown]

The model: --layers Linear(width, width) (fp32; 6 x 4096 = 101M
parameters, 0.38 GiB) trained with Adam, so the checkpoint holds the
model and the optimizer's two moments: about 1.13 GiB. One fit() runs
the whole benchmark: a callback takes the checkpoints at the end of a
batch, where SpotdCheckpoint does, switching the strategy's
checkpoint_io between the cases:

- sync: SpotdCheckpoint.save() with TorchCheckpointIO (what the callback
  does without the plugin); the stall is the whole of it;
- staged: SpotdCheckpoint.save() with StagedCheckpointIO; the stall is
  the call; "persist" is the background write, fsync and marker;
- none: no checkpoint, the steps alone.

With --compare-writer two more: sync_stream (the sync save with torch.save
streamed into the file, StreamIO below, instead of Lightning's
_atomic_save) and staged_tio (staged, but written in the background by
Lightning's TorchCheckpointIO, as StagedCheckpointIO did before it
streamed the file itself).

Each round runs the three in a rotating order, each followed by STEPS
steps; medians are printed with the ratios. The stall is split into the
CheckpointIO.save_checkpoint call (torch.save for sync, the copy into the
buffers for staged) and the rest (Lightning's dump_checkpoint, the data
position file, for sync the fsync and marker). The first staged save
allocates and touches the buffers (reported apart, not in the medians).
No spotd is needed: SPOTD_CKPT_DIR is a temporary folder and done()
writes the marker, telling nobody ($SPOTD_SOCKET unset).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
for k in ("SPOTD_SOCKET", "SPOTD_REQUEST_FILE", "SPOTD_RESUME_DIR"):
    os.environ.pop(k, None)
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*GPU available but not used.*")

import torch  # noqa: E402

import spotd  # noqa: E402
import spotd.lightning  # noqa: E402

try:
    import lightning.pytorch as pl  # noqa: E402
    from lightning.fabric.plugins import TorchCheckpointIO  # noqa: E402
except ImportError:
    import pytorch_lightning as pl  # noqa: E402
    from lightning_fabric.plugins import TorchCheckpointIO  # noqa: E402


class Net(pl.LightningModule):
    """Linear layers; with full=False each step after the first trains
    one layer in turn (the others run with detached weights, their grads
    stay None and Adam skips them): every step changes a part of the
    state in place at a sixth of the cost, and the first step makes
    Adam's moments of every layer."""

    def __init__(self, layers, width, full):
        super().__init__()
        self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width)
                                         for _ in range(layers)])
        self.full = full

    def training_step(self, batch, i):
        x = batch[0]
        k = self.global_step % len(self.net)
        for j, m in enumerate(self.net):
            if self.full or self.global_step == 0 or j == k:
                x = m(x)
            else:
                x = torch.nn.functional.linear(x, m.weight.detach(),
                                               m.bias.detach())
        return x.pow(2).mean()

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        optimizer.zero_grad(set_to_none=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-5)


class StreamIO(TorchCheckpointIO):
    """The same file, torch.save streamed into it (what StagedCheckpointIO
    writes in the background) rather than Lightning's _atomic_save (the
    whole checkpoint serialised into a BytesIO, then copied out)."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        with open(path, "wb") as f:
            torch.save(checkpoint, f)


def timed(fn, into):
    """fn, its wall time of the last call put in into[0]."""
    def wrap(*args, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            into[0] = time.perf_counter() - t0
    return wrap


class Bench(pl.Callback):
    """Runs the plan at batch ends: a checkpoint (or none), then STEPS
    steps, recorded; stops the fit at the end."""

    def __init__(self, spotd_cb, ios, rounds, steps):
        super().__init__()
        self.cb, self.ios = spotd_cb, ios
        self.steps = steps
        order = [k for k in ("sync", "sync_stream", "staged", "staged_tio",
                             "none")
                 if k in ios or k == "none"]
        self.plan = [("first", -1)] + [
            (c, r) for r in range(rounds)
            for c in order[r % len(order):] + order[:r % len(order)]]
        if "staged_tio" in ios:  # its buffers too, before any round
            self.plan.insert(1, ("first_tio", -1))
        self.cur = None  # (case, round, t0, folder, steps left, handle)
        self.io_time = [0.0]
        for io in ios.values():
            io.save_checkpoint = timed(io.save_checkpoint, self.io_time)
        self.warm = 2  # Adam makes its moments at the first step
        self.last = None
        self.res = []  # one dict per case run
        self.load = [os.getloadavg()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, i):
        now = time.perf_counter()
        if self.warm:
            self.warm -= 1
            self.last = now
            return
        if self.cur is not None:
            c = self.cur
            c["step_times"].append(now - self.last)
            c["starts"].append(self.last)
            self.last = now
            c["left"] -= 1
            if c["left"] > 0:
                return
            if c["handle"] is not None:
                c["handle"].wait()
                c["persist"] = c["handle"].seconds
                # the thread starts at the end of the stage() call
                end = c["t0"] + c["stall"] + c["persist"]
                c["during"] = [t < end for t in c["starts"]]
            else:
                c["during"] = [False] * len(c["starts"])
            c["interval"] = time.perf_counter() - c["t0"]
            if c["folder"]:
                if not os.path.exists(os.path.join(c["folder"],
                                                   "SPOTD_COMPLETE")):
                    raise SystemExit("no marker in %s" % c["folder"])
                shutil.rmtree(c["folder"])
            self.res.append(c)
            self.cur = None
            self.report(c)
            if not self.plan:
                self.load.append(os.getloadavg())
                trainer.should_stop = True
                return
        self.begin(trainer, i)
        self.last = time.perf_counter()

    def begin(self, trainer, i):
        case, r = self.plan.pop(0)
        c = {"case": case, "round": r, "folder": None, "handle": None,
             "stall": 0.0, "io": 0.0, "persist": None, "step_times": [],
             "during": [], "starts": [],
             "left": 1 if case.startswith("first") else self.steps,
             "load": os.getloadavg()[0]}
        c["t0"] = time.perf_counter()
        if case != "none":
            io = self.ios[{"first": "staged",
                           "first_tio": "staged_tio"}.get(case, case)]
            trainer.strategy.checkpoint_io = io
            c["folder"] = self.cb.save(trainer, i + 1)
            c["stall"] = time.perf_counter() - c["t0"]
            c["io"] = self.io_time[0]
            if not case.startswith("sync"):
                c["handle"] = io._saver._inflight[0]
        self.cur = c

    def report(self, c):
        st = c["step_times"]
        print("round %d %-10s stall %.3f s (io %.3f s), interval %.3f s, "
              "%d steps median %.3f s%s, load %.1f" % (
                  c["round"] + 1, c["case"], c["stall"], c["io"],
                  c["interval"], len(st), statistics.median(st),
                  "" if c["persist"] is None else
                  ", persist %.3f s (%d steps started in it)" % (
                      c["persist"], sum(c["during"])), c["load"]),
              file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--full-steps", action="store_true",
                    help="every step trains every layer (default: one "
                    "layer in turn, a sixth of the cost)")
    ap.add_argument("--compare-writer", action="store_true",
                    help="a fourth case: staged, written by Lightning's "
                    "TorchCheckpointIO (checkpoint_io=TorchCheckpointIO())")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="spotd-lightning-bench-", dir=a.dir)
    os.environ["SPOTD_CKPT_DIR"] = root
    pl.seed_everything(1)
    model = Net(a.layers, a.width, a.full_steps)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(64, a.width)),
        batch_size=2)
    cb = spotd.lightning.SpotdCheckpoint(report_steps=False)
    ios = {"sync": TorchCheckpointIO(),
           "staged": spotd.lightning.StagedCheckpointIO()}
    if a.compare_writer:
        ios["sync_stream"] = StreamIO()
        ios["staged_tio"] = spotd.lightning.StagedCheckpointIO(
            checkpoint_io=TorchCheckpointIO())
    bench = Bench(cb, ios, a.rounds, a.steps)
    trainer = pl.Trainer(max_steps=10 ** 6, accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False,
                         enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[cb, bench])
    trainer.fit(model, data)
    for io in ios.values():
        io.teardown()
    shutil.rmtree(root, ignore_errors=True)

    nbytes = sum(t.numel() * t.element_size()
                 for t in model.state_dict().values())
    for st in trainer.optimizers[0].state_dict()["state"].values():
        nbytes += sum(t.numel() * t.element_size() for t in st.values()
                      if isinstance(t, torch.Tensor) and t.dim() > 0)
    by = {}
    for c in bench.res:
        by.setdefault(c["case"], []).append(c)
    first = by.pop("first")[0]
    by.pop("first_tio", None)

    def med(case, key):
        return statistics.median(c[key] for c in by[case])

    def med_steps(case, during=None):
        xs = [t for c in by[case] for t, d in zip(c["step_times"],
                                                   c["during"])
              if during is None or d == during]
        return statistics.median(xs) if xs else float("nan")

    sync, staged = med("sync", "stall"), med("staged", "stall")
    isync, istaged, inone = (med(k, "interval")
                             for k in ("sync", "staged", "none"))
    snone = med_steps("none")
    sdur = med_steps("staged", True)
    ndur = sum(sum(c["during"]) for c in by["staged"])
    tio = []
    if "sync_stream" in by:
        ss = med("sync_stream", "stall")
        iss = med("sync_stream", "interval")
        tio = [
            ("stall, sync with torch.save streamed into the file (StreamIO)",
             "%.3f s" % ss),
            ("stall ratio staged / sync streamed", "%.3f" % (staged / ss)),
            ("interval, sync streamed", "%.3f s (%+.0f %%)" % (
                iss, 100 * (iss / inone - 1)))]
    if "staged_tio" in by:
        t, tdur = med("staged_tio", "stall"), med_steps("staged_tio", True)
        itio = med("staged_tio", "interval")
        tio += [
            ("stall, staged written by TorchCheckpointIO", "%.3f s (%.3f "
             "of sync)" % (t, t / sync)),
            ("its persist in the background (until marked)", "%.3f s" %
             med("staged_tio", "persist")),
            ("step, started while its persist ran (%d steps)" % sum(
                sum(c["during"]) for c in by["staged_tio"]),
             "%.3f s (%+.0f %%)" % (tdur, 100 * (tdur / snone - 1))),
            ("interval, staged by TorchCheckpointIO (until marked)",
             "%.3f s (%+.0f %%)" % (itio, 100 * (itio / inone - 1)))]
    rows = [
        ("state", "%.2f GiB (model + Adam moments)" %
         (nbytes / float(1 << 30))),
        ("Lightning / torch", "%s / %s" % (pl.__version__,
                                           torch.__version__)),
        ("torch threads", str(torch.get_num_threads())),
        ("cores (os.cpu_count)", str(os.cpu_count())),
        ("load average (1 min) at start, end", "%.1f, %.1f" % (
            bench.load[0][0], bench.load[-1][0])),
        ("rounds, steps after each checkpoint", "%d, %d" % (
            a.rounds, a.steps)),
        ("first staged save (buffers allocated)", "%.3f s" %
         first["stall"]),
        ("stall, sync: SpotdCheckpoint.save, TorchCheckpointIO",
         "%.3f s" % sync),
        ("  of which TorchCheckpointIO.save_checkpoint (torch.save)",
         "%.3f s" % med("sync", "io")),
        ("stall, staged: SpotdCheckpoint.save, StagedCheckpointIO",
         "%.3f s" % staged),
        ("  of which StagedCheckpointIO.save_checkpoint (the copy)",
         "%.3f s" % med("staged", "io")),
        ("**stall ratio staged / sync**", "**%.3f**" % (staged / sync)),
        ("staged persist in the background (until marked)", "%.3f s" %
         med("staged", "persist")),
        ("step, no checkpoint (median)", "%.3f s" % snone),
        ("step, started while the staged persist ran (%d steps)" % ndur,
         "%.3f s (%+.0f %%)" % (sdur, 100 * (sdur / snone - 1))),
        ("step, after a sync save (median)", "%.3f s" % med_steps("sync")),
        ("interval, no checkpoint (%d steps)" % a.steps, "%.3f s" % inone),
        ("interval, sync", "%.3f s (%+.0f %%)" % (
            isync, 100 * (isync / inone - 1))),
        ("interval, staged (until marked)", "%.3f s (%+.0f %%)" % (
            istaged, 100 * (istaged / inone - 1))),
    ] + tio
    if a.markdown:
        print("| measure | value |\n|---|---|")
        for k, v in rows:
            print("| %s | %s |" % (k, v))
    else:
        for k, v in rows:
            print("%-62s %s" % (k.strip("*"), v.strip("*")))
    pairs = zip(by["sync"], by["staged"])
    print("\nstalls by round (s): sync %s; staged %s; ratio %s" % (
        " ".join("%.3f" % c["stall"] for c in by["sync"]),
        " ".join("%.3f" % c["stall"] for c in by["staged"]),
        " ".join("%.3f" % (b["stall"] / s["stall"]) for s, b in pairs)))
    for k in sorted(by):
        print("%s by round: stall %s; interval %s%s" % (
            k, " ".join("%.3f" % c["stall"] for c in by[k]),
            " ".join("%.3f" % c["interval"] for c in by[k]),
            "" if by[k][0]["persist"] is None else "; persist %s" %
            " ".join("%.3f" % c["persist"] for c in by[k])))
    print("load average (1 min) by case: %s" % " ".join(
        "%.1f" % c["load"] for c in bench.res))


if __name__ == "__main__":
    main()
