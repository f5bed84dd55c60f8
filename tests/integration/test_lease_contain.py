"""One trainer per job, against the real Ceph (README "What spotd
guarantees"). Every part runs two spotds of one job on this machine (node A
holds the lease, node B waits for it) and checks one thing: the step
intervals of all the trainers, read from their own logs, never overlap.

The trainer is a tree: `sh -c 'python3 STEPPER & wait'`, so the process
that steps is not the command (which dies with its guard) but a child of
it, as a launcher's workers are. A stepper names itself by its pid
namespace, its pid there and a random part (both may be reused).

(a) SIGKILL to A's guard (its pid from A's "guard pid=" line), twice, with
    --max-restarts 1: what the guard kept comes back to A, which ends it
    before it restarts the trainer or gives the lease up. Before, the
    stepper outlived its guard: A's restarted trainer and then B's stepped
    beside it.
(e) SIGKILL to A's spotd and its guard together (what `pkill -9 spotd`
    does): the trainer's pid namespace ends with the guard, and B proves A
    gone by A's lock, which the kernel drops only then. Before, the stepper
    went on under pid 1 and B took the lease over at once.
(b) A live holder on this machine keeps its lease: A runs a copy of spotd
    named spotd-1.2 (before, B took the lease over at once: "not a
    spotd"); and a spotd in a pid namespace that kept the host's /proc
    (unshare -p -f without --mount-proc) refuses to start (before, it took
    the lease over: "no longer runs").
(c) A's spotd (not its guard) SIGSTOPped past its lease's deadline: the
    guard stops the trainer at that deadline, B takes the expired lease,
    A thawed exits 73. Before, A's trainer stepped on beside B's.
(d) A's clock steps back 70 s after it took the lease (a test-build fault
    point in its clock, never the host's): A gives the lease up at its next
    renewal, whose expiry is already past on S3's clock, and B takes it.
    Before, A kept renewing with expiries in the past while B ran.
"""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

STEPPER = r"""
import json, os, sys, time
log, stop = sys.argv[1], sys.argv[2]
me = "%d:%d:%s" % (os.stat("/proc/self/ns/pid").st_ino, os.getpid(),
                   os.urandom(6).hex())
t0 = time.time()
while not os.path.exists(stop):
    time.sleep(0.05)
    t1 = time.time()
    with open(log, "a") as f:
        f.write(json.dumps({"id": me, "t0": t0, "t1": t1}) + "\n")
    t0 = t1
"""


class Node:
    """A spotd whose trainer is a stepper under a shell."""

    def __init__(self, wd, name, store, job, args=(), env=None, wrapper=None):
        self.dir = os.path.join(wd, name)
        os.makedirs(self.dir, exist_ok=True)
        self.steps = os.path.join(self.dir, "steps.log")
        self.stop = os.path.join(self.dir, "stop")
        stepper = os.path.join(self.dir, "stepper.py")
        with open(stepper, "w") as f:
            f.write(STEPPER)
        cmd = ["sh", "-c", "%s %s %s %s & wait" % (
            sl.PY3, stepper, self.steps, self.stop)]
        self.d = sl.Daemon(self.dir, store, job, cmd=cmd,
                           args=[str(a) for a in args], env=env,
                           wrapper=wrapper)

    def intervals(self):
        try:
            with open(self.steps) as f:
                return [json.loads(l) for l in f if l.endswith("\n")]
        except FileNotFoundError:
            return []

    def wait_steps(self, n, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            if len(self.intervals()) >= n:
                return True
            time.sleep(0.05)
        return False

    def guards(self):
        return [int(re.search(r"guard pid=(\d+)", l).group(1))
                for l in self.d.err.matching(r"trainer pid=\d+ started: .* "
                                             r"\(guard pid=\d+")]

    def finish(self):
        with open(self.stop, "w"):
            pass


def overlaps(nodes):
    """Pairs of step intervals of two different trainers that overlap."""
    iv = sorted((i for n in nodes for i in n.intervals()),
                key=lambda i: i["t0"])
    bad = []
    for k, a in enumerate(iv):
        for b in iv[k + 1:]:
            if b["t0"] >= a["t1"]:
                break
            if b["id"] != a["id"]:
                bad.append((a, b))
    return bad


def check_one_trainer(c, tag, nodes):
    bad = overlaps(nodes)
    pids = {i["id"] for n in nodes for i in n.intervals()}
    c.check(len(pids) >= 2 and not bad,
            "%s: %d trainers, no two ever stepped at once" % (tag, len(pids)),
            "%d overlapping intervals, first %r" % (len(bad), bad[:1]))


def reap_steppers(nodes):
    """An escaped stepper of our pid namespace (the code before) is
    SIGKILLed here; one of a namespace of its own is gone with it."""
    ours = os.stat("/proc/self/ns/pid").st_ino
    for n in nodes:
        n.finish()
        for ident in {i["id"] for i in n.intervals()}:
            ns, pid = (int(x) for x in ident.split(":")[:2])
            if ns != ours:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def b_finishes(c, tag, b, nodes):
    """B's trainer stops, B exits 0; then the check of every part."""
    b.finish()
    c.check(b.d.wait_exit(60) == 0, "%s: B finishes" % tag)
    check_one_trainer(c, tag, nodes)


def wait_waiting(c, tag, b):
    c.check(b.d.wait_log(r"waiting for the job lease", 60) is not None,
            "%s: B waits for the lease" % tag, b.d.log()[-1500:])


def two_nodes(c, tag, wd, store, job, nodes, a_args=(), b_args=(),
              a_env=None, a_wrapper=None, wait=True):
    """A, once its trainer steps, then B (waiting for the lease unless not
    wait); both in nodes (which the caller's finally reaps)."""
    a = Node(wd, tag + "-a", store, job, args=a_args, env=a_env,
             wrapper=a_wrapper)
    nodes.append(a)
    c.check(a.wait_steps(3), "%s: A's trainer steps" % tag)
    b = Node(wd, tag + "-b", store, job, args=b_args)
    nodes.append(b)
    if wait:
        wait_waiting(c, tag, b)
    return a, b


@contextlib.contextmanager
def pair(c, tag, wd, store, job, **kw):
    """two_nodes() as (A, B, nodes); whatever happens, A is thawed if it was
    stopped and every stepper reaped at the end."""
    nodes = []
    try:
        yield two_nodes(c, tag, wd, store, job, nodes, **kw) + (nodes,)
    finally:
        if nodes and nodes[0].d.running():
            os.kill(nodes[0].d.pid, signal.SIGCONT)
        reap_steppers(nodes)


def part_a(c, wd, store, job):
    with pair(c, "a", wd, store, job,
              a_args=["--max-restarts", 1, "--restart-backoff", 1]) \
            as (a, b, nodes):
        for k in (0, 1):
            g = a.guards()
            c.check(len(g) == k + 1, "a: A's guard #%d known" % (k + 1),
                    repr(g))
            if len(g) != k + 1:
                return
            os.kill(g[-1], signal.SIGKILL)
            if k == 0:
                c.check(a.d.wait_log(r"guard pid=\d+", 60,
                                     a.d.err.count()) is not None,
                        "a: A restarts its trainer")
                first = {i["id"] for i in a.intervals()}
                c.check(a.wait_steps(len(a.intervals()) + 5, 60),
                        "a: A's second trainer steps")
                new = {i["id"] for i in a.intervals()} - first
                c.check(len(new) == 1, "a: a second stepper", repr(new))
        c.check(b.wait_steps(5, 90), "b: B took the lease, its trainer steps")
        time.sleep(1.0)  # an escaped stepper would step on meanwhile
        a.d.wait_exit(30)
        b_finishes(c, "a", b, nodes)


def part_e(c, wd, store, job):
    with pair(c, "e", wd, store, job) as (a, b, nodes):
        g = a.guards()
        c.check(len(g) == 1, "e: A's guard known", repr(g))
        for pid in [a.d.pid] + g:  # `pkill -9 spotd`: both at once
            os.kill(pid, signal.SIGKILL)
        a.d.wait_exit(30)
        c.check(b.wait_steps(5, 90), "e: B took the lease, its trainer "
                "steps")
        c.check(bool(b.d.err.matching(r"gone \(pid %d and its guard hold "
                                      r"its lock no more\)" % a.d.pid)),
                "e: B proved A gone by its lock", b.d.log()[-2000:])
        time.sleep(1.0)  # an escaped stepper would step on meanwhile
        b_finishes(c, "e", b, nodes)


def part_b(c, wd, store, job):
    copy = os.path.join(wd, "spotd-1.2")
    shutil.copy(sl.spotd_exe(), copy)
    os.chmod(copy, 0o755)
    wrap = [sl.PY3, "-c",
            "import os, sys; os.execv(%r, [%r] + sys.argv[2:])" % (copy, copy)]
    with pair(c, "b", wd, store, job, a_wrapper=wrap) as (a, b, nodes):
        if shutil.which("unshare"):
            u = Node(wd, "b-u", store, job,
                     wrapper=["unshare", "--pid", "--fork", "--"])
            nodes.append(u)
            rc = u.d.wait_exit(30)
            if u.d.err.matching(r"unshare: .*(Operation not permitted|"
                                r"cannot)"):
                print("skip: no pid namespace here")
            else:
                c.check(rc not in (0, -9) and u.d.err.matching(
                    r"/proc is not this pid namespace's"),
                    "b: a spotd in a pid namespace with the host's /proc "
                    "refuses to start", "rc=%s %s" % (rc, u.d.log()[-1500:]))
        a.wait_steps(len(a.intervals()) + 20, 30)  # B would take over now
        a.finish()
        c.check(a.d.wait_exit(60) == 0, "b: A finishes, releases the lease")
        c.check(b.wait_steps(5, 60), "b: then B's trainer steps")
        b_finishes(c, "b", b, nodes)


def part_c(c, wd, store, job):
    with pair(c, "c", wd, store, job, a_args=["--lease-ttl", 6],
              b_args=["--lease-ttl", 6]) as (a, b, nodes):
        os.kill(a.d.pid, signal.SIGSTOP)
        c.check(b.wait_steps(10, 90), "c: B took the lease of the stopped "
                "spotd, its trainer steps")
        os.kill(a.d.pid, signal.SIGCONT)
        rc = a.d.wait_exit(60)
        c.check(rc == 73, "c: A, thawed, finds its lease lost: exit 73",
                "rc=%s" % rc)
        c.check(bool(a.d.err.matching(r"local deadline passed without a "
                                      r"renewal from spotd: stopped")),
                "c: A's guard stopped the trainer at the lease's deadline",
                a.d.log()[-2000:])
        b_finishes(c, "c", b, nodes)


def part_d(c, wd, store, job):
    with pair(c, "d", wd, store, job, a_args=["--lease-ttl", 9],
              b_args=["--lease-ttl", 9],
              a_env={"SPOTD_FAULT_CLOCK_STEP_MS": "-70000@4000"},
              wait=False) as (a, b, nodes):
        c.check(b.wait_steps(10, 90), "d: B took the lease, its trainer "
                "steps")
        rc = a.d.wait_exit(60)
        c.check(rc == 73, "d: A gave the lease up: exit 73", "rc=%s" % rc)
        c.check(bool(a.d.err.matching(r"already past on S3's clock")),
                "d: A says why", a.d.log()[-2000:])
        b_finishes(c, "d", b, nodes)


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("lease-contain")
    root = prefix[:-len("job/")]
    parts = sys.argv[1:] or ["a", "e", "b", "c", "d"]
    with sl.cleaned_up(root):
        with tempfile.TemporaryDirectory(prefix="spotd-contain-") as wd:
            for p in parts:
                t0 = time.time()
                globals()["part_" + p](c, wd, store, job + "-" + p)
                print("part %s: %.1f s" % (p, time.time() - t0))
    c.finish()


if __name__ == "__main__":
    main()
