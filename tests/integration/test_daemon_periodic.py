"""spotd: periodic checkpoints (--interval) and the trainer's own ones are
uploaded in the background and committed (manifest, LATEST), local copies
older than the newest commit are removed, and a trainer that exits 0 ends
spotd with 0 after its last upload."""
import os
import random
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def periodic(c, wd):
    store, job, prefix = sl.daemon_job("periodic")
    with sl.cleaned_up(prefix):
        d = sl.Daemon(os.path.join(wd, "a"), store, job, interval=1,
                      trainer=["--exit-at", 70, "--step-sleep", 0.05])
        rc = d.wait_exit(60)
        c.check(rc == 0, "periodic: spotd exits 0 after the trainer's exit 0",
                "rc=%s" % rc)
        tpid = (d.events("start") or [{"pid": -1}])[0]["pid"]
        c.check(d.out.matching(r"^fake_trainer: stdout pid %d$" % tpid) and
                d.err.matching(r"^fake_trainer: stderr pid %d$" % tpid),
                "periodic: the trainer's stdout and stderr are forwarded")
        asked = d.err.matching(r"checkpoint requested \(interval\)")
        c.check(len(asked) >= 2, "periodic: the interval timer signalled the "
                "trainer (%d times)" % len(asked))
        made = [e["name"] for e in d.events("checkpoint")]
        c.check(len(made) >= 2 and all(e["why"] == "signal"
                                       for e in d.events("checkpoint")),
                "periodic: the trainer checkpointed on the signal: %s" % made)
        commits = re.findall(r"committed checkpoint name=(\S+)", d.log())
        c.check(len(commits) >= 2, "periodic: commits logged: %s" % commits)
        names = sl.committed(prefix)
        c.check(names and names[-1] == made[-1],
                "periodic: manifests in the store for %s" % names,
                "made %s" % made)
        c.check(sl.latest(prefix) == made[-1],
                "periodic: LATEST names the newest checkpoint %s" % made[-1],
                "LATEST=%r" % sl.latest(prefix))
        # the pending upload was finished before the exit
        i_exit = d.err.wait(r"trainer pid=\d+ exited with status 0", 0)[0]
        i_last = d.err.wait(r"committed checkpoint name=" + made[-1], 0)[0]
        i_end = d.err.wait(r"state \S+ -> exiting", 0)[0]
        c.check(None not in (i_exit, i_last, i_end) and i_last < i_end,
                "periodic: the last upload finished before spotd exited")
        local = sorted(n for n in os.listdir(d.ckpt_dir) if not n.startswith("."))
        c.check(local == [made[-1]],
                "periodic: local copies older than the newest commit removed",
                "left: %s" % local)
        cp = sl.spotctl("list", "%s/%s" % (store, job), timeout=60)
        c.check(cp.returncode == 0 and made[-1] in cp.stdout,
                "periodic: spotctl list shows %s" % made[-1],
                cp.stdout + cp.stderr)
        out = os.path.join(wd, "restored")
        cp = sl.spotctl("restore", "%s/%s" % (store, job), out, timeout=60)
        ok, why = (False, cp.stderr)
        if cp.returncode == 0:
            # the marker stays local: the manifest is the store's marker
            expect = os.path.join(wd, "expect")
            shutil.copytree(os.path.join(d.ckpt_dir, made[-1]), expect)
            os.unlink(os.path.join(expect, "SPOTD_COMPLETE"))
            ok, why = sl.same_tree(out, expect)
        c.check(ok, "periodic: the committed checkpoint restores "
                "byte-identical (without the local SPOTD_COMPLETE)", why)


def own_schedule(c, wd):
    """No interval: checkpoints the trainer makes by itself go up too."""
    store, job, prefix = sl.daemon_job("own")
    with sl.cleaned_up(prefix):
        d = sl.Daemon(os.path.join(wd, "b"), store, job, interval=0,
                      trainer=["--every", 15, "--exit-at", 50,
                               "--step-sleep", 0.04])
        rc = d.wait_exit(60)
        c.check(rc == 0, "own: spotd exits 0", "rc=%s" % rc)
        c.check(not d.err.matching(r"checkpoint requested"),
                "own: no signal without --interval or a notice")
        made = [e["name"] for e in d.events("checkpoint")]
        c.check(made == ["step-000015", "step-000030", "step-000045"],
                "own: the trainer made its own checkpoints: %s" % made)
        names = sl.committed(prefix)
        # an older waiting checkpoint may be superseded by a newer one, but
        # the newest is always committed
        c.check("step-000045" in names and set(names) <= set(made),
                "own: committed %s" % names)
        c.check(sl.latest(prefix) == "step-000045",
                "own: LATEST is step-000045", "LATEST=%r" % sl.latest(prefix))


def supersede(c, wd):
    """Checkpoints faster than uploads: one upload at a time, the newest
    waiting checkpoint supersedes older waiting ones (never uploaded),
    retention keeps --keep 2 in the store, the newest is committed."""
    tag = "supersede: "
    store, job, prefix = sl.daemon_job("supersede")
    with sl.cleaned_up(prefix):
        d = sl.Daemon(os.path.join(wd, "c"), store, job, interval=0,
                      args=["--keep", 2],
                      trainer=["--every", 1, "--exit-at", 16, "--random",
                               "--bytes", 12 << 20, "--step-sleep", 0.02])
        rc = d.wait_exit(90)
        c.check(rc == 0, tag + "spotd exits 0", "rc=%s" % rc)
        made = [e["name"] for e in d.events("checkpoint")]
        c.check(len(made) == 16, tag + "16 checkpoints made (%d)" % len(made))
        inflight, worst, uploaded = 0, 0, []
        for line in d.log().splitlines():
            m = re.search(r"uploading checkpoint (\S+)", line)
            if m:
                inflight += 1
                uploaded.append(m.group(1))
            if re.search(r"committed checkpoint name=|upload of \S+ "
                         r"(cancelled|failed)", line):
                inflight -= 1
            worst = max(worst, inflight)
        c.check(worst == 1, tag + "at most one upload at a time (%d)" % worst)
        sup = re.findall(r"checkpoint (\S+) supersedes (\S+), which waited",
                         d.log())
        c.check(len(sup) >= 1, tag + "newer checkpoints superseded waiting "
                "ones (%d times)" % len(sup))
        c.check(not any(old in uploaded for _, old in sup),
                tag + "a superseded checkpoint is never uploaded")
        c.check(made and uploaded and uploaded[-1] == made[-1] and
                sl.latest(prefix) == made[-1],
                tag + "the newest %s is committed and LATEST" %
                (made[-1] if made else "?"))
        names = sl.committed(prefix)
        c.check(len(names) == 2 and made and names[-1] == made[-1],
                tag + "retention keeps 2 in the store: %s" % names)
        c.check(sorted(n for n in os.listdir(d.ckpt_dir)
                       if not n.startswith(".")) == made[-1:],
                tag + "only the newest stays local",
                repr(sorted(os.listdir(d.ckpt_dir))))


def scan_order(c, wd):
    """Several folders complete when one scan finds them (a loaded machine
    between two scans; here: before spotd starts), in readdir's order: the
    newest by its marker's mtime is committed, not the one readdir lists
    last, and an older one found after a newer one is never uploaded.
    The names are shuffled against the completion order, and each folder
    is made in completion order (tmpfs lists the newest first). The names
    state no step (save-a...), so the completion order alone ranks them;
    a name that states one is ranked by it (test_commit_order)."""
    tag = "scan order: "
    store, job, prefix = sl.daemon_job("scanorder")
    work = os.path.join(wd, "s")
    names = ["save-%s" % ch for ch in "abcdef"]
    random.shuffle(names)  # names[k] completed k-th
    now = time.time()
    for k, n in enumerate(names):
        path = os.path.join(work, "ckpt", n)
        os.makedirs(path)
        with open(os.path.join(path, "step"), "w") as f:
            f.write("%d\n" % (100 + k))
        marker = os.path.join(path, "SPOTD_COMPLETE")
        open(marker, "w").close()
        os.utime(marker, (now - 60 + k, now - 60 + k))
    newest = names[-1]
    with sl.cleaned_up(prefix):
        d = sl.Daemon(work, store, job, interval=0,
                      trainer=["--exit-at", 40, "--step-sleep", 0.05])
        rc = d.wait_exit(60)
        c.check(rc == 0, tag + "spotd exits 0", "rc=%s" % rc)
        uploaded = re.findall(r"uploading checkpoint (\S+)", d.log())
        c.check(sl.latest(prefix) == newest,
                tag + "LATEST is %s, the newest of %s (in completion order)" %
                (newest, names), "LATEST=%r, uploaded %r" %
                (sl.latest(prefix), uploaded))
        c.check(uploaded and uploaded[-1] == newest and
                all(names.index(a) < names.index(b)
                    for a, b in zip(uploaded, uploaded[1:])),
                tag + "uploads in completion order, the newest last: %r" %
                uploaded)


def main():
    sl.daemon_env()
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-periodic-") as wd:
        periodic(c, wd)
        own_schedule(c, wd)
        supersede(c, wd)
        scan_order(c, wd)
    c.finish()


if __name__ == "__main__":
    main()
