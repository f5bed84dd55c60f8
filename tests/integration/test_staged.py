"""Staged saves (spotd.StagedSaver) under the real spotd, against the real
Ceph (staged_trainer.py: a small model and Adam on CPU, one `spotd run
--max-restarts 1`):

1. `spotctl checkpoint --wait`: the trainer stages its state and trains
   on at once (the optimizer changes the tensors in place while the
   persist, slowed by the trainer's writer, runs); the checkpoint is
   committed: LATEST names it.
2. A second request, whose persist the trainer's writer holds after
   writing the file (before the marker): kill -9 of the trainer there.
   The folder has its file and no SPOTD_COMPLETE, LATEST still names the
   first checkpoint, and spotd starts the trainer again from it.
3. The restored state equals the state at stage() time (its hash), which
   differs from the state after the next step: the snapshot was a copy;
   every step after the resume equals the first run's same step, bit for
   bit (the hash of model, optimizer and RNG after each step).
4. A request while a staged save is persisting (the resumed trainer
   staged one of its own, held by its writer): the trainer stages
   nothing more ("answered"), and once that save is written it is the
   checkpoint that serves the request: `spotctl checkpoint --wait`
   returns 0 and LATEST names it.
5. The resumed trainer ends on its own after 25 steps: spotd exits 0.
6. kill -9 of spotd during a background persist: a new `spotd run` on the
   same node resumes, stages a save of its own that the writer holds
   (file written, no marker), and spotd is SIGKILLed there. The trainer
   dies with it (its pid namespace ends with spotd's guard); the folder
   holds its file and no SPOTD_COMPLETE; LATEST still names the step 4
   checkpoint; a `spotd run` started again on that node restores that
   one, never uploads the unmarked folder, and exits 0.
Skips without the test S3 server or without torch."""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "staged_trainer.py")
STEPS = 100000  # the first run never ends by itself


def main():
    sl.daemon_env()
    if subprocess.run([sl.PY3, "-c", "import torch"],
                      capture_output=True).returncode != 0:
        sl.skip("/usr/bin/python3 has no torch")
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("staged")
    wd = tempfile.mkdtemp(prefix="spot-staged-")
    node = os.path.join(wd, "node")
    hang = os.path.join(wd, "hang")
    log = os.path.join(wd, "trainer.log")
    env = {"PYTHONPATH": sl.srcdir_path("python"), "T_SLOW": "0.3",
           "T_HANG": hang, "T_PAUSE": "0.03",
           "T_RESUMED_STEPS": "25", "T_SELF_AT": "5"}
    d = sl.Daemon(node, store, job, cmd=[sl.PY3, TRAINER, log, str(STEPS)],
                  args=["--max-restarts", 1, "--restart-backoff", "200ms"],
                  env=env)
    d.trainer_log = log
    with sl.cleaned_up(prefix):
        c.check(d.wait_event("start", 60) is not None, "the trainer started")
        cp = d.spotctl("checkpoint", "--wait", timeout=120)
        c.check(cp.returncode == 0, "spotctl checkpoint --wait",
                cp.stdout + cp.stderr)
        first = d.wait_event("staged", 10)
        c.check(first is not None and sl.latest(prefix) == first["name"],
                "1: the staged checkpoint is committed: LATEST names it",
                "staged=%r LATEST=%r" % (first, sl.latest(prefix)))
        if first is None:
            c.finish()
        n = first["step"]
        after = d.wait_event("step", 10, lambda e: e["step"] == n + 1)
        c.check(after is not None and after["hash"] != first["hash"],
                "1: the tensors changed in place right after stage()",
                repr(after))

        with open(hang, "w"):
            pass
        cp = d.spotctl("checkpoint", timeout=60)
        w = d.wait_event("writing", 60)
        c.check(w is not None, "2: a second staged save is persisting "
                "(held by the trainer's writer)", repr(w))
        if w is None:
            c.finish()
        part = os.path.join(d.ckpt_dir, w["folder"])
        pid = d.host_pid(w["pid"])  # its pid in its namespace: the host's
        c.check(pid is not None, "2: the trainer's pid", repr(w))
        if pid:
            os.kill(pid, signal.SIGKILL)
        st = d.wait_event("start", 60, lambda e: e["resume"] is not None)
        c.check(st is not None and st["resume"] == first["name"],
                "2: spotd starts the trainer again from %s" % first["name"],
                repr(st))
        files = sorted(os.listdir(part)) if os.path.isdir(part) else None
        c.check(files == ["state.pt"], "2: the folder killed in its persist "
                "(%s) holds its file and no SPOTD_COMPLETE" % w["folder"],
                repr(files))
        c.check(sl.latest(prefix) == first["name"],
                "2: LATEST still names %s" % first["name"],
                repr(sl.latest(prefix)))
        c.check(st is not None and st.get("hash") == first["hash"],
                "3: the restored state equals the state at stage() time",
                "%r vs %r" % (st and st.get("hash"), first["hash"]))

        # 4: the resumed run's own staged save, held while a request comes.
        run2 = st["run"] if st else None
        own = d.wait_event("writing", 60, lambda e: e["run"] == run2)
        c.check(own is not None and own["step"] == n + 5,
                "4: the resumed trainer's own staged save (step %d) is "
                "persisting" % (n + 5), repr(own))
        ask = sl.spotctl_popen("checkpoint", "--socket", d.socket, "--wait",
                               stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        ans = d.wait_event("answered", 60, lambda e: e["run"] == run2)
        c.check(ans is not None and own is not None and
                ans["by"] == own["folder"],
                "4: a request during that persist: the trainer stages "
                "nothing more, the save in flight answers it", repr(ans))
        os.unlink(hang)
        try:
            out, err = ask.communicate(timeout=120)
            arc = ask.returncode
        except subprocess.TimeoutExpired:
            ask.kill()
            out, err = ask.communicate()
            arc = None
        c.check(arc == 0 and own is not None and
                sl.latest(prefix) == own["folder"],
                "4: once written it serves the request: spotctl checkpoint "
                "--wait returns 0, LATEST names %s" % (own and own["folder"]),
                "rc=%r latest=%r %s%s" % (arc, sl.latest(prefix), out, err))
        staged2 = [e for e in d.events("staged") if e["run"] == run2]
        c.check(len(staged2) == 1, "4: the resumed trainer staged one save",
                repr(staged2))

        rc = d.wait_exit(120)
        c.check(rc == 0, "5: the trainer ends on its own, spotd exits 0",
                "rc=%r" % rc)
        runs = {}
        for e in d.events("step"):
            runs.setdefault(e["run"], {})[e["step"]] = e["hash"]
        pids = list(runs)
        same = []
        if len(pids) == 2:
            a, b = runs[pids[0]], runs[pids[1]]
            same = [s for s in sorted(b) if s in a]
            diff = [s for s in same if a[s] != b[s]]
        c.check(len(pids) == 2 and len(same) >= 3 and not diff and
                min(same) == n + 1,
                "3: every step after the resume equals the first run's "
                "(%d steps compared)" % len(same),
                "runs=%d same=%r" % (len(pids), same[:5]))
        if own is not None:
            spotd_killed(c, store, job, prefix, wd, node, own["folder"])
    c.finish()


def spotd_killed(c, store, job, prefix, wd, node, prev):
    """6: kill -9 of spotd while its trainer's staged save persists."""
    hang = os.path.join(wd, "hang6")
    with open(hang, "w"):
        pass
    log = os.path.join(wd, "trainer6.log")
    d = sl.Daemon(node, store, job, cmd=[sl.PY3, TRAINER, log, str(STEPS)],
                  env={"PYTHONPATH": sl.srcdir_path("python"),
                       "T_HANG": hang, "T_PAUSE": "0.03", "T_SLOW": "0",
                       "T_RESUMED_STEPS": "", "T_SELF_AT": "3"})
    d.trainer_log = log
    w = d.wait_event("writing", 120)
    c.check(w is not None, "6: a new spotd run resumed and its staged save "
            "is persisting (held by the writer)", repr(w))
    if w is None:
        d.send(signal.SIGKILL)
        d.wait_exit(30)
        return
    pid = d.host_pid(w["pid"])
    d.send(signal.SIGKILL)
    rc = d.wait_exit(30)
    c.check(rc == -signal.SIGKILL, "6: spotd killed with SIGKILL", repr(rc))
    gone = False
    for _ in range(600):  # the guard's end takes the trainer with it
        gone = bool(pid) and sl.pid_gone(pid)
        if gone:
            break
        time.sleep(0.05)
    c.check(gone, "6: the trainer (pid %s) ended with spotd" % pid)
    part = os.path.join(d.ckpt_dir, w["folder"])
    files = sorted(os.listdir(part)) if os.path.isdir(part) else None
    c.check(files == ["state.pt"], "6: the folder whose persist spotd's "
            "kill cut (%s) holds its file and no SPOTD_COMPLETE"
            % w["folder"], repr(files))
    c.check(sl.latest(prefix) == prev, "6: LATEST still names %s" % prev,
            repr(sl.latest(prefix)))
    os.unlink(hang)
    log = os.path.join(wd, "trainer7.log")
    d = sl.Daemon(node, store, job, cmd=[sl.PY3, TRAINER, log, str(STEPS)],
                  env={"PYTHONPATH": sl.srcdir_path("python"),
                       "T_PAUSE": "0.03", "T_HANG": "", "T_SELF_AT": "",
                       "T_RESUMED_STEPS": "3"})
    d.trainer_log = log
    st = d.wait_event("start", 120)
    rc = d.wait_exit(120)
    c.check(st is not None and st["resume"] == prev and rc == 0,
            "6: spotd started again on the node restores %s and exits 0"
            % prev, "start=%r rc=%r" % (st, rc))
    c.check(w["folder"] not in sl.committed(prefix) and
            sl.latest(prefix) == prev,
            "6: the unmarked folder %s was never uploaded" % w["folder"],
            "committed=%r LATEST=%r" % (sl.committed(prefix),
                                        sl.latest(prefix)))


if __name__ == "__main__":
    main()
