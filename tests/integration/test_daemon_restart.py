"""--max-restarts: a trainer that fails on its own is started again in
place from the newest committed checkpoint.

The trainer (fake_trainer.py behind a small wrapper) checkpoints every 10
steps and, by its SPOTD_RESTART_COUNT, crashes at step 25 (count 0), at
step 45 (count 1), and exits 0 at step 60 (count 2). So:
  - --max-restarts 2: spotd exits 0; the starts resume from nothing,
    step-000020 and step-000040, with SPOTD_RESTART_COUNT 0, 1, 2; each
    restart reuses the local copy (nothing downloaded); the history has two
    restart events; the metrics file counts 2 restarts;
  - --max-restarts 1: the local copy corrupted during the backoff is
    downloaded again instead; the second failure ends with exit 70 and one
    line naming the status and the restarts used;
  - SIGTERM during the backoff: spotd is "restarting" in `spotctl status`,
    then stops without starting the trainer again (exit 0, the newest
    commit named)."""
import json
import os
import re
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

WRAPPER = r'''
import os, sys
n = int(os.environ.get("SPOTD_RESTART_COUNT", "0"))
plan = {0: ["--crash-at", "25"], 1: ["--crash-at", "45"]}
extra = plan.get(n, ["--exit-at", "60"])
os.execv(sys.argv[1], [sys.argv[1], sys.argv[2], "--log", sys.argv[3],
                       "--every", "10", "--crash-status", "3"] + extra)
'''


def start(wd, store, job, args):
    os.makedirs(wd, exist_ok=True)
    wrapper = os.path.join(wd, "wrapper.py")
    with open(wrapper, "w") as f:
        f.write(WRAPPER)
    log = os.path.join(wd, "trainer.log")
    cmd = [sl.PY3, wrapper, sl.PY3, sl.FAKE_TRAINER, log]
    d = sl.Daemon(wd, store, job, cmd=cmd, args=[str(a) for a in args])
    return d, log


def starts(log):
    return sl.trainer_events(log, "start")


def resumed_from(ev):
    r = ev["env"].get("SPOTD_RESUME_DIR")
    return os.path.basename(r) if r else None


def metric(path, name):
    try:
        with open(path) as f:
            for line in f:
                # spotd labels every sample with its job and rank
                m = re.match(r'^%s\{job="[^"]*",rank="\d+"\} (\S+)$' %
                             re.escape(name), line)
                if m:
                    return float(m.group(1))
    except OSError:
        return None
    return None


def two_restarts(c, wd):
    store, job, prefix = sl.daemon_job("restart2")
    with sl.cleaned_up(prefix):
        mfile = os.path.join(wd, "spotd.prom")
        d, log = start(wd, store, job,
                       ["--max-restarts", 2, "--restart-backoff", "1",
                        "--metrics-file", mfile])
        rc = d.wait_exit(180)
        c.check(rc == 0, "max-restarts 2: the job finishes with 0", "rc=%s" % rc)
        ss = starts(log)
        c.check([e["step"] for e in ss] == [0, 20, 40],
                "the trainer started three times, from steps 0, 20, 40",
                repr([e["step"] for e in ss]))
        c.check([resumed_from(e) for e in ss] ==
                [None, "step-000020", "step-000040"],
                "each restart's SPOTD_RESUME_DIR is the newest commit",
                repr([resumed_from(e) for e in ss]))
        c.check([e["env"].get("SPOTD_RESTART_COUNT") for e in ss] ==
                ["0", "1", "2"], "SPOTD_RESTART_COUNT 0, 1, 2",
                repr([e["env"].get("SPOTD_RESTART_COUNT") for e in ss]))
        c.check(d.err.matching(r"the trainer failed \(status 3\): restart 1 "
                               r"of 2 in 1\.0 s, from the newest committed")
                and d.err.matching(r"the trainer failed \(status 3\): restart "
                                   r"2 of 2 in 2\.0 s, from the newest "
                                   r"committed"),
                "one line per restart: status, k of N, the doubled backoff")
        for name in ("step-000020", "step-000040"):
            c.check(d.err.matching(r"restart: the local copy of checkpoint %s "
                                   r"verifies .*nothing downloaded" % name),
                    "the local copy of %s is reused" % name)
        c.check(not d.err.matching(r"downloading it") and
                not d.err.matching(r"restored checkpoint"),
                "nothing was downloaded")
        c.check(d.err.matching(r"state running -> restarting") and
                d.err.matching(r"state restarting -> running"),
                "the engine went through RESTARTING")
        c.check(metric(mfile, "spotd_trainer_restarts_total") == 2,
                "the metrics file counts 2 restarts",
                repr(metric(mfile, "spotd_trainer_restarts_total")))
        url = store + "/" + job
        cp = sl.spotctl("history", url, "--json")
        j = json.loads(cp.stdout) if cp.returncode == 0 else {}
        c.check(j.get("summary", {}).get("restarts") == 2,
                "the history counts 2 restarts", cp.stdout[:400] + cp.stderr)
        cp = sl.spotctl("history", url)
        c.check(cp.returncode == 0 and
                re.search(r"trainer restarts\s+2", cp.stdout) is not None,
                "`spotctl history` shows the restarts", cp.stdout + cp.stderr)
        c.check(sl.s3_get(prefix + "RESTARTS").strip() == b"2",
                "the store's RESTARTS is 2",
                repr(sl.s3_get(prefix + "RESTARTS")))


def used_up(c, wd):
    store, job, prefix = sl.daemon_job("restart1")
    with sl.cleaned_up(prefix):
        d, log = start(wd, store, job,
                       ["--max-restarts", 1, "--restart-backoff", "4"])
        line = d.wait_log(r"restart 1 of 1 in 4\.0 s", 120)
        c.check(line is not None, "max-restarts 1: the first failure restarts")
        c.check(d.wait_log(r"committed checkpoint name=step-000020", 30)
                is not None, "step-000020 is committed")
        # Same size, other bytes: only the content check can tell.
        data = os.path.join(d.ckpt_dir, "step-000020", "data.bin")
        with open(data, "r+b") as f:
            f.write(b"corrupted local copy")
        rc = d.wait_exit(180)
        c.check(rc == 70, "the second failure exits 70", "rc=%s" % rc)
        c.check(d.err.matching(r"local copy of checkpoint step-000020 cannot "
                               r"be used \(data\.bin: its content differs\): "
                               r"downloading it"),
                "the corrupted local copy is not used")
        c.check(d.err.matching(r"restored checkpoint step-000020 into"),
                "step-000020 was downloaded again")
        ss = starts(log)
        c.check([e["step"] for e in ss] == [0, 20],
                "the trainer started twice, from steps 0 and 20",
                repr([e["step"] for e in ss]))
        c.check(d.err.matching(r"the trainer failed again \(status 3\) and "
                               r"all 1 restarts are used: giving up; the last "
                               r"committed checkpoint is step-000040"),
                "one line names the last status and the restarts used")


def sigterm_in_backoff(c, wd):
    store, job, prefix = sl.daemon_job("restartterm")
    with sl.cleaned_up(prefix):
        d, log = start(wd, store, job,
                       ["--max-restarts", 2, "--restart-backoff", "120"])
        c.check(d.wait_log(r"restart 1 of 2 in 120\.0 s", 120) is not None,
                "the first failure starts a 120 s backoff")
        st = None
        for _ in range(50):
            st = d.status()
            if st and st.get("state") == "restarting":
                break
        c.check(st is not None and st.get("state") == "restarting" and
                st.get("restarts", {}).get("used") == 1 and
                st.get("restarts", {}).get("max") == 2 and
                st.get("restarts", {}).get("last_status") == 3,
                "spotctl status: restarting, 1 of 2 used, last status 3",
                repr(st))
        cp = d.spotctl("status")
        c.check(cp.returncode == 0 and
                "restarts:     1 of 2 used (last failure: status 3)"
                in cp.stdout, "spotctl status shows the restarts",
                cp.stdout + cp.stderr)
        d.send(signal.SIGTERM)
        rc = d.wait_exit(60)
        c.check(rc == 0, "SIGTERM during the backoff: exit 0", "rc=%s" % rc)
        c.check(len(starts(log)) == 1, "the trainer was not started again",
                repr(starts(log)))
        c.check(d.err.matching(r"stopped while restarting the failed trainer "
                               r"\(nothing was running\): the job resumes "
                               r"from checkpoint step-000020"),
                "the last line names the newest commit")


def main():
    sl.daemon_env()
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-restart-") as wd:
        two_restarts(c, os.path.join(wd, "two"))
        used_up(c, os.path.join(wd, "one"))
        sigterm_in_backoff(c, os.path.join(wd, "term"))
    c.finish()


if __name__ == "__main__":
    main()
