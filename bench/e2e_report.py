#!/usr/bin/python3
"""End-to-end timeline of one preempt/resume cycle with a >= 500 MB
checkpoint (examples/pytorch/train.py --model-size large: 608 MB).

    /usr/bin/python3 bench/e2e_report.py [--build DIR] [--out bench/results]

Node 1 runs train.py under `spotd run --log-level debug` with a fake AWS
metadata service (spotd-emulate); a scheduled checkpoint is uploaded
first (it also warms the S3 server); then the emulator publishes a spot
notice. Node 2 (a fresh folder, node 1's folder deleted, its own emulator)
starts as soon as node 1's relaunch step has run: it restores and resumes.

Timestamps are the arrival times of the log lines (spotd's stderr, the
trainer's stdout) in this script, on one clock:
  notice appeared      the emulator publishes the notice (POST)
  spotd saw it         "interruption notice"
  trainer signalled    "checkpoint requested ... SIGUSR1 sent"
  save started         the trainer's safe point: "saved" line minus its
                       save time
  save done            spotd sees SPOTD_COMPLETE ("checkpoint X is complete")
  upload done          every part uploaded (push state transfer -> verify)
  committed            manifest written (push state commit -> latest): the
                       checkpoint is durable
  relaunch             the relaunch step runs
  node 2 started       spotd run on node 2 (here at once; on a cloud, the
                       new machine's boot time comes in between)
  restore done         "restored checkpoint"
  training resumed     the trainer's "resumed from" line
  first step           its first step after the resume

Uses the S3 server in SPOT_TEST_S3_* if set, else starts one
(tests/s3server.sh) and stops it. Writes OUT/e2e.md and OUT/e2e.png.
"""
import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
import spotlib as sl  # noqa: E402

TRAIN = os.path.join(SRC, "examples", "pytorch", "train.py")
STEPS = 30
SAVE_EVERY = 5      # the scheduled checkpoint uploaded before the notice
NOTICE_AFTER = 3    # steps after that commit


def start_s3(tmp):
    if os.environ.get("SPOT_TEST_S3_ENDPOINT"):
        return None
    d = os.path.join(tmp, "ceph")
    subprocess.run(["bash", os.path.join(SRC, "tests", "s3server.sh"), "start",
                    d], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(d, "env")) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            if k:
                os.environ[k] = v
    return d


def node(tmp, name, store, job, extra_train=()):
    wd = os.path.join(tmp, name)
    os.makedirs(wd)
    emu = sl.EmulatorProc("aws")
    hook, hook_out = sl.relaunch_hook(wd)
    relaunch = "%s relaunch --backend exec --state-dir %s -- %s" % (
        sl.spotctl_exe(), os.path.join(wd, "relaunch-state"), hook)
    d = sl.Daemon(wd, store, job, cmd=[sl.PY3, TRAIN, "--model-size", "large",
                                       "--steps", str(STEPS), "--log-every",
                                       "1"] + list(extra_train),
                  args=["--relaunch", relaunch, "--log-level", "debug"],
                  provider="aws", metadata_url=emu.url, echo=False)
    return emu, d


def t_of(log, pattern, timeout=0):
    """Arrival time of the first line matching pattern (waits up to
    timeout), or raises."""
    _, line = log.wait(pattern, timeout)
    if line is None:
        raise RuntimeError("no line like /%s/" % pattern)
    return log.time_of(pattern), re.search(pattern, line)


def cycle(tmp):
    store, job, prefix = sl.daemon_job("e2e-bench")
    ev = {}
    load = os.getloadavg()[0]
    emu1, d1 = node(tmp, "node1", store, job,
                    ["--save-every", str(SAVE_EVERY)])
    try:
        first = "step-%06d" % SAVE_EVERY
        t_of(d1.err, r"committed checkpoint name=%s " % first, 300)
        now_step = max(int(re.match(r"^step (\d+)", l).group(1))
                       for _, l in d1.out.lines if l.startswith("step "))
        d1.out.wait(r"^step %d loss" % (now_step + NOTICE_AFTER), 120)
        ev["notice appeared"] = time.time()
        emu1.control("notice")
        rc = d1.wait_exit(300)
        if rc != 75:
            raise RuntimeError("node 1: spotd exited %d\n%s" % (rc, d1.log()))
        ev["spotd saw it"], _ = t_of(d1.err, r"interruption notice:")
        ev["trainer signalled"], _ = t_of(
            d1.err, r"checkpoint requested \(aws-spot-terminate\)")
        t_saved, m = t_of(d1.out, r"^saved (\S+) at step (\d+) \(signal, "
                          r"(\S+) MB in (\S+) s\)")
        name, mb = m.group(1), float(m.group(3))
        ev["save started"] = t_saved - float(m.group(4))
        ev["save done"], _ = t_of(d1.err, r"checkpoint %s is complete" % name)
        ev["upload done"], _ = t_of(d1.err, r"push name=%s state transfer -> "
                                    r"verify" % name)
        ev["committed"], _ = t_of(d1.err, r"push name=%s state commit -> "
                                  r"latest" % name)
        _, cm = t_of(d1.err, r"committed checkpoint name=%s files=\d+ "
                     r"raw=(\d+) stored=(\d+) ratio=(\S+)" % name)
        ev["relaunch"], _ = t_of(d1.err, r"relaunch: running")
        emu1.stop()
        shutil.rmtree(d1.ckpt_dir)  # node 1's disk is gone

        ev["node 2 started"] = time.time()
        emu2, d2 = node(tmp, "node2", store, job)
        t_of(d2.out, r"^resumed from %s at step" % name, 300)
        ev["restore done"], rm = t_of(d2.err, r"restored checkpoint %s into "
                                      r"\S+ \((\d+) bytes in (\S+) s\)" % name)
        ev["training resumed"], _ = t_of(d2.out, r"^resumed from %s" % name)
        ev["first step"], _ = t_of(d2.out, r"^step \d+ loss", 120)
        d2.send(15)  # enough: the cycle is over (SIGTERM = final checkpoint)
        d2.send(15)  # and again: stop now
        d2.wait_exit(60)
        emu2.stop()
        facts = {"name": name, "mb": mb, "raw": int(cm.group(1)),
                 "stored": int(cm.group(2)), "ratio": cm.group(3),
                 "restore_s": float(rm.group(2)), "load": load}
        return ev, facts
    finally:
        sl.kill_started()
        sl.s3_cleanup(prefix)


ORDER = ["notice appeared", "spotd saw it", "trainer signalled",
         "save started", "save done", "upload done", "committed", "relaunch",
         "node 2 started", "restore done", "training resumed", "first step"]


def write_md(path, ev, facts):
    t0 = ev["notice appeared"]
    durable = ev["committed"] - t0
    lines = [
        "# End-to-end preempt/resume timeline",
        "",
        "One cycle of `bench/e2e_report.py` on %s (%d cores), %s: "
        "examples/pytorch/train.py `--model-size large` under `spotd run`, "
        "local Ceph RGW (tests/s3server.sh), fake AWS metadata "
        "(spotd-emulate), relaunch through `spotctl relaunch --backend "
        "exec`. Node 2 is started as soon as node 1's relaunch step ran (on "
        "a cloud the new machine's boot comes in between). Load average "
        "when the cycle started: %.1f (a shared machine: compare phases, "
        "not absolute times)." % (
            platform.node() or "this machine", os.cpu_count() or 0,
            datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%d %H:%M UTC"), facts["load"]),
        "",
        "Checkpoint %s: %.1f MB raw (model + Adam + RNG), %.1f MB stored "
        "(ratio %s); restored in %.1f s." % (
            facts["name"], facts["raw"] / 1e6, facts["stored"] / 1e6,
            facts["ratio"], facts["restore_s"]),
        "",
        "**Notice to durable: %.1f s** (goal: well inside 30 s, GCP's and "
        "Azure's notice; AWS gives 120 s). Notice to training resumed on the "
        "new node: %.1f s." % (durable, ev["training resumed"] - t0),
        "",
        "| event | t (s from notice) | since previous (s) |",
        "|---|---:|---:|",
    ]
    prev = t0
    for k in ORDER:
        lines.append("| %s | %.2f | %.2f |" % (k, ev[k] - t0, ev[k] - prev))
        prev = ev[k]
    lines += [
        "",
        "Where the time goes: spotd polls the metadata every second (notice "
        "to seen); the trainer finishes its current step before it saves "
        "(signal to save started, ~1 step of this model on Debian's "
        "reference BLAS); `torch.save` with fsync writes %.0f MB; spotd "
        "compresses (byte grouping + zstd) and uploads the parts in "
        "parallel, then writes the manifest (the commit). Restore time "
        "includes every frame's checksum check." % facts["mb"],
        "",
        "![timeline](e2e.png)",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return durable


def write_png(path, ev):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = ev["notice appeared"]
    phases = [
        ("notice seen (poll)", "notice appeared", "spotd saw it", "#999999"),
        ("finish step", "trainer signalled", "save started", "#bbbbbb"),
        ("torch.save", "save started", "save done", "#4c72b0"),
        ("compress + upload", "save done", "upload done", "#dd8452"),
        ("commit", "upload done", "committed", "#c44e52"),
        ("relaunch + stop", "committed", "node 2 started", "#8172b2"),
        ("restore", "node 2 started", "restore done", "#55a868"),
        ("start + load", "restore done", "training resumed", "#64b5cd"),
        ("first step", "training resumed", "first step", "#937860"),
    ]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for i, (label, a, b, color) in enumerate(phases):
        x0, x1 = ev[a] - t0, ev[b] - t0
        ax.barh(i, max(x1 - x0, 0.02), left=x0, color=color)
        ax.text(x1 + 0.2, i, "%s %.1f s" % (label, x1 - x0), va="center",
                fontsize=8)
    dur = ev["committed"] - t0
    ax.axvline(dur, color="#c44e52", ls="--", lw=1)
    ax.text(dur, len(phases) - 0.4, " durable %.1f s" % dur, color="#c44e52",
            fontsize=8)
    ax.axvline(30, color="black", ls=":", lw=1)
    ax.text(30, len(phases) - 0.4, " 30 s: GCP/Azure notice", fontsize=8)
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the spot notice appeared")
    ax.set_xlim(0, max(32, ev["first step"] - t0 + 8))
    ax.set_title("spotd: one preempt/resume cycle, 608 MB PyTorch checkpoint")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--out", default=os.path.join(SRC, "bench", "results"))
    a = ap.parse_args()
    os.environ.setdefault("SPOTD", os.path.join(a.build, "daemon", "spotd"))
    os.environ.setdefault("SPOTCTL", os.path.join(a.build, "client",
                                                  "spotctl"))
    os.environ.setdefault("SPOTD_EMULATE", os.path.join(a.build, "emulate",
                                                        "spotd-emulate"))
    tmp = tempfile.mkdtemp(prefix="spotd-e2e-bench-")
    ceph = None
    try:
        ceph = start_s3(tmp)
        sl.daemon_env()
        ev, facts = cycle(tmp)
    finally:
        sl.kill_started()
        if ceph:
            subprocess.run(["bash", os.path.join(SRC, "tests", "s3server.sh"),
                            "stop", ceph], stdout=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    durable = write_md(os.path.join(a.out, "e2e.md"), ev, facts)
    write_png(os.path.join(a.out, "e2e.png"), ev)
    t0 = ev["notice appeared"]
    for k in ORDER:
        print("%-18s %6.2f s" % (k, ev[k] - t0))
    print("notice to durable: %.1f s -> %s" % (durable, os.path.join(a.out,
                                                                      "e2e.md")))


if __name__ == "__main__":
    main()
