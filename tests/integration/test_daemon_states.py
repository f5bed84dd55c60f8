"""The engine's state machine against the loopback fake S3 (no Ceph):
states only move forward, and every callback after close is a no-op.

  restore: SIGTERM while spotd restores the newest checkpoint at startup
           exits 143 (the signal's status), never starts the trainer.
  twice:   notice -> the relaunch step runs -> SIGTERM twice: exits 143
           at once, the relaunch step is gone, the engine's states never
           go back (no "exiting -> stopping")."""
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def sigterm_during_restore(c, wd):
    tag = "restore: "
    s3, store, job, _ = sl.fake_store("restore")
    try:
        src = os.path.join(wd, "src")
        os.makedirs(src)
        with open(os.path.join(src, "weights"), "wb") as f:
            f.write(os.urandom(1 << 16))
        cp = sl.spotctl("push", src, store + "/" + job, "--name", "step-000001",
                        env=s3.env())
        c.check(cp.returncode == 0, tag + "a checkpoint is committed",
                cp.stdout + cp.stderr)
        # Hold every read of the checkpoint's data: the restore hangs.
        s3.stall = lambda m, k: 30 if (m == "GET" and "/checkpoints/" in k and
                                       not k.endswith("MANIFEST.json")) else 0
        d = sl.Daemon(wd, store, job, env=s3.env(), trainer=["--step-sleep", 0.05])
        st = sl.wait_state(d, "restoring", 20)
        c.check(st is not None, tag + "status says restoring")
        t0 = time.time()
        d.send(signal.SIGTERM)
        rc = d.wait_exit(10)
        c.check(rc == 128 + signal.SIGTERM, tag + "SIGTERM exits 143 (%s) in %.1f s"
                % (rc, time.time() - t0))
        c.check(not d.events("start"), tag + "the trainer never started")
        c.check(sl.forward_only(sl.states(d)), tag + "states only forward: %s"
                % sl.states(d))
    finally:
        sl.kill_started()
        s3.close()


def relaunch_sigterm_twice(c, wd):
    tag = "twice: "
    s3, store, job, prefix = sl.fake_store("twice")
    emu = sl.EmulatorProc("aws")
    try:
        os.makedirs(wd)
        pidfile = os.path.join(wd, "hook.pid")
        hook = os.path.join(wd, "hook.py")
        with open(hook, "w") as f:
            f.write("import os, time\nopen(%r, 'w').write(str(os.getpid()))\n"
                    "time.sleep(30)\n" % pidfile)
        d = sl.Daemon(wd, store, job, env=s3.env(), provider="aws",
                      metadata_url=emu.url, grace=5,
                      args=["--relaunch", "%s %s" % (sl.PY3, hook)],
                      trainer=["--step-sleep", 0.05])
        c.check(sl.wait_state(d, "running", 20) is not None, tag + "running")
        # the trainer's handler is installed (spotd starts it with the
        # signal ignored): a notice before would go unanswered
        c.check(d.wait_event("start", 20) is not None, tag + "the trainer started")
        emu.control("notice", deadline=40)
        st = sl.wait_state(d, "relaunching", 20)
        c.check(st is not None and st.get("last_commit", {}).get("name"),
                tag + "relaunching, the final checkpoint committed", repr(st))
        end = time.time() + 10
        while time.time() < end and not sl.read_text(pidfile).strip():
            time.sleep(0.05)
        hook_pid = d.host_pid(int(sl.read_text(pidfile) or 0))
        c.check(hook_pid > 0, tag + "the relaunch step runs (pid %d)" % hook_pid)
        d.send(signal.SIGTERM)
        time.sleep(0.3)
        c.check(d.running(), tag + "the first SIGTERM finishes the notice's work")
        t0 = time.time()
        d.send(signal.SIGTERM)
        rc = d.wait_exit(10)
        c.check(rc == 128 + signal.SIGTERM, tag + "the second exits 143 (%s) in "
                "%.1f s" % (rc, time.time() - t0))
        c.check(hook_pid > 0 and sl.pid_gone(hook_pid), tag + "the relaunch step "
                "is gone")
        seq = sl.states(d)
        c.check(sl.forward_only(seq) and seq[-1:] == ["exiting"],
                tag + "states only forward, exiting last: %s" % seq)
        start = d.trainer_pids()
        c.check(start and sl.pid_gone(start[0]), tag + "the trainer is gone")
    finally:
        emu.stop()
        sl.kill_started()
        s3.close()


def main():
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-states-") as wd:
        sigterm_during_restore(c, os.path.join(wd, "restore"))
        relaunch_sigterm_twice(c, os.path.join(wd, "twice"))
    c.finish()


if __name__ == "__main__":
    main()
