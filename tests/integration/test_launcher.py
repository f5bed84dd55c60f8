"""`spotd run` over a launcher with torch 2.x's topology, without torch
2.x: launcher_standin.py starts two helper_trainer.py workers (real
torch.distributed, gloo) each in its own session and process group,
forwards SIGTERM/SIGINT with killpg and ignores SIGUSR1. The workers use
the spotd helper, which takes checkpoint requests from spotd's request
channel ($SPOTD_REQUEST_FILE); spotd reaches them though they are outside
the launcher's process group.

  notice:  an emulated AWS notice; both workers checkpoint at the same
           step, the checkpoint is committed (Ceph) and LATEST, spotd
           exits 75, nothing of the job is left.
  startup: a rerun on a fresh folder resumes from that checkpoint (both
           workers start at its step); rank 0 is slow to reach
           init_process_group and the notice comes while rank 1 waits in
           it: no worker crashes, spotd exits 75 with either a new
           checkpoint committed or the restored one named as the one the
           job resumes from; nothing is left.
  kill9:   spotd is SIGKILLed while the workers train: within a few
           seconds neither the launcher nor a worker runs (every pid
           recorded, checked in /proc).
Skips (77) without the test S3 server or torch.distributed."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(HERE, "launcher_standin.py")
TRAINER = os.path.join(HERE, "helper_trainer.py")
NPROC = 2


def cmd(log, *extra):
    return [sl.PY3, LAUNCHER, "--nproc", str(NPROC), "--", sl.PY3, TRAINER,
            "--log", log] + [str(e) for e in extra]


def events(log, rank, ev=None):
    return [e for e in sl.read_jsonl("%s.rank-%d" % (log, rank))
            if ev is None or e["ev"] == ev]


def wait_all(log, ev, timeout=60, pred=None):
    """The first event ev of every rank (matching pred), or None."""
    end = time.time() + timeout
    while time.time() < end:
        got = []
        for r in range(NPROC):
            es = [e for e in events(log, r, ev) if pred is None or pred(e)]
            got.append(es[0] if es else None)
        if all(got):
            return got
        time.sleep(0.1)
    return None


def proc_status(pid):
    """/proc/PID/status as a dict, or None when gone or a zombie."""
    try:
        with open("/proc/%d/status" % pid) as f:
            st = dict(l.rstrip("\n").split(":\t", 1) for l in f if ":\t" in l)
    except (FileNotFoundError, ProcessLookupError):
        return None
    if st.get("State", "").startswith(("Z", "X")):
        return None
    return st


def all_gone(pids, timeout):
    _SEEN.extend(pids)
    end = time.time() + timeout
    while time.time() < end:
        left = [p for p in pids if not sl.pid_gone(p)]
        if not left:
            return []
        time.sleep(0.1)
    return left


_SEEN = []  # every launcher and worker pid seen, killed at the end


def kill_left():
    """SIGKILLs what a failed check left running (only pids this test
    recorded, and only while they still run our scripts)."""
    for p in _SEEN:
        try:
            with open("/proc/%d/cmdline" % p, "rb") as f:
                mine = HERE.encode() in f.read()
            if mine:
                os.kill(p, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def describe(pids):
    out = []
    for p in pids:
        try:
            with open("/proc/%d/cmdline" % p, "rb") as f:
                out.append("%d %s" % (p, f.read().replace(b"\0", b" ")
                                      .decode(errors="replace")))
        except OSError:
            out.append("%d (gone)" % p)
    return "\n".join(out)


def topology(c, tag, d, starts):
    """The workers are in sessions of their own, under one launcher that
    ignores SIGUSR1 and maps no request file. The launcher's pid as the
    machine sees it (the pids the workers report are their pid
    namespace's)."""
    launcher = d.host_pid(starts[0]["ppid"])
    st = proc_status(launcher)
    c.check(all(s["ppid"] == starts[0]["ppid"] for s in starts) and
            st is not None,
            tag + "both workers are children of the launcher (pid %d)"
            % launcher)
    c.check(all(s["sid"] == s["pid"] and s["pgid"] == s["pid"]
                for s in starts) and
            all(d.host_pid(s["sid"]) != os.getsid(launcher) for s in starts),
            tag + "each worker leads its own session and process group",
            json.dumps(starts))
    if st is not None:
        ign = int(st.get("SigIgn", "0"), 16)
        c.check(ign & (1 << (signal.SIGUSR1 - 1)) != 0,
                tag + "the launcher ignores SIGUSR1", st.get("SigIgn", ""))
    c.check(all(s["channel"] for s in starts),
            tag + "every worker maps spotd's request file (%s)"
            % starts[0]["channel"], json.dumps(starts))
    return launcher


CRASH = re.compile(r"Traceback|Interrupted system call|RuntimeError")


def crashes(d):
    """Lines of the job's output (the workers write to spotd's stdout and
    stderr) that show a worker failing before spotd began to stop the job:
    once it stops the workers, one may see its peer's connection close
    before its own SIGTERM lands."""
    out = []
    for log in (d.err, d.out):
        with log.cv:
            lines = [l for _, l in log.lines]
        for l in lines:
            if re.search(r"-> stopping$", l):
                break
            if CRASH.search(l):
                out.append(l)
    return out


def notice_and_resume(c, tmp):
    store, job, prefix = sl.daemon_job("launcher")
    emu = sl.EmulatorProc("aws")
    emu2 = sl.EmulatorProc("aws")  # the second node's: no notice yet
    with sl.cleaned_up(prefix, emu.stop, emu2.stop):
        # -- notice -> commit -> 75
        tag = "notice: "
        wd = os.path.join(tmp, "node0")
        log = os.path.join(wd, "w")
        os.makedirs(wd)
        d = sl.Daemon(wd, store, job, provider="aws", metadata_url=emu.url,
                      grace=10, cmd=cmd(log))
        starts = wait_all(log, "start")
        steps = wait_all(log, "step", pred=lambda e: e["step"] >= 5)
        if not c.check(starts is not None and steps is not None,
                       tag + "the launcher started two workers and they "
                       "train", d.log()):
            return
        pids = [d.host_pid(s["pid"]) for s in starts]
        pids.append(topology(c, tag, d, starts))
        _SEEN.extend(pids)
        emu.control("notice", deadline=60)
        rc = d.wait_exit(70)
        c.check(rc == 75, tag + "spotd exits 75 (%s)" % rc, d.log()[-3000:])
        made = [events(log, r, "checkpoint") for r in range(NPROC)]
        names = {m[-1]["name"] for m in made if m}
        c.check(all(made) and len(names) == 1,
                tag + "both workers checkpointed at the same step: %s"
                % sorted(names), json.dumps(made))
        if len(names) != 1:
            return
        name = names.pop()
        step = made[0][-1]["step"]
        c.check(sl.latest(prefix) == name and name in sl.committed(prefix),
                tag + "%s committed and LATEST" % name,
                "LATEST %r committed %s" % (sl.latest(prefix),
                                            sl.committed(prefix)))
        left = all_gone(pids, 10)
        c.check(not left, tag + "neither the launcher nor a worker is left",
                describe(left))
        c.check(not crashes(d), tag + "no worker crashed",
                "\n".join(crashes(d)))

        # -- rerun: resume, and a notice during the rendezvous
        tag = "startup: "
        wd = os.path.join(tmp, "node1")  # a fresh folder: restored from S3
        log = os.path.join(wd, "w")
        os.makedirs(wd)
        d = sl.Daemon(wd, store, job, provider="aws", metadata_url=emu2.url,
                      grace=10, cmd=cmd(log, "--slow-rank0", 12))
        starts = wait_all(log, "start", timeout=90)
        if not c.check(starts is not None, tag + "the workers started",
                       d.log()):
            return
        c.check(all(s["resume"] == name and s["step"] == step
                    for s in starts),
                tag + "both workers resume from %s at step %d" % (name, step),
                json.dumps(starts))
        pids = [d.host_pid(s["pid"]) for s in starts] + \
            [d.host_pid(starts[0]["ppid"])]
        _SEEN.extend(pids)
        end = time.time() + 30
        while time.time() < end and not events(log, 1, "rendezvous"):
            time.sleep(0.05)
        joined = events(log, 0, "joined") or events(log, 1, "joined")
        c.check(bool(events(log, 1, "rendezvous")) and not joined,
                tag + "rank 1 waits in init_process_group for rank 0")
        emu2.control("notice", deadline=60)
        rc = d.wait_exit(90)
        c.check(rc == 75, tag + "spotd exits 75 (%s)" % rc, d.log()[-3000:])
        new = [events(log, r, "checkpoint") for r in range(NPROC)]
        latest = sl.latest(prefix)
        if all(new):
            newname = new[0][-1]["name"]
            c.check(latest == newname and newname != name,
                    tag + "the workers took the request after the "
                    "rendezvous: %s committed and LATEST" % newname,
                    "LATEST %r" % latest)
        else:
            at, _ = d.err.wait(r"interruption notice", 1)
            after = [l for _, l in d.err.lines[at:]] if at is not None else []
            named = [l for l in after if name in l]
            c.check(latest == name and bool(named),
                    tag + "no step since the restore: spotd names the "
                    "restored %s as the checkpoint the job resumes from"
                    % name, "LATEST %r\n%s" % (latest, "\n".join(after)))
        c.check(not crashes(d), tag + "no worker crashed (no interrupted "
                "system call in the rendezvous)", "\n".join(crashes(d)))
        left = all_gone(pids, 10)
        c.check(not left, tag + "neither the launcher nor a worker is left",
                describe(left))


def kill9(c, tmp):
    tag = "kill9: "
    store, job, prefix = sl.daemon_job("launcher-kill")
    with sl.cleaned_up(prefix):
        wd = os.path.join(tmp, "kill9")
        log = os.path.join(wd, "w")
        os.makedirs(wd)
        d = sl.Daemon(wd, store, job, cmd=cmd(log))
        starts = wait_all(log, "start")
        steps = wait_all(log, "step", pred=lambda e: e["step"] >= 3)
        if not c.check(starts is not None and steps is not None,
                       tag + "the launcher started two workers and they "
                       "train", d.log()):
            return
        pids = [d.host_pid(s["pid"]) for s in starts] + \
            [d.host_pid(starts[0]["ppid"])]
        _SEEN.extend(pids)
        d.send(signal.SIGKILL)
        d.wait_exit(10)
        left = all_gone(pids, 15)
        c.check(not left, tag + "after kill -9 of spotd neither the launcher "
                "(pid %d) nor a worker (%s) is left" % (
                    pids[-1], ",".join(str(p) for p in pids[:-1])),
                describe(left))


def main():
    sl.daemon_env()
    cp = subprocess.run([sl.PY3, "-c", "import torch.distributed as d; "
                         "import sys; sys.exit(0 if d.is_available() else 1)"],
                        capture_output=True)
    if cp.returncode != 0:
        sl.skip("torch.distributed is not importable by %s" % sl.PY3)
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-launcher-") as tmp:
        try:
            notice_and_resume(c, tmp)
            kill9(c, tmp)
        finally:
            kill_left()
    c.finish()


if __name__ == "__main__":
    main()
