#!/usr/bin/python3
"""What real spotd processes record in the job history, and what `spotctl
history` makes of it, against the real S3 server.

Node 1's trainer (the Python helper: report_step() each step) commits one
checkpoint, trains on, and spotd is killed with SIGKILL (its trainer too):
no run_end, but its progress event in the store holds the step its
trainer reached. Node 2 restores and trains; node 3 starts meanwhile and
waits for the job lease node 2 holds (a phase of its own); node 4, started
with --no-lease-wait, is refused. Node 2 finishes, node 3 takes the lease
and finishes too.

`spotctl history --json` then counts 3 runs, 1 crash and 1 refused start
(not 2 crashes), the steps node 1 lost are its last progress step less
the step of the checkpoint node 2 restored (this test reads both from the
store and the trainer's own log), node 3 waited for the lease, and the
plot draws the lease wait in its own colour and marks the crash."""
import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

# Colours of client/spotctl.h (SPOTCTL_PLOT_*_RGB).
LEASE_RGB = (250, 205, 80)
CRASH_RGB = (110, 30, 130)

TRAINER = sl.srcdir_path("tests", "integration", "step_trainer.py")


def history_events(prefix):
    """Every event object under the job's history/, as boto3 reads it (a
    progress event spotd replaced between the list and the GET is gone)."""
    out = []
    for k in sl.s3_keys(prefix + "history/"):
        try:
            out.append(json.loads(sl.s3_get(k)))
        except Exception as e:  # noqa: BLE001 - NoSuchKey
            if "NoSuchKey" not in repr(e) and "404" not in repr(e):
                raise
    return out


def pixels(path, rgb):
    from PIL import Image
    im = Image.open(path).convert("RGB")
    return sum(1 for p in im.getdata() if p == rgb)


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("history")
    with tempfile.TemporaryDirectory(prefix="spotd-history-") as wd, \
            sl.cleaned_up(prefix):
        script = TRAINER
        log1 = os.path.join(wd, "events1.jsonl")
        cmd = [sl.PY3, script, sl.srcdir_path("python"), log1, "100000"]
        # A short lease, so node 2 need not wait long for a dead node's.
        lease = ["--lease-ttl", "6"]
        d1 = sl.Daemon(os.path.join(wd, "n1"), store, job, cmd=cmd,
                       args=lease + ["--metrics-interval", "200ms"])
        end = time.time() + 30
        while not sl.trainer_events(log1, "started") and time.time() < end:
            time.sleep(0.05)
        started = sl.trainer_events(log1, "started")
        c.check(started, "node 1's trainer runs")
        cp = d1.spotctl("checkpoint", "--wait", timeout=60)
        c.check(cp.returncode == 0, "node 1 commits a checkpoint",
                cp.stdout + cp.stderr)
        made = sl.trainer_events(log1, "checkpoint")
        saved = made[-1]["step"] if made else 0
        # Train on until a progress event well past that step is stored.
        progress = []
        end = time.time() + 60
        while time.time() < end:
            progress = [e["step"] for e in history_events(prefix)
                        if e.get("type") == "progress"]
            if progress and max(progress) >= saved + 100:
                break
            time.sleep(0.3)
        c.check(progress and max(progress) >= saved + 100,
                "node 1 records its trainer's progress past step %d" % saved,
                repr(progress))
        # kill -9: spotd writes nothing more; its trainer goes too.
        d1.p.kill()
        d1.wait_exit(30)
        if started:
            try:
                os.killpg(d1.trainer_pids()[0], signal.SIGKILL)
            except ProcessLookupError:
                pass
        evs = history_events(prefix)
        reached = max([e["step"] for e in evs if e.get("type") == "progress"]
                      or [0])
        trained = max([e["step"] for e in sl.trainer_events(log1, "step")]
                      or [0])
        c.check(not [e for e in evs if e.get("type") == "run_end"],
                "the killed node wrote no run_end")
        seen = [e["owner"] for e in evs if e.get("type") == "progress"]
        # the newest, the one before it and one a kill caught mid-write
        c.check(len(seen) <= 3,
                "spotd keeps its newest progress events, not one per report "
                "(%d in the store)" % len(seen))
        c.check(saved < reached <= trained,
                "its last progress (step %d) is past its checkpoint (%d) and "
                "no further than its trainer got (%d)" % (reached, saved,
                                                          trained))

        # Node 2 restores and trains until told to stop.
        log2 = os.path.join(wd, "events2.jsonl")
        stop2 = os.path.join(wd, "stop2")
        cmd2 = [sl.PY3, script, sl.srcdir_path("python"), log2, "100000",
                stop2]
        d2 = sl.Daemon(os.path.join(wd, "n2"), store, job, cmd=cmd2,
                       args=lease)
        end = time.time() + 60
        while not sl.trainer_events(log2, "started") and time.time() < end:
            time.sleep(0.05)
        s2 = sl.trainer_events(log2, "started")
        c.check(s2 and s2[0]["step"] == saved,
                "node 2 resumes from step %d" % saved, repr(s2))
        # Node 3 waits for node 2's lease; node 4 is refused at once.
        log3 = os.path.join(wd, "events3.jsonl")
        stop3 = os.path.join(wd, "stop3")
        with open(stop3, "w"):
            pass
        d3 = sl.Daemon(os.path.join(wd, "n3"), store, job,
                       cmd=[sl.PY3, script, sl.srcdir_path("python"), log3,
                            "100000", stop3], args=lease)
        c.check(d3.wait_log(r"waiting for the job lease", 30) is not None,
                "node 3 waits for the job lease node 2 holds")
        d4 = sl.Daemon(os.path.join(wd, "n4"), store, job,
                       cmd=[sl.PY3, "-c", "pass"],
                       args=lease + ["--no-lease-wait"])
        rc4 = d4.wait_exit(60)
        c.check(rc4 not in (0, None, -9), "node 4 is refused (exit %s)" % rc4)
        with open(stop2, "w"):
            pass
        rc2 = d2.wait_exit(120)
        c.check(rc2 == 0, "node 2 finishes", "rc=%s" % rc2)
        rc3 = d3.wait_exit(120)
        c.check(rc3 == 0 and sl.trainer_events(log3, "done"),
                "node 3 takes the lease and finishes", "rc=%s" % rc3)

        evs = history_events(prefix)
        ends = [e for e in evs if e.get("type") == "run_end"]
        c.check(sorted(e.get("outcome") for e in ends) ==
                ["exited", "exited", "refused"] and
                [e.get("reason") for e in ends
                 if e.get("outcome") == "refused"] == ["lease-held"],
                "node 4's run_end says refused, lease-held", repr(ends))
        leases = [e.get("action") for e in evs if e.get("type") == "lease"]
        c.check("waiting" in leases and "failed" in leases,
                "the lease wait and the refusal are in the history",
                repr(leases))

        cp = sl.spotctl("history", "%s/%s" % (store, job), "--json")
        j = json.loads(cp.stdout) if cp.returncode == 0 else {}
        s = j.get("summary", {})
        c.check(s.get("runs") == 3 and s.get("crashes") == 1 and
                s.get("refused") == 1 and s.get("preemptions") == 0,
                "history: 3 runs, 1 crash, 1 refused start",
                cp.stdout[:600] + cp.stderr)
        runs = j.get("runs", [])
        outcomes = [r.get("outcome") for r in runs]
        c.check(outcomes == ["crashed", "exited", "exited", "refused"],
                "history: node 1 crashed, nodes 2 and 3 exited, node 4 "
                "refused", repr(outcomes))
        lost = runs[0].get("lost_steps") if runs else None
        c.check(lost == reached - saved and s.get("lost_steps") == lost,
                "history: the crash lost %d steps (last progress %d - "
                "restored %d)" % (reached - saved, reached, saved),
                repr((lost, s.get("lost_steps"))))
        c.check(runs and runs[0].get("lost_s", -1) > 0,
                "history: the crash lost some time", repr(runs[:1]))
        waited = [r.get("lease_wait_s") for r in runs[2:3]]
        c.check(waited and waited[0] > 0 and s.get("lease_wait_s", 0) > 0,
                "history: node 3's lease wait is counted", repr(waited))
        c.check(s.get("train_s", 0) <= s.get("wall_s", -1),
                "history: training is within the wall time", repr(s))
        cp = sl.spotctl("history", "%s/%s" % (store, job))
        c.check(cp.returncode == 0 and "3 runs, 0 preemptions, 1 crash, 1 "
                "refused start" in cp.stdout and "lease-held" in cp.stdout,
                "the table's headline and the refusal", cp.stdout + cp.stderr)
        png = os.path.join(wd, "timeline.png")
        cp = sl.spotctl("history", "%s/%s" % (store, job), "--plot", png)
        c.check(cp.returncode == 0, "--plot", cp.stderr)
        if os.path.exists(png):
            c.check(pixels(png, LEASE_RGB) > 12 * 12,
                    "the plot draws the lease wait in its own colour")
            c.check(pixels(png, CRASH_RGB) > 12 * 12,
                    "the plot marks the crash")
    c.finish()


if __name__ == "__main__":
    main()
