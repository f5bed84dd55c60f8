#!/usr/bin/python3
"""A real spotd run's metrics and job history, against the real S3 server.

A trainer on the Python helper (python/spotd: report_step() each step,
checkpoint() on the signal) runs under spotd with --metrics-file and a
relaunch hook. Two `spotctl checkpoint --wait`, then an AWS spot notice:
`spotctl metrics` and the metrics file parse with prometheus_client, every
sample carries job and rank labels (no stray unlabelled sample), and
their counters match the run (checkpoints by reason and outcome, bytes
from spotd's own commit lines, notices, relaunches, durations); the file
is replaced atomically (a new inode each time, no temporary left). Then a
second spotd restores and the trainer finishes: `spotctl history --json`
shows 2 runs, 1 preemption, the commits, the relaunch, the steps the
trainer reported, and no lost work (the final checkpoint committed)."""
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("FAIL: python3-prometheus-client is not installed (tools/deps.sh test)")
    sys.exit(1)

TRAINER = sl.srcdir_path("tests", "integration", "step_trainer.py")


def parse(text):
    """{(name, labels tuple): value} of every sample."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# spotd's own labels on every sample (set in main()).
COMMON = {}


def val(m, name, **labels):
    labels.update(COMMON)
    return m.get((name, tuple(sorted(labels.items()))))


def unlabelled(m):
    """Samples without the job and rank labels, and labelled counters'
    samples with nothing but them (a stray 0 sample)."""
    own = {"spotd_checkpoints_total", "spotd_uploaded_bytes_total",
           "spotd_notices_total", "spotd_relaunches_total"}
    return [k for k in m if any((kv not in k[1]) for kv in COMMON.items()) or
            (k[0] in own and len(k[1]) == len(COMMON))]


def commits(d):
    """(name, raw, stored) of spotd's 'committed checkpoint' lines."""
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in
            (re.search(r"committed checkpoint name=(\S+) files=\d+ raw=(\d+) "
                       r"stored=(\d+)", l) for l in d.err.text().splitlines())
            if m]


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("metrics")
    COMMON.update(job=job, rank="0")
    emu = sl.EmulatorProc("aws")
    with tempfile.TemporaryDirectory(prefix="spotd-metrics-") as wd, \
            sl.cleaned_up(prefix, emu.stop):
        script = TRAINER
        log = os.path.join(wd, "events.jsonl")
        mdir = os.path.join(wd, "textfile")
        os.makedirs(mdir)
        mfile = os.path.join(mdir, "spotd.prom")
        hook, hook_out = sl.relaunch_hook(wd)
        cmd = [sl.PY3, script, sl.srcdir_path("python"), log, "100000"]
        d = sl.Daemon(os.path.join(wd, "n1"), store, job, cmd=cmd,
                      provider="aws", metadata_url=emu.url,
                      args=["--relaunch", hook, "--metrics-file", mfile,
                            "--metrics-interval", "500ms"])
        end = time.time() + 20
        while not sl.trainer_events(log, "started") and time.time() < end:
            time.sleep(0.05)
        c.check(sl.trainer_events(log, "started"), "the trainer runs")
        for _ in range(2):
            cp = d.spotctl("checkpoint", "--wait", timeout=60)
            c.check(cp.returncode == 0, "spotctl checkpoint --wait",
                    cp.stdout + cp.stderr)
        cp = d.spotctl("metrics")
        c.check(cp.returncode == 0 and "# TYPE spotd_checkpoints_total counter"
                in cp.stdout, "spotctl metrics prints the text format",
                cp.stdout[:300] + cp.stderr)
        m = parse(cp.stdout) if cp.returncode == 0 else {}
        c.check(m and not unlabelled(m), "every sample has job=%s and rank=0, "
                "no stray unlabelled sample" % job, repr(unlabelled(m))[:600])
        c.check(not [k for k in m if k[0] == "spotd_notices_total"],
                "no notices_total sample before a notice", cp.stdout[:600])
        got = commits(d)
        c.check(len(got) == 2, "spotd committed 2 checkpoints", repr(got))
        c.check(val(m, "spotd_checkpoints_total", reason="manual",
                    outcome="committed") == 2,
                "checkpoints_total{manual,committed} = 2", cp.stdout[:600])
        c.check(val(m, "spotd_uploaded_bytes_total", kind="raw") ==
                sum(g[1] for g in got) and
                val(m, "spotd_uploaded_bytes_total", kind="stored") ==
                sum(g[2] for g in got),
                "uploaded bytes (raw, stored) = the sums of spotd's commit "
                "lines", repr(got))
        c.check(val(m, "spotd_checkpoint_save_seconds_count") == 2 and
                val(m, "spotd_checkpoint_upload_seconds_count") == 2,
                "save and upload histograms have 2 observations each")
        last = val(m, "spotd_last_commit_timestamp_seconds") or 0
        c.check(abs(last - time.time()) < 30, "last commit time is now",
                repr(last))
        risk = val(m, "spotd_work_at_risk_seconds")
        c.check(risk is not None and 0 <= risk < 30, "work at risk %r s" % risk)

        # The file: rewritten by rename (a new inode), nothing left over.
        ino = []
        for _ in range(30):
            try:
                st = os.stat(mfile)
                if not ino or ino[-1] != st.st_ino:
                    ino.append(st.st_ino)
            except FileNotFoundError:
                pass
            if len(ino) >= 3:
                break
            time.sleep(0.2)
        c.check(len(ino) >= 3, "the metrics file is replaced (inodes %s)" % ino)
        c.check(os.listdir(mdir) == ["spotd.prom"],
                "only spotd.prom in its folder", repr(os.listdir(mdir)))

        emu.control("notice", deadline=30)
        rc = d.wait_exit(60)
        c.check(rc == 75, "spotd exits 75 after the notice", "rc=%s" % rc)
        with open(mfile) as f:
            m = parse(f.read())
        c.check(m and not unlabelled(m), "metrics file at exit: every sample "
                "has the job and rank", repr(unlabelled(m))[:600])
        c.check(val(m, "spotd_notices_total", kind="aws-spot-terminate") == 1,
                "metrics file at exit: notices_total{aws-spot-terminate} = 1")
        c.check(val(m, "spotd_checkpoints_total", reason="notice",
                    outcome="committed") == 1 and
                val(m, "spotd_checkpoints_total", reason="manual",
                    outcome="committed") == 2,
                "metrics file at exit: 1 notice + 2 manual checkpoints "
                "committed")
        c.check(val(m, "spotd_relaunches_total", outcome="ok") == 1 and
                len(sl.read_jsonl(hook_out)) == 1,
                "metrics file at exit: relaunches_total{ok} = 1")
        c.check(os.listdir(mdir) == ["spotd.prom"], "no temporary file left")

        # Second node: restore, finish.
        made = sl.trainer_events(log, "checkpoint")
        target = (made[-1]["step"] if made else 0) + 20
        cmd[-1] = str(target)
        d2 = sl.Daemon(os.path.join(wd, "n2"), store, job, cmd=cmd)
        rc = d2.wait_exit(60)
        c.check(rc == 0, "node 2 finishes", "rc=%s" % rc)
        cp = sl.spotctl("history", "%s/%s" % (store, job), "--json")
        j = json.loads(cp.stdout) if cp.returncode == 0 else {}
        s = j.get("summary", {})
        c.check(s.get("runs") == 2 and s.get("preemptions") == 1 and
                s.get("crashes") == 0 and s.get("notices") == 1 and
                s.get("relaunches") == 1,
                "history: 2 runs, 1 preemption, 1 notice, 1 relaunch",
                cp.stdout[:500] + cp.stderr)
        made = sl.trainer_events(log, "checkpoint")
        c.check(s.get("commits") == len(made) == 4,
                "history: %d commits = the trainer's checkpoints" % len(made),
                repr(s))
        c.check(s.get("lost_s") == 0 and s.get("lost_steps") == 0,
                "history: no work lost (the final checkpoint committed)",
                repr(s))
        evs = j.get("events", [])
        steps = [e.get("step") for e in evs if e.get("type") == "checkpoint"]
        c.check(steps == [e["step"] for e in made],
                "history: each checkpoint carries the step it saved %s" %
                steps, repr([e["step"] for e in made]))
        leases = [(e.get("action"), e.get("epoch")) for e in evs
                  if e.get("type") == "lease"]
        c.check(leases == [("held", 1), ("released", 1), ("held", 2),
                           ("released", 2)],
                "history: each node held the lease, then released it, the "
                "second with the next epoch %s" % leases)
        runs = j.get("runs", [])
        c.check([r.get("outcome") for r in runs] == ["preempted", "exited"] and
                runs[1].get("restored") == made[2]["name"] and
                runs[0].get("host"),
                "history: preempted then exited, run 2 restored %s" %
                (made[2]["name"] if len(made) > 2 else "?"), repr(runs)[:600])
    c.finish()


if __name__ == "__main__":
    main()
