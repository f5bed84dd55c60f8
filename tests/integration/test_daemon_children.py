"""spotd's children (lib/io/child.c), against the loopback fake S3:

  clean:   the trainer and the relaunch step have only descriptors 0, 1, 2
           and none of spotd's systemd variables (NOTIFY_SOCKET,
           WATCHDOG_*, LISTEN_*, INVOCATION_ID); the user's own variables
           (AWS_REGION, MY_VAR) stay; the trainer starts with the
           checkpoint signal ignored, so a shell that installs no handler
           survives it.
  leftover: the trainer's leader exits and leaves a background process in
           its group: spotd stops it and exits with the leader's status.
  kill9:   spotd is SIGKILLed: nothing of the trainer's tree survives,
           in its process group or in a session of its own (the guard, a
           child subreaper, kills them all).
  signal:  a trainer with the checkpoint signal's default action never
           gets it (it would die of it); the request waits, one line says
           so."""
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

SYSTEMD_VARS = {"NOTIFY_SOCKET": "/nonexistent/notify", "WATCHDOG_USEC": "1000000",
                "WATCHDOG_PID": "1", "LISTEN_FDS": "1", "LISTEN_PID": "1",
                "LISTEN_FDNAMES": "x", "INVOCATION_ID": "0123456789abcdef"}

# Records its pid, then lives until stopped. No signal handler of its own.
RECORDER = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n" \
           "time.sleep(float(sys.argv[2]))\n"


def group(pgid):
    """Pids (not zombies) whose process group is pgid."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p) as f:
                fields = f.read().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(p))
    return out


def wait_pid(path, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        t = sl.read_text(path)
        if t.strip():
            return int(t)
        time.sleep(0.05)
    return 0


def proc_env(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        return dict(e.decode().split("=", 1) for e in f.read().split(b"\0") if b"=" in e)


def sig_ignored(pid, sig):
    for line in sl.read_text("/proc/%d/status" % pid).splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    return False


def check_clean(c, tag, pid):
    fds = sorted(os.listdir("/proc/%d/fd" % pid), key=int)
    c.check(fds == ["0", "1", "2"], tag + "descriptors %s" % fds)
    env = proc_env(pid)
    leaked = sorted(k for k in env if k in SYSTEMD_VARS)
    c.check(not leaked, tag + "no systemd variable (%s)" % leaked)
    c.check(env.get("MY_VAR") == "kept" and env.get("AWS_REGION") == "us-east-1",
            tag + "the user's own variables stay")
    return env


def clean(c, wd):
    tag = "clean: "
    s3, store, job, _ = sl.fake_store("clean")
    emu = sl.EmulatorProc("aws")
    try:
        os.makedirs(wd)
        script = os.path.join(wd, "rec.py")
        with open(script, "w") as f:
            f.write(RECORDER)
        tpid, rpid = os.path.join(wd, "trainer.pid"), os.path.join(wd, "relaunch.pid")
        env = dict(s3.env(), MY_VAR="kept", **SYSTEMD_VARS)
        d = sl.Daemon(wd, store, job, env=env, provider="aws", metadata_url=emu.url,
                      grace=2, args=["--relaunch", "%s %s %s 5" % (sl.PY3, script, rpid)],
                      cmd=["/bin/sh", "-c", "%s %s %s 60" % (sl.PY3, script, tpid)])
        pid = d.host_pid(wait_pid(tpid))
        c.check(pid > 0, tag + "the trainer runs")
        if pid:
            tenv = check_clean(c, tag + "trainer: ", pid)
            c.check(os.path.isabs(tenv.get("SPOTD_CKPT_DIR", "")),
                    tag + "trainer: SPOTD_CKPT_DIR is absolute")
        sh = d.status()["trainer"]["pid"]
        c.check(os.getsid(sh) == sh and os.getpgid(sh) == sh,
                tag + "the command leads its own session and group")
        ckpt_sig = int(tenv.get("SPOTD_SIGNAL", "0")) if pid else 0
        c.check(ckpt_sig == signal.SIGRTMIN + 4,
                tag + "SPOTD_SIGNAL is the default RTMIN+4 (%s)" % ckpt_sig)
        c.check(sh > 0 and sig_ignored(sh, ckpt_sig), tag + "the shell starts "
                "with the checkpoint signal ignored")
        c.check(os.path.isabs(tenv.get("SPOTD_SOCKET", "")) if pid else False,
                tag + "trainer: SPOTD_SOCKET is absolute")
        cp = d.spotctl("checkpoint")
        time.sleep(0.5)
        c.check(cp.returncode == 0 and d.running() and not sl.pid_gone(sh),
                tag + "a shell with no handler survives the checkpoint signal")
        emu.control("notice", deadline=6)
        pid = d.host_pid(wait_pid(rpid))
        c.check(pid > 0, tag + "the relaunch step runs")
        if pid:
            renv = check_clean(c, tag + "relaunch step: ", pid)
            c.check(renv.get("SPOTD_REASON") == "aws-spot-terminate" and
                    "SPOTD_CKPT_DIR" not in renv,
                    tag + "relaunch step: its SPOTD_* variables only")
        rc = d.wait_exit(30)
        c.check(rc == 76, tag + "nothing committed after the notice: exit 76 (%s)"
                % rc)
    finally:
        emu.stop()
        sl.kill_started()
        s3.close()


def leftover(c, wd):
    tag = "leftover: "
    s3, store, job, _ = sl.fake_store("leftover")
    try:
        os.makedirs(wd)
        d = sl.Daemon(wd, store, job, env=s3.env(), grace=2,
                      cmd=["/bin/sh", "-c", "sleep 60 & sleep 5; exit 3"])
        st = sl.wait_state(d, "running", 20)
        pgid = st["trainer"]["pid"] if st else 0
        end = time.time() + 5  # the leader lives 5 s: room on a loaded machine
        while pgid and len(group(pgid)) < 2 and time.time() < end:
            time.sleep(0.05)
        c.check(pgid > 0 and len(group(pgid)) >= 2, tag + "a shell and its "
                "background sleep run")
        t0 = time.time()
        rc = d.wait_exit(20)
        c.check(rc == 3, tag + "spotd exits with the leader's status (%s) in "
                "%.1f s" % (rc, time.time() - t0))
        c.check(pgid > 0 and not group(pgid), tag + "nothing of its group is left")
    finally:
        sl.kill_started()
        s3.close()


def kill9(c, wd):
    tag = "kill9: "
    s3, store, job, _ = sl.fake_store("kill9")
    try:
        os.makedirs(wd)
        other = os.path.join(wd, "other-session.pid")
        # one sleep in a session of its own, as torch 2.x's torchrun starts
        # its workers; it ignores SIGTERM and SIGHUP
        d = sl.Daemon(wd, store, job, env=s3.env(),
                      cmd=["/bin/sh", "-c", "sleep 60 & sleep 60 & "
                           "setsid /bin/sh -c 'trap \"\" TERM HUP; "
                           "echo $$ > %s.tmp; mv %s.tmp %s; exec sleep 60' & "
                           "wait" % (other, other, other)])
        st = sl.wait_state(d, "running", 20)
        pgid = st["trainer"]["pid"] if st else 0
        end = time.time() + 5
        while pgid and len(group(pgid)) < 3 and time.time() < end:
            time.sleep(0.05)
        n = len(group(pgid)) if pgid else 0
        c.check(n >= 3, tag + "a shell and two sleeps run (%d)" % n)
        worker = d.host_pid(wait_pid(other))
        c.check(worker > 0 and not sl.pid_gone(worker),
                tag + "a sleep in another session runs")
        d.send(signal.SIGKILL)
        d.wait_exit(10)
        end = time.time() + 5
        while pgid and (group(pgid) or (worker and not sl.pid_gone(worker))) \
                and time.time() < end:
            time.sleep(0.05)
        c.check(pgid > 0 and not group(pgid), tag + "nothing of the trainer "
                "survives spotd: %s" % (group(pgid) if pgid else "?"))
        c.check(worker > 0 and sl.pid_gone(worker),
                tag + "nor the process in another session")
    finally:
        sl.kill_started()
        s3.close()


def not_caught(c, wd):
    tag = "not caught: "
    s3, store, job, _ = sl.fake_store("signal")
    try:
        os.makedirs(wd)
        pidf = os.path.join(wd, "py.pid")
        code = "import os, signal, time\n" \
               "signal.signal(int(os.environ['SPOTD_SIGNAL']), signal.SIG_DFL)\n" \
               "open(%r, 'w').write('%%d\\n' %% os.getpid())\n" \
               "time.sleep(60)\n" % pidf
        d = sl.Daemon(wd, store, job, env=s3.env(), cmd=[sl.PY3, "-c", code])
        c.check(sl.wait_state(d, "running", 20) is not None, tag + "running")
        pid = d.host_pid(wait_pid(pidf))
        c.check(pid > 0, tag + "the trainer runs with the default action")
        d.spotctl("checkpoint")
        time.sleep(1.0)
        c.check(d.running() and pid > 0 and not sl.pid_gone(pid),
                tag + "a process that would die of the checkpoint signal "
                "never gets it")
        c.check(d.err.matching(r"no process of the trainer catches the "
                               r"signal or reads the request file yet"),
                tag + "one line says the request waits")
        d.send(signal.SIGTERM)
        time.sleep(0.3)
        d.send(signal.SIGTERM)
        rc = d.wait_exit(20)
        c.check(rc == 128 + signal.SIGTERM, tag + "a second SIGTERM stops it "
                "(%s)" % rc)
    finally:
        sl.kill_started()
        s3.close()


def main():
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-children-") as wd:
        clean(c, os.path.join(wd, "clean"))
        leftover(c, os.path.join(wd, "leftover"))
        kill9(c, os.path.join(wd, "kill9"))
        not_caught(c, os.path.join(wd, "signal"))
    c.finish()


if __name__ == "__main__":
    main()
