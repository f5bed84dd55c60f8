"""A trainer that ignores the checkpoint signal: after a notice with a
short deadline spotd gives up before the deadline, keeps the previous
committed checkpoint (LATEST unchanged, nothing new committed), says so
in the log and in `spotctl status` (queried while it runs), runs the
relaunch step with that checkpoint, SIGKILLs the trainer (which also
ignores SIGTERM) before the deadline, and exits 75."""
import datetime
import os
import re
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

DEADLINE = 8


def poll_status(d, out, stop):
    while not stop.is_set() and d.running():
        cp = d.spotctl("status", "--json", timeout=10)
        if cp.returncode == 0:
            import json
            out.append((time.time(), json.loads(cp.stdout)))
        time.sleep(0.15)


def estimate(c, wd):
    """The deadline-aware estimate: the last checkpoint took ~8 s to save,
    so a notice with <= 6 s left is said at once not to fit; the save then
    indeed misses the deadline and the previous commit is kept."""
    tag = "estimate: "
    store, job, prefix = sl.daemon_job("estimate")
    emu = sl.EmulatorProc("aws")
    with sl.cleaned_up(prefix, emu.stop):
        d = sl.Daemon(wd, store, job, provider="aws", metadata_url=emu.url,
                      interval=1, grace=30,
                      trainer=["--save-delay", 8, "--step-sleep", 0.05])
        line = d.wait_log(r"committed checkpoint name=", 30)
        first = sl.latest(prefix)
        c.check(line is not None and first is not None,
                tag + "a first (slow) checkpoint %s is committed" % first)
        t_notice = time.time()
        emu.control("notice", deadline=6)
        w = d.wait_log(r"the final checkpoint needs about [0-9.]+ s but the "
                       r"deadline is in [0-9.]+ s", 10)
        c.check(w is not None and time.time() - t_notice < 5,
                tag + "said at once: %s" % (w or "").split("warning: ")[-1])
        st = d.status()
        c.check(st is not None and any("needs about" in x
                                       for x in st.get("warnings", [])),
                tag + "status shows the estimate warning",
                repr(st and st.get("warnings")))
        rc = d.wait_exit(30)
        c.check(rc == 75, tag + "exit 75", "rc=%s" % rc)
        # The deadline was said at once to be too short, and spotd gave up
        # before it. On a loaded machine the trainer's periodic save (begun
        # before the notice) may end just before spotd gives up, with its
        # commit on the wire, or just after, and be committed while spotd
        # stops: whatever happened, what spotd says last is what the store
        # holds.
        now = sl.latest(prefix)
        gave_up = d.err.matching(r"is kept|the commit of \S+ was under way")
        cut = d.err.matching(r"the commit of (\S+) was under way and may "
                             r"be written")
        last = d.err.matching(r"the job resumes from (?:it if LATEST names "
                              r"it, else from )?(step-\d+)")
        said = re.search(r"resumes from (?:it if LATEST names it, else "
                         r"from )?(step-\d+)", last[-1]).group(1) \
            if last else None
        if cut:
            name = re.search(r"the commit of (\S+) was under way",
                             cut[0]).group(1)
            c.check(now in (first, name) and
                    d.err.matching(r"preempted while the final checkpoint "
                                   r"%s was being committed" % name),
                    tag + "the deadline cut the commit of %s: LATEST is %s "
                    "or %s, and the last line says so" % (name, name, first),
                    "LATEST=%r" % now)
        else:
            later = now != first and d.err.matching(
                r"committed checkpoint name=%s " % now)
            c.check(bool(gave_up) and now == said and
                    (now == first or bool(later)),
                    tag + "the deadline passed: spotd said %s is kept, and "
                    "LATEST is %s (%s), as its last line says" %
                    (first, now, "unchanged" if now == first else
                     "a save that ended after it gave up, committed before "
                     "it exited"),
                    "LATEST=%r said=%r" % (now, said))


def main():
    sl.daemon_env()
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-estimate-") as wd:
        estimate(c, wd)
    store, job, prefix = sl.daemon_job("deadline")
    emu = sl.EmulatorProc("aws")
    stop = threading.Event()
    try:
        with tempfile.TemporaryDirectory(prefix="spotd-deadline-") as wd:
            d0 = sl.Daemon(os.path.join(wd, "seed"), store, job,
                           trainer=["--every", 5, "--exit-at", 5,
                                    "--step-sleep", 0.02])
            c.check(d0.wait_exit(60) == 0 and
                    sl.latest(prefix) == "step-000005",
                    "a first run commits step-000005")
            before = sl.committed(prefix)

            hook, hook_out = sl.relaunch_hook(wd)
            d = sl.Daemon(os.path.join(wd, "run"), store, job, provider="aws",
                          metadata_url=emu.url, grace=30,
                          args=["--relaunch", hook],
                          trainer=["--ignore-signal", "--ignore-term",
                                   "--step-sleep", 0.05])
            c.check(d.wait_event("start", 30) is not None and
                    d.wait_log(r"state \S+ -> running", 10) is not None,
                    "the trainer runs (resumed from step-000005)")
            statuses = []
            poller = threading.Thread(target=poll_status,
                                      args=(d, statuses, stop), daemon=True)
            poller.start()
            t_notice = time.time()
            emu.control("notice", deadline=DEADLINE)
            rc = d.wait_exit(DEADLINE + 30)
            t_exit = time.time()
            stop.set()
            poller.join(15)
            c.check(rc == 75, "spotd exits 75", "rc=%s" % rc)
            c.check(t_exit - t_notice < DEADLINE + 3,
                    "spotd ended %.1f s after the notice (deadline %d s)" %
                    (t_exit - t_notice, DEADLINE))
            c.check(not d.events("checkpoint") and d.events("step"),
                    "the trainer ignored the signal and made no checkpoint")
            # (no upload ever started: the line says the checkpoint is
            # missing, not that an upload could not finish)
            c.check(d.err.matching(
                r"did not complete a final checkpoint before the deadline: "
                r"the last committed checkpoint \(step-000005\) is kept") and
                not d.err.matching(r"upload could not finish"),
                "the log says the deadline passed and step-000005 is kept")
            c.check(sl.latest(prefix) == "step-000005" and
                    sl.committed(prefix) == before,
                    "LATEST unchanged and nothing new committed",
                    "LATEST=%r committed=%r" % (sl.latest(prefix),
                                               sl.committed(prefix)))
            c.check(not d.err.matching(r"committed checkpoint name="),
                    "no commit logged by the second run")
            # status while it ran: draining with the notice, then the warning
            draining = [s for _, s in statuses if s.get("state") == "draining"]
            c.check(len(draining) > 0 and all(
                s.get("notice", {}).get("kind") == "aws-spot-terminate"
                for s in draining),
                "status: draining, notice aws-spot-terminate (%d samples)" %
                len(draining))
            left = [s["notice"].get("seconds_left") for s in draining
                    if "notice" in s]
            c.check(left and 0 <= min(left) <= max(left) <= DEADLINE,
                    "status: seconds left count down: %s" % left[:3])
            c.check(all(s.get("last_commit", {}).get("name") == "step-000005"
                        for _, s in statuses),
                    "status: last commit is step-000005 throughout")
            warned = [s for _, s in statuses
                      if any("is kept" in w for w in s.get("warnings", []))]
            c.check(len(warned) > 0,
                    "status: a warning says the last commit is kept",
                    repr(statuses[-1][1] if statuses else None))
            runs = sl.read_jsonl(hook_out)
            c.check(len(runs) == 1 and
                    runs[0].get("SPOTD_CHECKPOINT") == "step-000005",
                    "the relaunch step ran with SPOTD_CHECKPOINT=step-000005",
                    repr(runs))
            dl = None
            if runs:
                dl = datetime.datetime.fromisoformat(
                    runs[0]["SPOTD_DEADLINE"].replace("Z", "+00:00")).timestamp()
            t_kill = d.err.time_of(r"still running after the grace period: "
                                   r"SIGKILL")
            c.check(t_kill is not None and dl is not None and t_kill < dl,
                    "the trainer (ignoring SIGTERM) was SIGKILLed before the "
                    "deadline", "kill=%r deadline=%r" % (t_kill, dl))
    finally:
        stop.set()
        emu.stop()
        sl.kill_started()
        sl.s3_cleanup(prefix)
    c.finish()


if __name__ == "__main__":
    main()
