"""The job lease in spotd (README "Job lease"), against the real S3
server:

(a) a replacement spotd started while the old one runs waits for the lease
    (its status names the holder and the expiry), the old one drains
    (SIGTERM: final checkpoint, commit, release), the new one restores that
    final commit, and the two trainers never run at once (the fake
    trainer's timestamps); prints the handoff time (old release -> new
    trainer start).
(b) `kill -9` of a spotd: the next spotd on this machine proves the holder
    gone (its lock is free: it and its guard are gone) and takes the lease
    over at once with a
    higher epoch (the killed one's TTL is 300 s: waiting for the expiry
    would exceed the test's time limit); a spotd frozen (SIGSTOP) until another took
    over cannot move LATEST once thawed (SIGCONT): it stops its trainer and
    exits 73."""
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

TRAINER = ["--step-sleep", 0.05, "--bytes", 4096]


def trainer_span(d):
    """(start t, last event t) of a fake trainer run."""
    ev = d.events()
    starts = [e["t"] for e in ev if e["ev"] == "start"]
    return (starts[0] if starts else None), (ev[-1]["t"] if ev else None)


def part_a(c, wd, store, job, prefix):
    old = sl.Daemon(os.path.join(wd, "a-old"), store, job, trainer=TRAINER,
                    args=["--lease-ttl", 6])
    c.check(old.wait_event("step", 30) is not None, "a: the old trainer runs")
    new = sl.Daemon(os.path.join(wd, "a-new"), store, job, trainer=TRAINER,
                    args=["--lease-ttl", 6])
    line = new.wait_log(r"waiting for the job lease", 20)
    c.check(line is not None, "a: the new spotd says it waits for the lease",
            new.log()[-2000:])
    st = None
    for _ in range(40):
        st = new.status()
        if st and st.get("lease", {}).get("state") == "waiting":
            break
        time.sleep(0.1)
    lease = (st or {}).get("lease", {})
    c.check(lease.get("state") == "waiting" and
            str(os.getpid()) not in lease.get("holder", "") and
            lease.get("holder", "").endswith(":%d" % old.pid) and
            lease.get("expires", "").endswith("Z"),
            "a: status --json names the holder (old spotd) and until when",
            repr(st))
    c.check(new.events("start") == [], "a: the new trainer has not started")
    old.send(signal.SIGTERM)
    rc = old.wait_exit(40)
    c.check(rc == 0, "a: the old spotd drains and exits 0", "rc=%s" % rc)
    final = sl.latest(prefix)
    released_t = old.err.time_of(r"released the job lease")
    c.check(released_t is not None, "a: the old spotd released the lease")
    s = new.wait_event("start", 30)
    c.check(s is not None, "a: the new trainer starts")
    o0, o1 = trainer_span(old)
    n0, _ = trainer_span(new)
    c.check(None not in (o1, n0) and n0 > o1,
            "a: the trainers never ran at once (old ended %.3f, new began "
            "%.3f)" % (o1 or 0, n0 or 0))
    ckpts = old.events("checkpoint")
    c.check(bool(ckpts) and final == ckpts[-1]["name"] and s is not None and
            s["step"] == ckpts[-1]["step"] and
            s["env"].get("SPOTD_RESUME_DIR", "").endswith("/" + final),
            "a: the new trainer resumes from the old one's final commit",
            "latest=%r ckpts=%r start=%r" % (final, ckpts[-1:], s))
    if released_t is not None and n0 is not None:
        print("HANDOFF old release -> new trainer start: %.3f s" %
              (n0 - released_t))
        c.check(n0 - released_t < 5.0, "a: handoff under 5 s (%.3f s)" %
                (n0 - released_t))
    took = new.err.matching(r"took the job lease .* epoch=(\d+)")
    c.check(bool(took), "a: the new spotd took the lease", new.log()[-1500:])
    new.send(signal.SIGTERM)
    c.check(new.wait_exit(40) == 0, "a: the new spotd drains and exits 0")


def part_b(c, wd, store, job, prefix):
    # kill -9: the holder is gone, the next spotd takes it with epoch + 1
    k = sl.Daemon(os.path.join(wd, "b-killed"), store, job, trainer=TRAINER,
                  args=["--lease-ttl", 300])
    s = k.wait_event("start", 30)
    c.check(s is not None, "b: the first spotd's trainer runs")
    e1 = k.err.matching(r"took the job lease .* epoch=\d+")
    ep1 = int(e1[0].rsplit("epoch=", 1)[1].split()[0]) if e1 else -1
    os.kill(k.pid, signal.SIGKILL)
    k.wait_exit(10)
    if s is not None:
        try:
            os.killpg(k.trainer_pids()[0], signal.SIGKILL)
        except ProcessLookupError:
            pass
    t0 = time.time()
    n = sl.Daemon(os.path.join(wd, "b-next"), store, job, trainer=TRAINER,
                  args=["--lease-ttl", 3])
    s2 = n.wait_event("start", 30)
    took = n.err.matching(r"took the job lease .* epoch=\d+")
    ep2 = int(took[0].rsplit("epoch=", 1)[1].split()[0]) if took else -1
    c.check(s2 is not None and ep2 == ep1 + 1,
            "b: the next spotd took over the dead holder's lease with a "
            "higher epoch (%d -> %d) after %.1f s" % (ep1, ep2,
                                                     time.time() - t0))
    gone = n.err.matching(r"held by a process of this machine that is gone "
                          r"\(pid %d and its guard hold its lock no more\)"
                          % k.pid)
    c.check(len(gone) == 1, "b: it says the holder (pid %d) is gone" % k.pid,
            n.log()[-1500:])

    # SIGSTOP the holder until the lease expires, a third takes over and
    # commits; SIGCONT: the old writer cannot move LATEST
    n.send(signal.SIGSTOP)
    if s2 is not None:
        os.killpg(n.trainer_pids()[0], signal.SIGSTOP)
    third = sl.Daemon(os.path.join(wd, "b-third"), store, job,
                      trainer=TRAINER, args=["--lease-ttl", 3])
    s3 = third.wait_event("start", 30)
    c.check(s3 is not None, "b: a third spotd took over from the frozen one")
    c.check(third.spotctl("checkpoint", "--wait").returncode == 0,
            "b: the third spotd commits a checkpoint")
    latest = sl.latest(prefix)
    n.send(signal.SIGCONT)
    if s2 is not None:
        os.killpg(n.trainer_pids()[0], signal.SIGCONT)
    n.spotctl("checkpoint", timeout=10)
    rc = n.wait_exit(30)
    c.check(rc == 73, "b: the thawed spotd lost its lease and exits 73",
            "rc=%s" % rc)
    c.check(any("lease" in l and "lost" in l
                for l in n.err.matching(r"lease")),
            "b: the thawed spotd says its lease is lost", n.log()[-1500:])
    time.sleep(0.5)
    c.check(sl.latest(prefix) == latest,
            "b: LATEST still names the new holder's commit (%s)" % latest)
    third.send(signal.SIGTERM)
    c.check(third.wait_exit(40) == 0, "b: the holder drains and exits 0")


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("lease-handoff")
    with sl.cleaned_up(prefix[:-len("job/")]):
        with tempfile.TemporaryDirectory(prefix="spotd-lease-") as wd:
            part_a(c, wd, store, job + "-a", prefix[:-len("job/")] + job + "-a/")
            part_b(c, wd, store, job + "-b", prefix[:-len("job/")] + job + "-b/")
    c.finish()


if __name__ == "__main__":
    main()
