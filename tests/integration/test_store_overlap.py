"""spotd's upload overlapped with the save (overlap = true, store.h
`follow`): real spotd, real Ceph, a trainer (this script, `trainer` mode)
that spotd signals with `spotctl checkpoint`, and that waits, after writing
its big file, until spotd has stored that file's object before it goes on.

  normal     ckpt-1: big.bin stored before the marker, then a file that
             grows slowly (its full parts may go up as it grows), more files
             and the marker: committed, restores byte-identical, big.bin was
             not uploaded twice;
  rewrite    ckpt-2: big.bin stored, then rewritten in place with other
             bytes of the same size and its old mtime put back (only the
             CRC32C check can see it): the commit restores the NEW bytes;
  abandoned  ckpt-3: big.bin stored, a second big file written, then the
             trainer exits without the marker: no MANIFEST.json, LATEST
             still ckpt-2, no multipart upload and no object of ckpt-3 left;
  off        --overlap=false: nothing is uploaded before the marker, the
             commit restores byte-identical.
No timing is asserted: every wait is for an event."""
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

MIB = 1 << 20


# ------------------------------------------------------------ the trainer

def write_bytes(path, nbytes, seed, mode="wb"):
    import random
    rng = random.Random(seed)
    with open(path, mode) as f:
        f.seek(0)
        left = nbytes
        while left > 0:
            n = min(left, 4 * MIB)
            f.write(rng.randbytes(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())


def trainer_main(wd, once):
    ck = int(os.environ.get("SPOTD_SIGNAL") or signal.SIGUSR1)
    signal.pthread_sigmask(signal.SIG_BLOCK, {ck, signal.SIGTERM})
    ckpt_dir = os.environ["SPOTD_CKPT_DIR"]
    log = open(os.path.join(wd, "trainer.jsonl"), "a")

    def emit(ev, **kw):
        kw.update(ev=ev, t=time.time())
        log.write(json.dumps(kw) + "\n")
        log.flush()

    def wait_go(n):
        go = os.path.join(wd, "go-%d" % n)
        while not os.path.exists(go):
            time.sleep(0.05)

    def finish(n, d):
        # what the store must hold: a copy without the marker (spotd
        # removes local checkpoints older than its newest commit)
        shutil.copytree(d, os.path.join(wd, "expect", "ckpt-%d" % n))
        open(os.path.join(d, "SPOTD_COMPLETE"), "w").close()
        emit("complete", n=n)

    emit("ready")
    n = 0
    while True:
        info = signal.sigtimedwait({ck, signal.SIGTERM}, 1)
        if info is None:
            continue
        if info.si_signo == signal.SIGTERM:
            emit("term")
            return 0
        n += 1
        d = os.path.join(ckpt_dir, "ckpt-%d" % n)
        os.makedirs(os.path.join(d, "sub"))
        big = os.path.join(d, "big.bin")
        write_bytes(big, 24 * MIB, seed=n)  # two 16 MiB parts
        emit("big", n=n)
        wait_go(n)
        if n == 2:
            # the same size, other bytes, in place, the old mtime back
            st = os.stat(big)
            write_bytes(big, 24 * MIB, seed=1000 + n, mode="r+b")
            os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
            emit("rewritten", n=n)
        if n == 3:
            write_bytes(os.path.join(d, "big2.bin"), 40 * MIB, seed=3000)
            time.sleep(1.5)  # spotd may start on it; it must be aborted
            emit("abandon", n=n)
            return 0
        if n == 1:
            # appended to slowly: its full parts may go up as it grows
            with open(os.path.join(d, "grow.bin"), "wb") as f:
                for i in range(6):
                    f.write(os.urandom(8 * MIB))
                    f.flush()
                    time.sleep(0.3)
                f.write(os.urandom(12345))
        write_bytes(os.path.join(d, "sub", "more.bin"), 3 * MIB, seed=100 + n)
        with open(os.path.join(d, "small.txt"), "w") as f:
            f.write("step %d\n" % n)
        finish(n, d)
        if once:
            return 0


# ------------------------------------------------------------- the test

def events(wd, ev=None):
    return [e for e in sl.trainer_events(os.path.join(wd, "trainer.jsonl"))
            if ev is None or e["ev"] == ev]


def wait_for(what, fn, timeout):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    print("timed out waiting for " + what)
    return None


def stored(prefix, name, rel):
    """Whether an object of rel of checkpoint name is complete in the store
    (the follow stored it; MANIFEST.json need not exist)."""
    return [k for k in sl.s3_keys(prefix + "checkpoints/%s/" % name)
            if k.endswith("/" + rel + ".zst")]


def start(wd, store, job, args=(), once=False):
    os.makedirs(wd, exist_ok=True)
    d = sl.Daemon(wd, store, job, interval=0, args=list(args),
                  cmd=[sys.executable, os.path.abspath(__file__), "trainer", wd,
                       "once" if once else "many"])
    ok = wait_for("the trainer", lambda: events(wd, "ready"), 60)
    return d, ok


def ask(c, d, wd, n, tag):
    cp = d.spotctl("checkpoint", timeout=30)
    c.check(cp.returncode == 0, tag + "spotctl checkpoint", cp.stderr)
    return wait_for("big.bin of ckpt-%d" % n,
                    lambda: events(wd, "big") and
                    [e for e in events(wd, "big") if e["n"] == n], 60)


def overlap_on(c, root):
    store, job, prefix = sl.daemon_job("overlap")
    wd = os.path.join(root, "on")
    with sl.cleaned_up(prefix):
        d, ok = start(wd, store, job, ["--keep", 5])
        c.check(ok, "the trainer started", d.log())
        if not ok:
            return

        # normal: big.bin goes up before the marker and is reused
        tag = "normal: "
        ask(c, d, wd, 1, tag)
        up = wait_for("big.bin stored", lambda: stored(prefix, "ckpt-1", "big.bin"), 60)
        c.check(bool(up), tag + "big.bin is stored before the marker exists",
                d.log())
        c.check(not os.path.exists(os.path.join(d.ckpt_dir, "ckpt-1",
                                                "SPOTD_COMPLETE")) and
                "ckpt-1" not in sl.committed(prefix),
                tag + "not committed before the marker")
        open(os.path.join(wd, "go-1"), "w").close()
        line = d.wait_log(r"committed checkpoint name=ckpt-1", 60)
        c.check(line is not None, tag + "ckpt-1 committed", d.log())
        c.check(d.err.matching(r"push name=ckpt-1: final walk: 4 files, "
                               r"[123] uploaded before the marker and "
                               r"unchanged, 0 changed"),
                tag + "big.bin uploaded once (checked at the marker)")
        # What was read before the marker is read again at it, what was
        # read after is not: big.bin (stored before the marker) is read
        # again, grow.bin's last part (12345 bytes, read only once the
        # marker was there) never is; every other part is whole MiB.
        fw = d.err.matching(r"push name=ckpt-1: final walk: .*; (\d+) bytes "
                            r"read before the marker read again")
        again = int(re.search(r"; (\d+) bytes read before", fw[0]).group(1)) \
            if fw else -1
        if d.err.matching(r"push name=ckpt-1: grow\.bin grows"):
            # (taken while it grew: its last part waited for the marker;
            # a scan that only saw it whole takes it as closed instead)
            c.check(again >= 24 * MIB and again % MIB == 0,
                    tag + "big.bin read again at the marker, grow.bin's "
                    "last part not", "read again: %d bytes" % again)
        else:
            c.check(again >= 24 * MIB, tag + "big.bin read again at the "
                    "marker", "read again: %d bytes" % again)
        sl.check_restore(c, "%s/%s" % (store, job),
                         os.path.join(wd, "expect", "ckpt-1"),
                         os.path.join(root, "r1"),
                         tag + "ckpt-1 restores byte-identical", "--name",
                         "ckpt-1")

        # rewrite: the same size and mtime, other bytes
        tag = "rewrite: "
        ask(c, d, wd, 2, tag)
        old = wait_for("big.bin stored", lambda: stored(prefix, "ckpt-2", "big.bin"), 60)
        c.check(bool(old), tag + "big.bin is stored before it is rewritten",
                d.log())
        open(os.path.join(wd, "go-2"), "w").close()
        line = d.wait_log(r"committed checkpoint name=ckpt-2", 60)
        c.check(line is not None, tag + "ckpt-2 committed", d.log())
        c.check(d.err.matching(r"push name=ckpt-2: final walk: 3 files, "
                               r"\d+ uploaded before the marker and "
                               r"unchanged, 1 changed since"),
                tag + "the rewritten big.bin was found changed")
        sl.check_restore(c, "%s/%s" % (store, job),
                         os.path.join(wd, "expect", "ckpt-2"),
                         os.path.join(root, "r2"),
                         tag + "ckpt-2 restores the new bytes of big.bin",
                         "--name", "ckpt-2")
        c.check(sl.latest(prefix) == "ckpt-2", tag + "LATEST is ckpt-2")

        # abandoned: the trainer exits without the marker
        tag = "abandoned: "
        ask(c, d, wd, 3, tag)
        up = wait_for("big.bin stored", lambda: stored(prefix, "ckpt-3", "big.bin"), 60)
        c.check(bool(up), tag + "big.bin is stored before the trainer gives up",
                d.log())
        open(os.path.join(wd, "go-3"), "w").close()
        rc = d.wait_exit(90)
        c.check(rc == 0, tag + "spotd exits 0 with the trainer", "rc=%s" % rc)
        c.check(d.err.matching(r"not uploading ckpt-3, which is not complete"),
                tag + "spotd dropped the folder never marked complete")
        c.check("ckpt-3" not in sl.committed(prefix),
                tag + "ckpt-3 has no MANIFEST.json", str(sl.committed(prefix)))
        c.check(sl.latest(prefix) == "ckpt-2", tag + "LATEST is still ckpt-2",
                "LATEST=%r" % sl.latest(prefix))
        left = sl.s3_uploads(prefix)
        c.check(left == [], tag + "no multipart upload left", str(left))
        objs = sl.s3_keys(prefix + "checkpoints/ckpt-3/")
        c.check(objs == [], tag + "no object of ckpt-3 left", str(objs))


def overlap_off(c, root):
    store, job, prefix = sl.daemon_job("overlap-off")
    wd = os.path.join(root, "off")
    tag = "off: "
    with sl.cleaned_up(prefix):
        d, ok = start(wd, store, job, ["--overlap=false"], once=True)
        c.check(ok, tag + "the trainer started", d.log())
        if not ok:
            return
        ask(c, d, wd, 1, tag)
        open(os.path.join(wd, "go-1"), "w").close()
        line = d.wait_log(r"committed checkpoint name=ckpt-1", 60)
        c.check(line is not None, tag + "ckpt-1 committed", d.log())
        c.check(not d.err.matching(r"while the trainer writes it|before the "
                                   r"marker"),
                tag + "nothing uploaded before the marker")
        sl.check_restore(c, "%s/%s" % (store, job),
                         os.path.join(wd, "expect", "ckpt-1"),
                         os.path.join(root, "r-off"),
                         tag + "ckpt-1 restores byte-identical", "--name",
                         "ckpt-1")
        rc = d.wait_exit(60)
        c.check(rc == 0, tag + "spotd exits 0 with the trainer", "rc=%s" % rc)


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "trainer":
        return trainer_main(sys.argv[2], sys.argv[3] == "once")
    sl.daemon_env()
    c = sl.Checks()
    root = tempfile.mkdtemp(prefix="spotd-overlap-")
    try:
        overlap_on(c, root)
        overlap_off(c, root)
    finally:
        sl.kill_started()
        shutil.rmtree(root, ignore_errors=True)
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
