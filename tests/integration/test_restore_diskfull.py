#!/usr/bin/python3
"""A local fault at restore is never taken for damage in the store.

The job has a small good step-000010 and a 3 MiB step-000020 (the newest).
--ckpt-dir is a small tmpfs mounted by the test (unmounted in finally):

1. precheck: the tmpfs has room for step-000010 but not step-000020.
   spotd fails before fetching anything: exit 74, one line naming the
   folder, the bytes needed and the bytes free; no older checkpoint, no
   trainer, no "damaged" advice. (Before, the download hit ENOSPC, the
   checkpoint "failed verification" and spotd started the trainer from
   step-000010: the progress since was silently rolled back.)
2. ENOSPC while writing: spotd is stopped right after its space check
   (fault point restore-space-checked:stop), the test fills the disk, then
   lets it go on: the same exit 74 and line, and no partial folder left.
3. a read-only --ckpt-dir: exit 74, the line says so, no fallback; also
   when spotd cannot even make its journal folder there at start.
4. an old local copy of step-000020 that the disk can hold only once:
   spotd removes it before the download and restores step-000020; the
   partial download a killed spotd left there is removed too.
"""
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

BIG = 3 << 20


def make(d, step, size):
    os.makedirs(d)
    with open(os.path.join(d, "step"), "w") as f:
        f.write("%d\n" % step)
    sl.write_random(os.path.join(d, "data.bin"), size)


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path, leave):
    """A file that leaves about `leave` bytes free in path's file system."""
    n = free_bytes(path) - leave
    with open(os.path.join(path, "filler"), "wb") as f:
        f.write(b"\0" * max(n, 0))


def restored(ckpt):
    """What a restore left in ckpt: all but the filler and spotd's journal."""
    return sorted(set(os.listdir(ckpt)) - {"filler", ".spotd-journal"})


def stopped(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def mount(ckpt, opts):
    os.makedirs(ckpt, exist_ok=True)
    cp = sl.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", ckpt])
    if cp.returncode != 0:
        return False
    return True


def tmpfs_node(wd, name, size, mounted):
    """A node folder whose checkpoint folder is a fresh tmpfs of size;
    skips the test when mounting is not allowed."""
    node = os.path.join(wd, name)
    ckpt = os.path.join(node, "ckpt")
    if not mount(ckpt, "size=%s,mode=0755" % size):
        sl.skip("cannot mount a tmpfs (needs root)")
    mounted.append(ckpt)
    return node, ckpt


def umount(ckpt):
    if os.path.ismount(ckpt):
        if sl.run(["umount", ckpt]).returncode != 0:
            sl.run(["umount", "-l", ckpt])


def refused(c, d, tag, what):
    """The checks every local failure shares."""
    rc = d.wait_exit(90)
    c.check(rc == 74, tag + "spotd exits 74", "rc=%s\n%s" % (rc, d.log()[-1500:]))
    c.check(d.events("start") == [], tag + "no trainer started")
    lines = d.err.matching(r"restore: the local disk failed")
    c.check(len(lines) == 1, tag + "one line says the local disk failed",
            d.log()[-1500:])
    line = lines[0] if lines else ""
    c.check(what in line, tag + "the line says why (%s)" % what, line)
    c.check(d.ckpt_dir in line, tag + "the line names the folder", line)
    c.check(bool(re.search(r"needs \d+ bytes", line)) and
            bool(re.search(r"\d+ are free", line)),
            tag + "the line gives the bytes needed and free", line)
    log = d.log()
    c.check("trying the older" not in log and "verification" not in log and
            "damaged" not in log,
            tag + "no fallback, nothing called damaged", log[-1500:])
    return line


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("rdiskfull")
    url = store + "/" + job
    mounted = []
    wd = tempfile.mkdtemp(prefix="spotd-rdiskfull-")
    try:
        src10 = os.path.join(wd, "src", "step-000010")
        src20 = os.path.join(wd, "src", "step-000020")
        make(src10, 10, 200000)
        make(src20, 20, BIG)
        for src in (src10, src20):
            cp = sl.spotctl("push", src, url)
            c.check(cp.returncode == 0, "push " + os.path.basename(src),
                    cp.stdout + cp.stderr)
        c.check(sl.latest(prefix) == "step-000020", "LATEST is step-000020")

        # 1: no room for the newest: refused before anything is fetched
        node, ckpt = tmpfs_node(wd, "n1", "4m", mounted)
        fill(ckpt, 1 << 20)  # step-000010 fits, step-000020 does not
        d = sl.Daemon(node, store, job, trainer=["--step-sleep", 0.05],
                      args=["--log-level", "debug"])
        line = refused(c, d, "precheck: ", "nothing was fetched")
        m = re.search(r"needs (\d+) bytes.*?(\d+) are free", line)
        c.check(m is not None and int(m.group(1)) >= BIG and
                int(m.group(2)) < int(m.group(1)),
                "precheck: needed >= the checkpoint's size > free", line)
        c.check(not d.err.matching(r"restore prepare -> transfer "
                                   r"name=step-000020 "),
                "precheck: the restore never reached its transfers")
        c.check(restored(ckpt) == [],
                "precheck: nothing left in the checkpoint folder",
                repr(os.listdir(ckpt)))
        umount(ckpt)

        # 2: room at the check, ENOSPC while writing
        node, ckpt = tmpfs_node(wd, "n2", "4m", mounted)
        d = sl.Daemon(node, store, job, trainer=["--step-sleep", 0.05],
                      env={"SPOTD_FAULT": "restore-space-checked:stop"})
        t0 = time.time()
        while time.time() - t0 < 60 and d.running() and not stopped(d.pid):
            time.sleep(0.1)
        c.check(stopped(d.pid), "enospc: spotd stopped after its space check",
                d.log()[-1000:])
        fill(ckpt, 1 << 20)
        os.kill(d.pid, signal.SIGCONT)
        refused(c, d, "enospc: ", "No space left on device")
        c.check(restored(ckpt) == [],
                "enospc: no partial download left in the checkpoint folder",
                repr(os.listdir(ckpt)))
        umount(ckpt)

        # 3: a read-only checkpoint folder (spotd's journal folder made
        # before, as a previous spotd would have)
        node, ckpt = tmpfs_node(wd, "n3", "4m", mounted)
        os.mkdir(os.path.join(ckpt, ".spotd-journal"))
        if sl.run(["mount", "-o", "remount,ro", ckpt]).returncode != 0:
            sl.skip("cannot remount a tmpfs read-only")
        d = sl.Daemon(node, store, job, trainer=["--step-sleep", 0.05])
        refused(c, d, "read-only: ", "Read-only file system")
        umount(ckpt)

        # 3b: read-only before spotd could make its journal folder: the
        # start fails on the local disk, exit 74 as well (it was 71)
        node, ckpt = tmpfs_node(wd, "n3b", "4m", mounted)
        if sl.run(["mount", "-o", "remount,ro", ckpt]).returncode != 0:
            sl.skip("cannot remount a tmpfs read-only")
        d = sl.Daemon(node, store, job, trainer=["--step-sleep", 0.05])
        rc = d.wait_exit(90)
        c.check(rc == 74, "read-only at start: spotd exits 74",
                "rc=%s\n%s" % (rc, d.log()[-1500:]))
        c.check(d.events("start") == [], "read-only at start: no trainer")
        c.check(bool(d.err.matching(r"journal folder \S+: .*[Rr]ead-only")),
                "read-only at start: one line names the journal folder and "
                "why", d.log()[-1500:])
        umount(ckpt)

        # 4: the old local copy of the newest fits once: replaced, not doubled
        node, ckpt = tmpfs_node(wd, "n4", "5m", mounted)
        shutil.copytree(src20, os.path.join(ckpt, "step-000020"))
        # what a spotd killed during its restore leaves behind
        left = os.path.join(ckpt, "..spotd-resume.spotd-restore-Ab12Cd")
        os.makedirs(os.path.join(left, "sub"))
        with open(os.path.join(left, "sub", "part"), "wb") as f:
            f.write(b"x" * 4096)
        c.check(free_bytes(ckpt) < BIG,
                "replace: the disk cannot hold a second copy of step-000020")
        d = sl.Daemon(node, store, job, trainer=["--step-sleep", 0.05])
        s = d.wait_event("start", 90)
        c.check(s is not None and s["step"] == 20,
                "replace: the trainer resumes from step-000020", d.log()[-1500:])
        c.check(bool(d.err.matching(r"removed the old local copy \S+/step-000020")),
                "replace: spotd says it removed the old local copy first",
                d.log()[-1500:])
        c.check(not os.path.exists(left),
                "replace: the partial download a killed spotd left is removed",
                repr(os.listdir(ckpt)))
        d.send(signal.SIGTERM)
        d.wait_exit(60)
    finally:
        sl.kill_started()
        for m in mounted:
            umount(m)
        sl.s3_cleanup(prefix)
        if not any(os.path.ismount(m) for m in mounted):
            shutil.rmtree(wd, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
