#!/usr/bin/python3
"""The checkpoint request file (README "How a request reaches the trainer"),
from the daemon's side, with a trainer that reads the file itself (no
helper), against the loopback fake S3:

  file:   `spotctl checkpoint` reaches a trainer through the file; the
          trainer also catches the checkpoint signal, but maps the file, so
          spotd never sends it; a process in a session of its own sees the
          request too; once the checkpoint is complete the request is
          served (served == seq in the file).
  early:  a request made before the trainer maps the file (a slow import)
          waits there and is taken once, when it looks; nothing catches the
          signal, so nothing is signalled and one line says the request
          waits.
  nostep: a notice while the trainer resumed from a checkpoint has made no
          step (maps the file, never polls): spotd exits 75 at once, the
          restored checkpoint is the final one, nothing new is committed,
          and the history counts no work lost.
  many:   a trainer of 301 processes that all catch the checkpoint signal
          (more than spotd once followed: 256) and never read the file:
          each gets the signal exactly once for the request, although the
          request stays pending over several of spotd's looks (every
          250 ms) after the last one got it."""
import json
import os
import signal
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

TRAINER = r'''
import json, mmap, os, signal, struct, sys, time
log = open(sys.argv[1], "a", buffering=1)
delay, poll, child = float(sys.argv[2]), sys.argv[3] == "poll", sys.argv[4] == "child"
def emit(ev, **kw):
    kw.update(ev=ev, pid=os.getpid(), t=time.time())
    log.write(json.dumps(kw) + "\n")
if os.environ.get("SPOTD_SIGNAL"):
    signal.signal(int(os.environ["SPOTD_SIGNAL"]), lambda s, f: emit("signal"))
time.sleep(delay)  # a slow import
fd = os.open(os.environ["SPOTD_REQUEST_FILE"], os.O_RDWR)
m = mmap.mmap(fd, 4096)
os.close(fd)
def u64(off):
    return struct.unpack_from("<Q", m, off)[0]
struct.pack_into("<Q", m, 40, u64(40) + 1)  # attached, as the helper's import
emit("mapped", magic=bytes(m[0:8]).decode())
if child and os.fork() == 0:
    os.setsid()  # as torch 2.x's torchrun starts a worker
    while u64(16) == 0:
        time.sleep(0.02)
    emit("child-saw", seq=u64(16))
    while True:  # stays, as a worker does, until spotd stops the tree
        time.sleep(1)
taken, step = 0, int(os.environ.get("RESUME_STEP", "0"))
if os.environ.get("SPOTD_RESUME_DIR"):
    step = int(open(os.path.join(os.environ["SPOTD_RESUME_DIR"], "step")).read())
emit("start", step=step)
while True:
    time.sleep(0.05)
    if not poll:
        continue
    step += 1
    struct.pack_into("<Q", m, 32, u64(32) + 1)
    seq, served = u64(16), u64(24)
    if seq > served and seq > taken:
        taken = seq
        d = os.path.join(os.environ["SPOTD_CKPT_DIR"], "step-%06d" % step)
        os.makedirs(d)
        open(os.path.join(d, "step"), "w").write(str(step))
        open(os.path.join(d, "SPOTD_COMPLETE"), "w").close()
        emit("checkpoint", step=step, seq=seq)
'''


MANY = r'''
import os, signal, sys, time
log, n = sys.argv[1], int(sys.argv[2])
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
signal.signal(int(os.environ["SPOTD_SIGNAL"]),
              lambda s, f: os.write(fd, b"%d\n" % os.getpid()))
for i in range(n):
    if os.fork() == 0:
        while True:
            signal.pause()
open(log + ".ready", "w").close()
got = set()
while len(got) < n + 1:  # every process of the tree got the signal
    time.sleep(0.1)
    with open(log) as f:
        got = set(f.read().split())
time.sleep(1.0)  # the request stays pending over a few more looks
d = os.path.join(os.environ["SPOTD_CKPT_DIR"], "step-000001")
os.makedirs(d)
open(os.path.join(d, "step"), "w").write("1")
open(os.path.join(d, "SPOTD_COMPLETE"), "w").close()
while True:
    time.sleep(1)
'''


def req_file(d):
    return d.socket + ".req"


def read_slots(path):
    with open(path, "rb") as f:
        b = f.read(40)
    return struct.unpack_from("<QQQ", b, 16)


def trainer_cmd(wd, log, delay=0.0, poll=True, child=False):
    os.makedirs(wd, exist_ok=True)
    script = os.path.join(wd, "req_trainer.py")
    with open(script, "w") as f:
        f.write(TRAINER)
    return [sl.PY3, script, log, str(delay), "poll" if poll else "no",
            "child" if child else "no"]


def events(log, ev=None):
    return [e for e in sl.read_jsonl(log) if ev is None or e["ev"] == ev]


def wait_ev(log, ev, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        got = events(log, ev)
        if got:
            return got[0]
        time.sleep(0.05)
    return None


def stop_now(d):
    """Two SIGTERMs: stop at once, without a final checkpoint."""
    d.send(signal.SIGTERM)
    time.sleep(0.3)
    d.send(signal.SIGTERM)
    d.wait_exit(20)


def file_case(c, s3, store, job, wd):
    tag = "file: "
    log = os.path.join(wd, "t.log")
    d = sl.Daemon(wd, store, job, env=s3.env(),
                  cmd=trainer_cmd(wd, log, child=True))
    try:
        c.check(wait_ev(log, "start") is not None, tag + "the trainer runs")
        m = wait_ev(log, "mapped")
        c.check(m is not None and m["magic"] == "SPOTDREQ",
                tag + "the request file starts with SPOTDREQ")
        cp = d.spotctl("checkpoint", "--wait", timeout=60)
        c.check(cp.returncode == 0, tag + "spotctl checkpoint --wait: %s" %
                cp.stderr.strip())
        ck = wait_ev(log, "checkpoint")
        c.check(ck is not None and ck["seq"] == 1,
                tag + "the trainer took request 1 from the file")
        saw = wait_ev(log, "child-saw", 10)
        c.check(saw is not None and saw["seq"] == 1,
                tag + "a process in another session saw it too")
        c.check(d.wait_log(r"committed checkpoint name=step-", 30) is not None,
                tag + "the checkpoint is committed")
        seq, served, polls = read_slots(req_file(d))
        c.check(seq == 1 and served == 1,
                tag + "the request is served (seq %d, served %d)" % (seq, served))
        c.check(polls > 0, tag + "the trainer's polls are counted (%d)" % polls)
        c.check(not events(log, "signal"),
                tag + "no signal to a process that reads the file, though it "
                "catches it")
        c.check(d.err.matching(r"checkpoint requested \(spotctl checkpoint\): "
                               r"request 1; [12] process(es)? of the trainer "
                               r"reads? it; SIGRTMIN\+4 sent to 0"),
                tag + "one line says who reads it and who got the signal")
    finally:
        stop_now(d)
    c.check(not os.path.exists(req_file(d)), tag + "the file is removed at exit")


def early_case(c, s3, store, job, wd):
    tag = "early: "
    log = os.path.join(wd, "t.log")
    env = dict(s3.env())
    d = sl.Daemon(wd, store, job, env=env,
                  cmd=["/usr/bin/env", "-u", "SPOTD_SIGNAL"] +
                  trainer_cmd(wd, log, delay=2.0))
    try:
        c.check(sl.wait_state(d, "running", 20) is not None, tag + "running")
        cp = d.spotctl("checkpoint")
        c.check(cp.returncode == 0, tag + "asked before the trainer looks")
        c.check(not events(log, "mapped"), tag + "the trainer did not look yet")
        c.check(d.wait_log(r"no process of the trainer catches the signal "
                           r"or reads the request file yet",
                           10) is not None,
                tag + "one line says the request waits")
        ck = wait_ev(log, "checkpoint", 20)
        c.check(ck is not None and ck["seq"] == 1,
                tag + "the request is taken once the trainer looks")
        c.check(d.wait_log(r"committed checkpoint name=step-", 30) is not None,
                tag + "and committed")
        time.sleep(0.5)
        c.check(len(events(log, "checkpoint")) == 1, tag + "taken once")
        seq, served, _ = read_slots(req_file(d))
        c.check(seq == served == 1, tag + "served: a later process does "
                "not take it again")
    finally:
        stop_now(d)


def committed_names(s3, store, job):
    cp = sl.run([sl.spotctl_exe(), "list", "%s/%s" % (store, job), "--json"],
                env=s3.env())
    try:
        doc = json.loads(cp.stdout)
    except ValueError:
        return []
    found = []

    def walk(o):
        if isinstance(o, dict):
            if isinstance(o.get("name"), str) and o.get("committed", True):
                found.append(o["name"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    walk(doc)
    return sorted(set(found))


def nostep_case(c, s3, store, job, wd):
    tag = "nostep: "
    emu = sl.EmulatorProc("aws")
    log = os.path.join(wd, "t.log")
    try:
        names = committed_names(s3, store, job)
        d = sl.Daemon(wd, store, job, env=s3.env(), provider="aws",
                      metadata_url=emu.url,
                      cmd=trainer_cmd(wd, log, poll=False))
        st = wait_ev(log, "start")
        c.check(st is not None and st["step"] > 0,
                tag + "the trainer resumed from a checkpoint (%s)" % st)
        t0 = time.time()
        emu.control("notice", deadline=60)
        rc = d.wait_exit(40)
        took = time.time() - t0
        c.check(rc == 75, tag + "exit 75 (%s) after %.1f s" % (rc, took))
        c.check(d.err.matching(r"has made no step since checkpoint step-"),
                tag + "one line says the trainer made no step")
        c.check(d.err.matching(r"preempted before the trainer made a step: "
                               r"the job resumes from checkpoint step-"),
                tag + "the last line names the restored checkpoint")
        c.check(not d.err.matching(r"checkpoint requested \("),
                tag + "the trainer was not asked for a new checkpoint")
        names2 = committed_names(s3, store, job)
        c.check(names == names2 and names,
                tag + "nothing new committed (%s -> %s)" % (names, names2))
        h = sl.run([sl.spotctl_exe(), "history", "%s/%s" % (store, job),
                    "--json"], env=s3.env())
        runs = []
        try:
            runs = json.loads(h.stdout).get("runs", [])
        except ValueError:
            pass
        last = runs[-1] if runs else {}
        c.check(last.get("outcome") == "preempted" and
                last.get("lost_s") == 0 and last.get("lost_steps") in (0, -1),
                tag + "history: preempted, nothing lost (%s)" %
                {k: last.get(k) for k in ("outcome", "lost_s", "lost_steps")})
    finally:
        emu.stop()


def many_case(c, s3, store, job, wd, n=300):
    tag = "many: "
    log = os.path.join(wd, "sig.log")
    os.makedirs(wd, exist_ok=True)
    script = os.path.join(wd, "many.py")
    with open(script, "w") as f:
        f.write(MANY)
    d = sl.Daemon(wd, store, job, env=s3.env(),
                  cmd=[sl.PY3, script, log, str(n)])
    try:
        end = time.time() + 60
        while not os.path.exists(log + ".ready") and time.time() < end:
            time.sleep(0.1)
        c.check(os.path.exists(log + ".ready"),
                tag + "the trainer forked %d children" % n)
        cp = d.spotctl("checkpoint", "--wait", timeout=90)
        c.check(cp.returncode == 0, tag + "spotctl checkpoint --wait: "
                "committed once every process got the signal",
                cp.stderr.strip())
        with open(log) as f:
            pids = f.read().split()
        counts = {p: pids.count(p) for p in set(pids)}
        c.check(len(counts) == n + 1,
                tag + "all %d processes got the signal (%d did)"
                % (n + 1, len(counts)))
        again = sorted(p for p, k in counts.items() if k != 1)
        c.check(counts and not again,
                tag + "each got it exactly once for the request",
                "%d got it more than once: %s" % (len(again), again[:10]))
        seq, served, _ = read_slots(req_file(d))
        c.check(seq == 1 and served == 1 and
                d.err.matching(r"committed checkpoint name=step-000001"),
                tag + "the request is served and its checkpoint committed")
    finally:
        stop_now(d)


def main():
    c = sl.Checks()
    s3, store, job, _ = sl.fake_store("request")
    try:
        with tempfile.TemporaryDirectory(prefix="spotd-request-") as wd:
            file_case(c, s3, store, job, os.path.join(wd, "file"))
            early_case(c, s3, store, job, os.path.join(wd, "early"))
            nostep_case(c, s3, store, job, os.path.join(wd, "nostep"))
            many_case(c, s3, store, job + "-many", os.path.join(wd, "many"))
    finally:
        sl.kill_started()
        s3.close()
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
