"""Multi-node outside Slurm, without --run-id: the ranks agree on the run
through the store, across restarts, in any start order, and when one rank
restarts alone.

Two spotd processes play two nodes of one job (no SLURM_* variables).
Three runs: the ranks start in turn (rank 0 first, then rank 1 first, ...)
a second apart, and a notice comes on rank 1 in odd runs and on rank 0 in
even ones. In run 2, once both train, rank 1's spotd is killed (SIGKILL)
and started again alone: it rejoins run 2 (its peer still runs it) with
the same SPOTD_RESTART_COUNT, and rank 0's notice reaches it (its trainer
saves what rank 0's saves, as a trainer in step with its peer). Each run:
- both ranks log the same run (`joined run rN`), N = the run's number;
- the notice reaches the other rank through the job-wide notice of that
  run, and both exit 75 with one new commit;
- both trainers get the same SPOTD_RESTART_COUNT, N - 1.
Before the store agreed the run, each rank counted its own restarts (r1
and r2 after the first restart), and a notice on one rank never reached
the other. Before a rank's exit was recorded in the store, the rank
restarted alone opened run 3 while rank 0 ran run 2: the notice never
reached it, and every later start put the two ranks in different runs."""
import os
import re
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

RUNS = 3
LONE = 2  # the run in which rank 1 restarts alone
STEP_SLEEP = 4.0  # both trainers save in the same step: the same name


def start(wd, store, job, rank, emu, trainer=()):
    return sl.Daemon(os.path.join(wd, "node%d" % rank), store, job,
                     trainer=["--step-sleep", STEP_SLEEP] + list(trainer),
                     args=["--rank", rank, "--nranks", 2, "--rank-wait", 30],
                     provider="aws", metadata_url=emu.url,
                     env={"AWS_EC2_METADATA_DISABLED": "true"})


def joined(d):
    line = d.wait_log(r"joined run r\d+", 60)
    m = re.search(r"joined run (r\d+)", line or "")
    return m.group(1) if m else None


def counts_of(ds):
    """Each trainer's SPOTD_RESTART_COUNT (None until it started)."""
    st = [d.wait_event("start", 60) for d in ds]
    return [(s or {}).get("env", {}).get("SPOTD_RESTART_COUNT") for s in st]


def same_step(ds, timeout=60):
    """Waits until both trainers logged the same step; True then."""
    end = time.time() + timeout
    while time.time() < end:
        a, b = ([e["step"] for e in d.events("step")] for d in ds)
        if a and b and a[-1] == b[-1]:
            return True
        time.sleep(0.05)
    return False


def main():
    sl.daemon_env()
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            del os.environ[k]
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("multinode-runs")
    with sl.cleaned_up(prefix):
        with tempfile.TemporaryDirectory(prefix="spotd-runs-") as wd:
            for run in range(1, RUNS + 1):
                first = (run + 1) % 2  # run 1: rank 0 first; run 2: rank 1
                noticed = run % 2  # run 1: rank 1; run 2: rank 0
                emus = [sl.EmulatorProc("aws"), sl.EmulatorProc("aws")]
                ds = [None, None]
                ds[first] = start(wd, store, job, first, emus[first])
                time.sleep(1.0)
                ds[1 - first] = start(wd, store, job, 1 - first,
                                      emus[1 - first])
                ids = [joined(d) for d in ds]
                c.check(ids[0] is not None and ids[0] == ids[1] and
                        ids[0] == "r%d" % run,
                        "run %d: both ranks joined run r%d (rank %d started "
                        "first)" % (run, run, first), repr(ids))
                c.check(counts_of(ds) == [str(run - 1)] * 2,
                        "run %d: both trainers get SPOTD_RESTART_COUNT=%d" %
                        (run, run - 1), repr(counts_of(ds)))
                before = sl.committed(prefix)
                # both trainers in the same step, then the notice on one
                c.check(same_step(ds), "run %d: both trainers run in step"
                        % run)
                if run == LONE:
                    ds[1].send(signal.SIGKILL)
                    ds[1].wait_exit(30)
                    # It resumes behind rank 0: it saves what rank 0 saves,
                    # under its name, so that one commit holds both ranks.
                    ds[1] = start(wd, store, job, 1, emus[1],
                                  ["--ignore-signal", "--save-with",
                                   ds[0].trainer_log])
                    again = joined(ds[1])
                    c.check(again == "r%d" % run,
                            "run %d: rank 1 restarted alone rejoins run r%d, "
                            "which rank 0 still runs" % (run, run),
                            repr(again))
                    c.check(counts_of(ds) == [str(run - 1)] * 2,
                            "run %d: the restarted trainer gets the same "
                            "SPOTD_RESTART_COUNT" % run, repr(counts_of(ds)))
                emus[noticed].control("notice", deadline=60)
                other = ds[1 - noticed]
                seen = other.wait_log(r"job-wide notice from rank %d" %
                                      noticed, 60)
                c.check(seen is not None,
                        "run %d: rank %d drains on rank %d's notice" %
                        (run, 1 - noticed, noticed))
                rcs = [d.wait_exit(120) for d in ds]
                c.check(rcs == [75, 75],
                        "run %d: both ranks exit 75" % run, repr(rcs))
                new = [n for n in sl.committed(prefix) if n not in before]
                c.check(len(new) == 1, "run %d: one new commit" % run,
                        repr(new))
                for e in emus:
                    e.stop()
            keys = [k for k in sl.s3_keys(prefix + "runs/")]
            # each rank keeps its marker of the newest run, which the
            # preemption marked over (the run before's are deleted once a
            # rank joined the next)
            newest = ["%sruns/%010d/%s" % (prefix, RUNS, m)
                      for m in ("rank-0", "rank-1", "over")]
            c.check(all(k in keys for k in newest) and len(keys) <= 5,
                    "the store keeps the newest run's markers and few "
                    "others", repr(keys))
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
