#!/usr/bin/python3
"""Disk full in the checkpoint folder.

SPOTD_CKPT_DIR is a 4 MiB tmpfs mounted by the test (unmounted in
finally). A small trainer (written here; it follows the contract and
survives a failed save, as a real training loop that catches the error
would) saves 1 MiB on the first checkpoint request, then 8 MiB: the
second save fails with ENOSPC half way and leaves a folder without
SPOTD_COMPLETE. spotd must keep running, upload nothing of the
incomplete folder, keep the first commit intact (LATEST unchanged, its
restore identical), and still answer `spotctl status`."""
import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

TRAINER = r'''
import errno, json, os, signal, sys, time
flag = [False]
signal.signal(int(os.environ.get("SPOTD_SIGNAL") or signal.SIGUSR1),
              lambda *a: flag.__setitem__(0, True))
log = open(sys.argv[1], "a", buffering=1)
log.write(json.dumps({"ev": "ready"}) + "\n")
sizes = [1 << 20, 8 << 20, 8 << 20]
n = 0
while True:
    time.sleep(0.05)
    if not flag[0]:
        continue
    flag[0] = False
    d = os.path.join(os.environ["SPOTD_CKPT_DIR"], "ckpt-%d" % n)
    try:
        os.makedirs(d)
        with open(os.path.join(d, "weights.bin"), "wb") as f:
            f.write(os.urandom(sizes[min(n, 2)]))
        open(os.path.join(d, "SPOTD_COMPLETE"), "w").close()
        log.write(json.dumps({"ev": "saved", "name": "ckpt-%d" % n}) + "\n")
    except OSError as e:
        log.write(json.dumps({"ev": "save-failed", "name": "ckpt-%d" % n,
                              "errno": errno.errorcode.get(e.errno, "?")}) + "\n")
    n += 1
'''

sl.daemon_env()
c = sl.Checks()
store, job, prefix = sl.daemon_job("diskfull")
d = None
mounted = None
try:
    tmp = tempfile.mkdtemp()
    if True:
        wd = os.path.join(tmp, "d")
        ckpt = os.path.join(wd, "ckpt")
        os.makedirs(ckpt)
        cp = sl.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", ckpt])
        if cp.returncode != 0:
            print("FAIL: cannot mount a tmpfs (needs root): " + cp.stderr)
            sys.exit(1)
        mounted = ckpt
        script = os.path.join(tmp, "trainer.py")
        with open(script, "w") as f:
            f.write(TRAINER)
        tlog = os.path.join(tmp, "trainer.jsonl")
        d = sl.Daemon(wd, store, job, cmd=[sl.PY3, script, tlog], interval=0,
                      args=["--ckpt-timeout", "5"])
        c.check(d.wait_log(r"state \S+ -> running", 20) is not None, "spotd running")

        def events():
            return sl.read_jsonl(tlog)

        t0 = time.time()
        while time.time() - t0 < 20 and not events():
            time.sleep(0.05)  # the trainer's handler is set

        cp = d.spotctl("checkpoint", "--wait", "--timeout", "60", timeout=70)
        c.check(cp.returncode == 0, "first checkpoint committed", cp.stdout + cp.stderr)
        first = sl.latest(prefix)
        c.check(first == "ckpt-0", "LATEST is ckpt-0 (%s)" % first)
        t0 = time.time()
        cp = d.spotctl("checkpoint", timeout=30)
        while time.time() - t0 < 20 and not any(e["ev"] == "save-failed" for e in events()):
            time.sleep(0.1)
        ev = [e for e in events() if e["ev"] == "save-failed"]
        c.check(ev and ev[0]["errno"] == "ENOSPC", "the trainer's save failed with ENOSPC",
                repr(events()))
        c.check(os.path.isdir(os.path.join(ckpt, "ckpt-1")) and
                not os.path.exists(os.path.join(ckpt, "ckpt-1", "SPOTD_COMPLETE")),
                "an incomplete folder is left in the checkpoint folder")
        time.sleep(3)  # time for a (wrong) upload to start
        c.check(d.running(), "spotd keeps running")
        st = d.status()
        c.check(st is not None, "spotctl status answers", repr(st))
        print("     status: " + json.dumps(st)[:600])
        c.check(sl.committed(prefix) == ["ckpt-0"], "only ckpt-0 is committed",
                repr(sl.committed(prefix)))
        c.check(sl.latest(prefix) == "ckpt-0", "LATEST still ckpt-0")
        # SIGTERM asks for a final checkpoint, which fails too: spotd gives
        # up after --ckpt-timeout and stops
        d.send(signal.SIGTERM)
        rc = d.wait_exit(30)
        c.check(rc is not None and rc >= 0,
                "spotd stops on SIGTERM once the final checkpoint times out (%s)" % rc,
                d.log()[-1500:])
        # with overlap its closed files may have gone up while it was
        # written: never committed, and nothing of it left once spotd gave up
        keys = sl.s3_keys(prefix + "checkpoints/ckpt-1/")
        c.check(keys == [], "nothing of the incomplete folder is left", repr(keys))
        out = os.path.join(tmp, "back")
        cp = sl.spotctl("restore", store + "/" + job, out)
        c.check(cp.returncode == 0 and os.path.getsize(os.path.join(out, "weights.bin"))
                == 1 << 20, "the first commit restores intact", cp.stdout + cp.stderr)
finally:
    if d is not None and d.running():
        d.send(signal.SIGKILL)
    sl.kill_started()
    if mounted:
        r = sl.run(["umount", mounted])
        if r.returncode != 0:
            sl.run(["umount", "-l", mounted])
    sl.s3_cleanup(prefix)
    if not mounted or not os.path.ismount(mounted):
        sl.run(["rm", "-rf", tmp])
c.finish()
