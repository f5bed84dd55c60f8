"""`spotd run -- torchrun ...` with Debian's real torchrun (2 workers, gloo,
CPU) and no wrapper: torchrun installs no SIGUSR1 handler, spotd starts it
with the signal ignored and signals the whole process group.

  notice: on an emulated AWS notice both workers checkpoint at the same
          step, the commit lands in the store (Ceph), spotd exits 75 and
          no worker survives.
  kill9:  spotd is SIGKILLed: neither torchrun nor a worker survives."""
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

DDP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_trainer.py")


def torchrun(wd):
    return ["/usr/bin/torchrun", "--standalone", "--nproc_per_node", "2",
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
        workers = wait_workers(wd)
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
        d = sl.Daemon(wd, store, job, cmd=torchrun(wd))
        workers = wait_workers(wd)
        c.check(workers is not None, tag + "torchrun started two workers")
        if workers is None:
            return
        d.send(signal.SIGKILL)
        d.wait_exit(10)
        c.check(gone(workers), tag + "neither torchrun nor a worker survives")


def main():
    sl.daemon_env()
    if not os.path.exists("/usr/bin/torchrun"):
        sl.skip("no /usr/bin/torchrun")
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-torchrun-") as wd:
        notice(c, os.path.join(wd, "notice"))
        kill9(c, os.path.join(wd, "kill9"))
    c.finish()


if __name__ == "__main__":
    main()
