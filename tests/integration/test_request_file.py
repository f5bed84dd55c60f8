"""The checkpoint request file is robust to anything written into it: the
real spotd and the real Python helper (a trainer and a forked child that
both poll), against the real Ceph, while this test writes into the file:

  truncated:  the file cut to 0 bytes while both poll (a mapping read
              after a truncation is SIGBUS): spotd, the trainer and its
              child live on, the next request is served, the file is put
              back (4096 bytes, one warning);
  garbage:    seq = 2^64-1 written into the file: taken once at most, and
              spotd's next, smaller seq is taken by both processes;
  random:     random bytes at random places of the header and random
              truncations, before and while requests are pending: every
              request is served;
  replaced:   a copy renamed over the path: a process that imports the
              helper then refuses it (not spotd's file, SPOTD_REQUEST_ID)
              and takes the signal; spotd says the path is not its file.

The file is 0600. Each `spotctl checkpoint --wait` must commit."""
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

TRAINER = r'''
import json, os, sys, time
import spotd
log = open(sys.argv[1], "a", buffering=1)
def emit(ev, **kw):
    kw.update(ev=ev, pid=os.getpid(), t=time.time())
    log.write(json.dumps(kw) + "\n")
if os.fork() == 0:
    while True:  # a worker that polls too (a helper in a second process)
        if spotd.checkpoint_requested():
            emit("child-took", seq=spotd._taken)
        time.sleep(0.01)
emit("start", env={k: v for k, v in os.environ.items()
                   if k.startswith("SPOTD_")})
step = 0
while True:
    step += 1
    if spotd.checkpoint_requested():
        # the request stays pending until the save is complete: keep it so
        # long enough for the forked child's next poll (every 10 ms), or a
        # fast save serves it before the child looks
        time.sleep(0.2)
        with spotd.checkpoint(step=step) as ck:
            with ck.open("s") as f:
                f.write(b"%d" % step)
        emit("checkpoint", name=ck.name, seq=spotd._taken)
    time.sleep(0.01)
'''

HELPER = r'''
import spotd, sys
print(spotd.request_channel(), spotd._installed is not None, flush=True)
'''


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("reqfile")
    rnd = random.Random(7)
    with sl.cleaned_up(prefix), \
            tempfile.TemporaryDirectory(prefix="spotd-reqfile-") as wd:
        log = os.path.join(wd, "trainer.log")
        d = sl.Daemon(os.path.join(wd, "node"), store, job,
                      cmd=[sl.PY3, "-c", TRAINER, log],
                      env={"PYTHONPATH": sl.srcdir_path("python")})
        d.trainer_log = log
        s = d.wait_event("start", 60)
        c.check(s is not None, "the trainer starts")
        if s is None:
            d.send(signal.SIGTERM)
            d.wait_exit(30)
            c.finish()
        env = s["env"]
        req = env["SPOTD_REQUEST_FILE"]
        c.check(os.stat(req).st_mode & 0o777 == 0o600,
                "the request file is 0600", oct(os.stat(req).st_mode))
        served = []

        def ask(what):
            cp = d.spotctl("checkpoint", "--wait", "--timeout", 60,
                           timeout=90)
            ok = cp.returncode == 0 and d.running()
            served.append(ok)
            c.check(ok, what + ": the request is served and committed",
                    cp.stdout + cp.stderr + d.log()[-2000:])
            return ok

        def child_took_latest():
            seqs = [e["seq"] for e in d.events("child-took")]
            return seqs[-1] if seqs else None

        ask("before anything")
        c.check(not d.err.matching(r"was changed by another process"),
                "no warning while nobody else writes into the file",
                d.log()[-1500:])
        time.sleep(0.3)
        c.check(child_took_latest() == 1,
                "the forked child took request 1", repr(child_took_latest()))

        # truncated while both poll
        os.truncate(req, 0)
        time.sleep(0.5)
        ask("after a truncation")
        c.check(d.running() and not d.events("crash"),
                "spotd lives after the truncation")
        c.check(os.path.getsize(req) == 4096, "the file is put back",
                str(os.path.getsize(req)))
        c.check(bool(d.err.matching(r"request file .* was changed by "
                                    r"another process")),
                "one warning says the file was changed", d.log()[-1500:])
        time.sleep(0.3)
        c.check(child_took_latest() == 2,
                "the forked child lives and took request 2",
                repr(child_took_latest()))

        # a garbage seq, larger than any spotd will write
        with open(req, "r+b") as f:
            f.seek(16)
            f.write((2 ** 64 - 1).to_bytes(8, "little"))
        time.sleep(2)  # taken (maybe) as a request of its own
        ask("after seq = 2^64-1")
        time.sleep(0.3)
        c.check(child_took_latest() == 3,
                "the forked child took spotd's request 3 after the garbage",
                repr(child_took_latest()))

        # random writes and truncations, between and during requests
        writes = 0
        for round_ in range(4):
            for _ in range(150):
                with open(req, "r+b") as f:
                    if rnd.random() < 0.1:
                        f.truncate(rnd.choice((0, 8, 20, 40, 4095)))
                    else:
                        f.seek(rnd.randrange(0, 48))
                        f.write(bytes(rnd.randrange(256) for _ in
                                      range(rnd.randrange(1, 9))))
                writes += 1
            time.sleep(2)  # garbage seqs may ask for checkpoints of their own
            ask("after %d random writes" % writes)
        time.sleep(0.3)
        c.check(child_took_latest() == 7,
                "the forked child took spotd's request 7 after %d random "
                "writes" % writes, repr(child_took_latest()))

        # a copy renamed over the path
        tmp = req + ".x"
        shutil.copyfile(req, tmp)
        os.rename(tmp, req)
        e = dict(os.environ, PYTHONPATH=sl.srcdir_path("python"))
        e.update({k: v for k, v in env.items()
                  if k in ("SPOTD_REQUEST_FILE", "SPOTD_REQUEST_ID",
                           "SPOTD_SIGNAL")})
        cp = subprocess.run([sl.PY3, "-c", HELPER], capture_output=True,
                            text=True, timeout=60, env=e)
        c.check(cp.stdout.split() == ["None", "True"] and
                "not spotd's file" in cp.stderr,
                "a process importing the helper refuses the file renamed "
                "over the path and takes the signal", cp.stdout + cp.stderr)
        ask("after the file was replaced")
        c.check(bool(d.err.matching(r"no longer spotd's checkpoint request "
                                    r"file")),
                "spotd says the path is no longer its file", d.log()[-1500:])
        time.sleep(0.3)
        c.check(child_took_latest() == 8,
                "the forked child (spotd's file) took request 8",
                repr(child_took_latest()))

        c.check(not d.events("crash") and d.running(),
                "spotd and the trainer live on")
        print("served %d of %d requests after %d random writes"
              % (sum(served), len(served), writes))
        d.send(signal.SIGTERM)
        c.check(d.wait_exit(60) == 0, "spotd drains and exits 0",
                "rc=%s" % d.rc)
    c.finish()


if __name__ == "__main__":
    main()
