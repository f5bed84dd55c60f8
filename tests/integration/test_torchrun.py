"""`spotd run -- torchrun ...` with Debian's real torchrun (2 workers, gloo,
CPU) and no wrapper: torchrun installs no SIGUSR1 handler, spotd starts it
with the signal ignored and signals the whole process group.

  notice: on an emulated AWS notice both workers checkpoint at the same
          step, the commit lands in the store (Ceph), spotd exits 75 and
          no worker survives.
  kill9:  spotd is SIGKILLed: neither the launcher (here `python3 -m
          torch.distributed.run`, torchrun's module form) nor a worker
          survives.
  script: `spotd run -- bash run.sh` where run.sh starts the trainer as a
          child (no exec): bash keeps the ignored signal, the trainer gets
          it, the checkpoint commits and spotd exits 75."""
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

DDP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_trainer.py")


def torchrun(wd, module=False):
    launcher = ([sl.PY3, "-m", "torch.distributed.run"] if module
                else ["/usr/bin/torchrun"])
    return launcher + sl.torchrun_one_node() + ["--nproc_per_node", "2",
            "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(wd, "tlogs"),
            DDP, os.path.join(wd, "ddp.log")]


def events(wd, rank, ev):
    return [e for e in sl.read_jsonl(os.path.join(wd, "ddp.log.rank-%d" % rank))
            if e["ev"] == ev]


def wait_workers(wd, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        s = [events(wd, r, "start") for r in (0, 1)]
        if all(s):
            return [x[0] for x in s]
        time.sleep(0.2)
    return None


def group_alive(pgid):
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open("/proc/%s/stat" % p) as f:
                    fields = f.read().rsplit(") ", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
    return False


def on_host(d, evs):
    """The events' pid and pgid as the machine sees them, mapped while the
    processes run (those the workers report are their pid namespace's)."""
    for e in evs or []:
        for k in ("pid", "pgid"):
            if k in e:
                e[k] = d.host_pid(e[k])
    return evs


def gone(workers, timeout=5):
    end = time.time() + timeout
    while time.time() < end:
        if all(sl.pid_gone(w["pid"]) for w in workers) and \
                not group_alive(workers[0]["pgid"]):
            return True
        time.sleep(0.1)
    return False


def notice(c, wd):
    tag = "notice: "
    store, job, prefix = sl.daemon_job("torchrun")
    emu = sl.EmulatorProc("aws")
    with sl.cleaned_up(prefix, emu.stop):
        os.makedirs(wd)
        d = sl.Daemon(wd, store, job, provider="aws", metadata_url=emu.url,
                      grace=10, cmd=torchrun(wd))
        workers = on_host(d, wait_workers(wd))
        c.check(workers is not None, tag + "torchrun started two workers")
        if workers is None:
            return
        time.sleep(1)
        emu.control("notice", deadline=40)
        rc = d.wait_exit(45)
        c.check(rc == 75, tag + "spotd exits 75 (%s)" % rc)
        made = [events(wd, r, "checkpoint") for r in (0, 1)]
        names = {m[0]["name"] for m in made if m}
        c.check(all(made) and len(names) == 1, tag + "both workers checkpointed "
                "at the same step: %s" % names)
        name = names.pop() if len(names) == 1 else "?"
        c.check(sl.latest(prefix) == name and name in sl.committed(prefix),
                tag + "%s committed and LATEST" % name)
        c.check(gone(workers), tag + "no worker survives")


def kill9(c, wd):
    tag = "kill9: "
    store, job, prefix = sl.daemon_job("torchrun-kill")
    with sl.cleaned_up(prefix):
        os.makedirs(wd)
        d = sl.Daemon(wd, store, job, cmd=torchrun(wd, module=True))
        workers = on_host(d, wait_workers(wd))
        c.check(workers is not None, tag + "torch.distributed.run started two "
                "workers")
        if workers is None:
            return
        d.send(signal.SIGKILL)
        d.wait_exit(10)
        c.check(gone(workers), tag + "neither torchrun nor a worker survives")


def script(c, wd):
    tag = "script: "
    store, job, prefix = sl.daemon_job("torchrun-script")
    emu = sl.EmulatorProc("aws")
    with sl.cleaned_up(prefix, emu.stop):
        os.makedirs(wd)
        tlog = os.path.join(wd, "trainer.log")
        run_sh = os.path.join(wd, "run.sh")
        with open(run_sh, "w") as f:
            f.write("#!/bin/bash\n%s %s --log %s --step-sleep 0.05\n"
                    "echo run.sh: trainer exited $?\n"
                    % (sl.PY3, sl.FAKE_TRAINER, tlog))
        d = sl.Daemon(wd, store, job, provider="aws", metadata_url=emu.url,
                      grace=5, cmd=["bash", run_sh])
        started = sl.trainer_events(tlog, "start")
        end = time.time() + 30
        while not started and time.time() < end:
            time.sleep(0.1)
            started = sl.trainer_events(tlog, "start")
        on_host(d, started)
        c.check(bool(started), tag + "bash started the trainer")
        if not started:
            return
        emu.control("notice", deadline=40)
        rc = d.wait_exit(45)
        c.check(rc == 75, tag + "spotd exits 75 (%s)" % rc)
        made = sl.trainer_events(tlog, "checkpoint")
        c.check(len(made) >= 1 and sl.latest(prefix) == made[-1]["name"],
                tag + "the trainer under bash checkpointed and it committed: "
                "%s" % [m["name"] for m in made])
        c.check(gone(started, 5) if "pgid" in started[0] else True,
                tag + "nothing of the script survives")


def main():
    sl.daemon_env()
    if not os.path.exists("/usr/bin/torchrun"):
        sl.skip("no /usr/bin/torchrun")
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-torchrun-") as wd:
        notice(c, os.path.join(wd, "notice"))
        kill9(c, os.path.join(wd, "kill9"))
        script(c, os.path.join(wd, "script"))
    c.finish()


if __name__ == "__main__":
    main()
