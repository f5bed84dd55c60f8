"""The control socket against a second spotd and hostile same-machine
clients.

1. A second spotd given the socket of a live one refuses with one clear
   line naming the first's pid, starts no trainer, and leaves the socket
   alone: the first still answers, on the same socket file, and removes it
   at its exit. A stale socket (nobody listening) is replaced.
2. 40 connections from one process trickling one byte a second: only a
   few get a slot, the others are told why in one JSON line; `spotctl
   status` still answers at once; the trickle does not extend a line's
   deadline (the slots are freed within it).
3. A peer whose supplementary groups hold --socket-group is accepted; the
   same uid without it is refused (root only: setpriv).
4. A flood from spotd's own user: 8 processes each holding their 4 slots
   (32, more than the user's 24) and reconnecting as soon as a slot is
   taken from them, and each trying a fifth connection in a loop. Every one
   of 20 `spotctl status` probes is answered (a newcomer takes the oldest
   slot of the process holding the most), and the thousands of refused or
   dropped connections make a few log lines (at most one per 10 s and a
   count), not one each.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

LINE_DEADLINE = 10  # CTL_LINE_MS in daemon/control.c
PER_PID = 4         # CTL_CONNS_PER_PID


def second_spotd(c, wd, store, job):
    d = sl.Daemon(os.path.join(wd, "first"), store, job,
                  trainer=["--step-sleep", 0.05])
    # The trainer's own start event: a checkpoint signal before its handler
    # is installed would be ignored (spotd starts it with the signal
    # ignored), and this test's SIGTERM asks for one.
    c.check(d.wait_log(r"state \S+ -> running", 20) is not None and
            d.wait_event("start", 20) is not None, "the first spotd runs")
    ino = os.stat(d.socket).st_ino
    other = os.path.join(wd, "second")
    os.makedirs(other)
    tlog = os.path.join(other, "trainer.log")
    cp = sl.run([sl.spotd_exe(), "run", "--job", job, "--store", store,
                 "--ckpt-dir", os.path.join(other, "ckpt"), "--socket",
                 d.socket, "--provider", "none", "--interval", "0", "--",
                 sl.PY3, sl.FAKE_TRAINER, "--log", tlog], timeout=30)
    err = [l for l in cp.stderr.splitlines() if "error" in l]
    c.check(cp.returncode not in (0, -9) and any(
        "control socket %s is in use by a running spotd (pid %d)"
        % (d.socket, d.pid) in l for l in err),
        "a second spotd on the same --socket refuses, naming the first's pid",
        "rc=%d\n%s" % (cp.returncode, cp.stderr))
    c.check(not os.path.exists(tlog), "the second spotd started no trainer")
    c.check(os.path.exists(d.socket) and os.stat(d.socket).st_ino == ino,
            "the socket file is the first spotd's still")
    s = d.status()
    c.check(s is not None and s.get("state") == "running",
            "the first spotd still answers", repr(s))
    d.send(signal.SIGTERM)
    rc = d.wait_exit(40)
    c.check(rc != -9 and not os.path.exists(d.socket),
            "the first spotd exits on SIGTERM and removes its socket",
            "rc=%s" % rc)

    # A stale socket: bound, then nobody listens.
    os.makedirs(os.path.join(wd, "third"))
    stale = os.path.join(wd, "third", "spotd.sock")  # the Daemon's socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()
    d2 = sl.Daemon(os.path.join(wd, "third"), store, job,
                   trainer=["--step-sleep", 0.05])
    ok = d2.wait_log(r"state \S+ -> running", 20) is not None
    c.check(ok and d2.err.matching(r"replacing a stale socket") and
            d2.status() is not None,
            "a stale socket is replaced and served", d2.log())
    d2.wait_event("start", 20)
    d2.send(signal.SIGTERM)
    d2.wait_exit(40)


class Trickler:
    """n connections from this process, each sending one byte of a request
    line per second, never the newline. Records what each one reads."""

    def __init__(self, path, n):
        self.socks = []
        self.got = {}
        self.closed_at = {}
        self.stop = False
        for i in range(n):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.settimeout(0.05)
            self.socks.append(s)
            self.got[i] = b""
        self.t0 = time.time()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _run(self):
        payload = b'{"v":1,"id":1,"cmd":"status"' + b" " * 10000
        k = 0
        while not self.stop:
            for i, s in enumerate(self.socks):
                if i in self.closed_at:
                    continue
                try:  # read first: a refusal is sent, then the close
                    b = s.recv(4096)
                    if not b:
                        self.closed_at[i] = time.time() - self.t0
                        continue
                    self.got[i] += b
                except socket.timeout:
                    pass
                except OSError:
                    self.closed_at[i] = time.time() - self.t0
                    continue
                try:
                    s.send(payload[k:k + 1])
                except OSError:
                    self.closed_at[i] = time.time() - self.t0
            k += 1
            time.sleep(max(0.0, 1.0 - 0.05 * len(self.socks)))

    def close(self):
        self.stop = True
        self.th.join(10)
        for s in self.socks:
            s.close()


def trickle(c, wd, store, job):
    d = sl.Daemon(os.path.join(wd, "trickle"), store, job,
                  trainer=["--step-sleep", 0.05])
    c.check(d.wait_log(r"state \S+ -> running", 20) is not None,
            "spotd runs (trickle test)")
    tr = Trickler(d.socket, 40)
    try:
        time.sleep(2)
        t0 = time.time()
        cp = d.spotctl("status", "--json", timeout=10)
        took = time.time() - t0
        c.check(cp.returncode == 0 and json.loads(cp.stdout or "{}").get(
            "state") == "running" and took < 5,
            "spotctl status answers during 40 trickling connections "
            "(%.2f s)" % took, cp.stderr)
        refused = [i for i, b in tr.got.items()
                   if b"too many connections from pid %d" % os.getpid() in b]
        lines_ok = all(len(tr.got[i].splitlines()) == 1 and
                       json.loads(tr.got[i])["ok"] is False for i in refused)
        c.check(len(refused) == 40 - PER_PID and lines_ok,
                "%d of 40 refused with one JSON line naming the limit "
                "(%d per process)" % (len(refused), PER_PID),
                repr({i: b[:120] for i, b in tr.got.items()})[:600])
        kept = [i for i in range(40) if i not in refused]
        time.sleep(LINE_DEADLINE + 3)
        late = [i for i in kept if i not in tr.closed_at]
        c.check(len(kept) == PER_PID and not late,
                "the trickling connections are dropped at the line deadline "
                "(%d s) although bytes keep coming" % LINE_DEADLINE,
                "still open: %s, closed at %s" % (late, tr.closed_at))
        c.check(d.wait_log(r"no complete request line in time", 1)
                is not None, "the log says why they were dropped")
    finally:
        tr.close()
    c.check(d.status() is not None, "spotd serves clients afterwards")
    d.send(signal.SIGTERM)
    d.wait_exit(40)


FLOODER = r"""
import os, socket, sys, time
path, stop, out = sys.argv[1:4]
held, refused = [], 0
def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    return s
while not os.path.exists(stop):
    while len(held) < 4:  # this process's share: taken back at once
        s = conn()
        if s is None:
            break
        held.append(s)
    for s in list(held):
        try:
            if s.recv(4096) == b"":
                raise OSError
        except BlockingIOError:
            continue
        except OSError:
            pass
        held.remove(s)  # refused or dropped: spotd closed it
        s.close()
        refused += 1
    extra = conn()  # a fifth: over this process's share
    if extra is not None:
        extra.setblocking(True)
        extra.settimeout(0.1)  # a slot of its own: no answer
        try:
            extra.recv(4096)
            refused += 1
        except OSError:
            pass
        extra.close()
    time.sleep(0.01)
with open(out, "w") as f:
    f.write("%d\n" % refused)
"""


def flood(c, wd, store, job):
    d = sl.Daemon(os.path.join(wd, "flood"), store, job,
                  trainer=["--step-sleep", 0.05])
    c.check(d.wait_log(r"state \S+ -> running", 20) is not None,
            "spotd runs (flood test)")
    stop = os.path.join(wd, "flood.stop")
    outs = [os.path.join(wd, "flood.%d" % i) for i in range(8)]
    n0 = d.err.count()
    t0 = time.time()
    procs = [subprocess.Popen([sl.PY3, "-c", FLOODER, d.socket, stop, o])
             for o in outs]
    answered, fails = 0, []
    try:
        time.sleep(2)
        for _ in range(20):
            cp = d.spotctl("status", "--json", timeout=20)
            if cp.returncode == 0 and json.loads(cp.stdout or "{}").get(
                    "state") == "running":
                answered += 1
            else:
                fails.append(cp.stderr.strip()[:160])
    finally:
        open(stop, "w").close()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    took = time.time() - t0
    refused = sum(int(sl.read_text(o) or "0") for o in outs
                  if os.path.exists(o))
    c.check(answered == 20,
            "spotctl status answers all 20 probes under a flood from its own "
            "user (%d answered)" % answered, repr(fails[:3]))
    lines = [l for l in d.err.text().splitlines()[n0:]
             if "control: refused" in l or "control: dropped" in l or
             "more clients refused" in l]
    bound = 2 * (int(took / 10) + 1) + 2
    c.check(refused >= 50 and len(lines) <= bound,
            "%d refused or dropped connections in %.0f s make %d log lines "
            "(at most %d: one per 10 s and a count)" %
            (refused, took, len(lines), bound), "\n".join(lines[:5]))
    c.check(d.status() is not None, "spotd serves clients after the flood")
    d.send(signal.SIGTERM)
    d.wait_exit(40)


def groups(c, wd, store, job):
    if os.geteuid() != 0 or not os.path.exists("/usr/bin/setpriv"):
        print("note: not root, the supplementary group check is not run")
        return
    d = sl.Daemon(os.path.join(wd, "groups"), store, job,
                  trainer=["--step-sleep", 0.05],
                  args=["--socket-group", "users"])
    c.check(d.wait_log(r"state \S+ -> running", 20) is not None,
            "spotd runs with --socket-group users")
    os.chmod(d.socket, 0o666)  # let the file mode through: the check is ours
    for p in (d.workdir, os.path.dirname(d.workdir), wd):
        os.chmod(p, 0o755)

    def as_nobody(*extra):
        return sl.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534"] +
                      list(extra) + [sl.spotctl_exe(), "status", "--json",
                                     "--socket", d.socket], timeout=20)
    cp = as_nobody("--groups=100")
    c.check(cp.returncode == 0 and json.loads(cp.stdout or "{}").get("job")
            == job, "uid 65534 with supplementary group users (100): "
            "accepted", cp.stderr)
    cp = as_nobody("--clear-groups")
    c.check(cp.returncode != 0 and "permission denied" in cp.stderr,
            "uid 65534 without it: refused", cp.stderr)
    cp = sl.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=100",
                 "--clear-groups", sl.spotctl_exe(), "status", "--socket",
                 d.socket], timeout=20)
    c.check(cp.returncode == 0, "primary group users: accepted", cp.stderr)
    d.send(signal.SIGTERM)
    d.wait_exit(40)


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("ctl-hardening")
    with tempfile.TemporaryDirectory(prefix="spotd-ctlh-") as wd, \
            sl.cleaned_up(prefix):
        second_spotd(c, wd, store, job)
        trickle(c, wd, store, job)
        flood(c, wd, store, job)
        groups(c, wd, store, job)
    c.finish()


if __name__ == "__main__":
    main()
