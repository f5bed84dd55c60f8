"""Small truths of the daemon, against the loopback fake S3:

  restarts: a start that stops at once because a notice is posted (the
            trainer never launched) does not count in RESTARTS, and its last
            line gives the restored checkpoint's commit time (not the
            restore's); the next real start counts, and the trainer gets
            that count.
  resume:   SPOTD_RESUME_DIR (and SPOTD_CKPT_DIR) are absolute even with
            a relative --ckpt-dir.
  timeout:  after a notice --ckpt-timeout does not cut the wait: a save
            slower than it still commits before the deadline (exit 75).
  marker:   a save that writes its data, then takes seconds before its
            SPOTD_COMPLETE marker: once the data is uploaded the progress
            line says spotd waits for the marker (and how long), not
            "100% at 0 MB/s".
  symlink:  a checkpoint holding an absolute symlink is refused with a line
            naming the link and the option that stores it; with
            --follow-symlinks (which the line names) the same checkpoint is
            committed and restores the file the link pointed to.
  unmarked: a folder an earlier run left without its SPOTD_COMPLETE marker
            (never uploaded) is named in one warning at start, with the
            advice to remove it; the folder itself is left alone."""
import calendar
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def restarts_and_resume(c, wd):
    s3, store, job, prefix = sl.fake_store("restarts")
    emu = sl.EmulatorProc("aws")
    cwd = os.getcwd()
    try:
        os.makedirs(wd)
        src = os.path.join(wd, "src")
        os.makedirs(src)
        with open(os.path.join(src, "step"), "w") as f:
            f.write("7\n")
        cp = sl.spotctl("push", src, store + "/" + job, "--name", "step-000007",
                        env=s3.env())
        c.check(cp.returncode == 0, "a checkpoint is committed", cp.stderr)
        pushed = int(time.time())
        time.sleep(2.5)  # the restore below comes seconds after the commit
        s3.objects[prefix + "RESTARTS"] = (b"2\n", '"x"')
        # The notice is up before spotd starts; the restore is held long
        # enough for the poller to see it.
        emu.control("notice", deadline=60)
        s3.stall = lambda m, k: 1.5 if m == "GET" and k.endswith((".zst", ".pack")) else 0
        d = sl.Daemon(os.path.join(wd, "one"), store, job, env=s3.env(),
                      provider="aws", metadata_url=emu.url)
        rc = d.wait_exit(30)
        c.check(rc == 75 and not d.events("start"), "restarts: a notice before "
                "the launch: exit 75 (%s), no trainer" % rc)
        line = d.wait_log(r"preempted before the trainer started", 1) or ""
        m = re.search(r"\(committed (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", line)
        made = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) \
            if m else None
        c.check(made is not None and made <= pushed,
                "restarts: the last line gives the checkpoint's commit time "
                "(%s, pushed by %s), not the restore's" %
                (m.group(1) if m else "-",
                 time.strftime("%H:%M:%S", time.gmtime(pushed))), line)
        got = s3.objects.get(prefix + "RESTARTS", (b"",))[0].decode().strip()
        c.check(got == "2", "restarts: that start is not counted (RESTARTS %s)"
                % got)
        emu.control("cancel", notice=1)
        s3.stall = lambda m, k: 0
        os.chdir(wd)
        d = sl.Daemon(os.path.join(wd, "two"), store, job, env=s3.env(),
                      args=["--ckpt-dir", "rel-ckpt"],
                      trainer=["--step-sleep", 0.02])
        st = d.wait_event("start", 20)
        env = st["env"] if st else {}
        c.check(env.get("SPOTD_RESTART_COUNT") == "3", "restarts: the trainer "
                "gets SPOTD_RESTART_COUNT 3 (%s)" % env.get("SPOTD_RESTART_COUNT"))
        rd = env.get("SPOTD_RESUME_DIR", "")
        c.check(os.path.isabs(rd) and rd == os.path.join(wd, "rel-ckpt", "step-000007"),
                "resume: SPOTD_RESUME_DIR is absolute (%s)" % rd)
        c.check(os.path.isabs(env.get("SPOTD_CKPT_DIR", "")),
                "resume: SPOTD_CKPT_DIR is absolute")
        d.send(15)
        d.wait_exit(20)
        got = s3.objects.get(prefix + "RESTARTS", (b"",))[0].decode().strip()
        c.check(got == "3", "restarts: the real start is counted (RESTARTS %s)" % got)
    finally:
        os.chdir(cwd)
        emu.stop()
        sl.kill_started()
        s3.close()


def ckpt_timeout(c, wd):
    s3, store, job, prefix = sl.fake_store("timeout")
    emu = sl.EmulatorProc("aws")
    try:
        d = sl.Daemon(wd, store, job, env=s3.env(), provider="aws",
                      metadata_url=emu.url, args=["--ckpt-timeout", "1"],
                      trainer=["--step-sleep", 0.02, "--save-delay", 3])
        c.check(d.wait_event("step", 20) is not None, "timeout: the trainer runs")
        emu.control("notice", deadline=20)
        st = sl.wait_state(d, "draining", 10)
        time.sleep(2)  # past --ckpt-timeout, before the save ends
        st = d.status() or {}
        c.check(st.get("state") == "draining" and
                not any("did not complete" in w for w in st.get("warnings", [])),
                "timeout: 2 s after the notice still draining, no timeout (%s)"
                % st.get("state"), repr(st.get("warnings")))
        rc = d.wait_exit(30)
        made = d.events("checkpoint")
        name = made[0]["name"] if made else "?"
        latest = s3.objects.get(prefix + "LATEST", (b"",))[0].decode().strip()
        c.check(rc == 75 and latest == name, "timeout: a 3 s save with "
                "--ckpt-timeout 1 is committed after a notice (exit %s, LATEST %s)"
                % (rc, latest))
    finally:
        emu.stop()
        sl.kill_started()
        s3.close()


def marker_wait(c, wd):
    s3, store, job, prefix = sl.fake_store("marker")
    emu = sl.EmulatorProc("aws")
    try:
        # 3 MiB of data (uploaded early by --overlap), then 8 s before the
        # marker.
        d = sl.Daemon(wd, store, job, env=s3.env(), provider="aws",
                      metadata_url=emu.url,
                      trainer=["--step-sleep", 0.02, "--bytes", 3 << 20,
                               "--save-delay", 8])
        c.check(d.wait_event("step", 20) is not None, "marker: the trainer runs")
        emu.control("notice", deadline=40)
        line = d.wait_log(r"waiting for the trainer's SPOTD_COMPLETE marker "
                          r"\((\d+) s\)", 20)
        rc = d.wait_exit(40)
        log = d.log()
        waits = [int(m) for m in re.findall(
            r"waiting for the trainer's SPOTD_COMPLETE marker \((\d+) s\)", log)]
        c.check(line is not None and len(waits) >= 2 and waits == sorted(waits)
                and waits[-1] > waits[0],
                "marker: the progress line says it waits for the marker, and "
                "for how long: %s" % waits, log[-2000:])
        c.check(not re.search(r"\(100%\) at 0 MB/s", log),
                "marker: no '100% at 0 MB/s' line while it waits", log[-2000:])
        c.check(rc == 75, "marker: the checkpoint is committed (exit %s)" % rc)
    finally:
        emu.stop()
        sl.kill_started()
        s3.close()


SYMLINK_TRAINER = r"""
import os, sys
ck = os.environ["SPOTD_CKPT_DIR"]
outside = os.path.join(os.path.dirname(ck), "outside.bin")
with open(outside, "wb") as f:
    f.write(b"weights-outside" * 1000)
d = os.path.join(ck, "step-000001")
os.makedirs(d)
with open(os.path.join(d, "model.bin"), "wb") as f:
    f.write(b"model" * 1000)
os.symlink(outside, os.path.join(d, "tokenizer.bin"))
open(os.path.join(d, "SPOTD_COMPLETE"), "w").close()
"""


def symlink(c, wd):
    store, job, prefix = sl.daemon_job("symlink")
    with sl.cleaned_up(prefix):
        cmd = [sl.PY3, "-c", SYMLINK_TRAINER]
        d = sl.Daemon(os.path.join(wd, "refused"), store, job, cmd=cmd)
        rc = d.wait_exit(60)
        log = d.log()
        m = re.search(r"tokenizer\.bin: a symlink to '[^']*outside\.bin'.*"
                      r"\((--follow-symlinks)", log)
        c.check(m is not None, "symlink: the refusal names the link and the "
                "option", log[-2000:])
        c.check(rc != 0 and sl.latest(prefix) is None,
                "symlink: nothing committed without the option (exit %s)" % rc)
        # the option the line names is one spotd takes
        d = sl.Daemon(os.path.join(wd, "followed"), store, job, cmd=cmd,
                      args=["--follow-symlinks"])
        rc = d.wait_exit(60)
        c.check(rc == 0 and sl.latest(prefix) == "step-000001",
                "symlink: --follow-symlinks commits it (exit %s, LATEST %r)"
                % (rc, sl.latest(prefix)), d.log()[-2000:])
        out = os.path.join(wd, "restored")
        cp = sl.spotctl("restore", "%s/%s" % (store, job), out, timeout=60)
        got = os.path.join(out, "tokenizer.bin")
        c.check(cp.returncode == 0 and not os.path.islink(got) and
                open(got, "rb").read() == b"weights-outside" * 1000,
                "symlink: the restore holds the file the link pointed to",
                cp.stderr)


def unmarked(c, wd):
    store, job, prefix = sl.daemon_job("unmarked")
    with sl.cleaned_up(prefix):
        left = os.path.join(wd, "ckpt", "step-000007")
        os.makedirs(left)
        with open(os.path.join(left, "model.bin"), "wb") as f:
            f.write(b"x" * 4096)
        os.makedirs(os.path.join(wd, "ckpt", "marked"))
        open(os.path.join(wd, "ckpt", "marked", "SPOTD_COMPLETE"), "w").close()
        d = sl.Daemon(wd, store, job, cmd=["true"])
        rc = d.wait_exit(60)
        lines = d.err.matching(r"no SPOTD_COMPLETE marker and will never be "
                               r"uploaded")
        listed = re.search(r"copies\): (.*); remove", lines[0]) \
            if len(lines) == 1 else None
        c.check(rc == 0 and listed is not None and
                listed.group(1) == "step-000007",
                "unmarked: the start names the folder without a marker, once",
                d.log()[-2000:])
        c.check(os.path.isdir(left), "unmarked: the folder is left alone")


def main():
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-small-") as wd:
        restarts_and_resume(c, os.path.join(wd, "restarts"))
        ckpt_timeout(c, os.path.join(wd, "timeout"))
        marker_wait(c, os.path.join(wd, "marker"))
        symlink(c, os.path.join(wd, "symlink"))
        unmarked(c, os.path.join(wd, "unmarked"))
    c.finish()


if __name__ == "__main__":
    main()
