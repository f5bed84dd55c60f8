"""Shared by the end-to-end tests (test_e2e_*.py): the real PyTorch example
(examples/pytorch/train.py) under `spotd run`, each "node" a fresh working
folder with its own `spotd-emulate --provider aws`, relaunched through
`spotctl relaunch --backend exec`, against the Ceph that tools/test starts.

Also: the uninterrupted reference run, folder comparison, and a small
loopback proxy in front of Ceph that can slow uploads down (a slow link).
Nothing here contacts a non-loopback address: the EC2 metadata lookup is
disabled and every metadata URL is an emulator on 127.0.0.1.
"""
import http.client
import http.server
import os
import random
import re
import subprocess
import time
import urllib.parse

import spotlib as sl

PY3 = sl.PY3
TRAIN = sl.srcdir_path("examples", "pytorch", "train.py")
MARKER = "SPOTD_COMPLETE"
CKPT_FILES = ("model.pt", "optimizer.pt", "trainer.pt")

STEP_RE = re.compile(r"^step (\d+) loss (\S+)$")
SAVED_RE = re.compile(r"^saved (\S+) at step (\d+) \((\w+),")
RESUMED_RE = re.compile(r"^resumed from (\S+) at step (\d+)$")


def need_torch():
    cp = subprocess.run([PY3, "-c", "import torch"], capture_output=True,
                        text=True)
    if cp.returncode != 0:
        sl.skip("%s cannot import torch: %s" % (PY3, cp.stderr.strip()[-200:]))


def test_seed(name):
    """The seed of this run's random choices, printed first; SPOT_TEST_SEED
    replays a run."""
    seed = int(os.environ.get("SPOT_TEST_SEED") or
               random.SystemRandom().randrange(1 << 31))
    print("%s: seed=%d (SPOT_TEST_SEED=%d replays it)" % (name, seed, seed),
          flush=True)
    return random.Random(seed)


def reference(tmp, train_args):
    """An uninterrupted run of train.py without spotd: (checkpoint folder
    root, {step: loss}). Fails the test on a non-zero exit."""
    ckpt = os.path.join(tmp, "reference")
    env = dict(os.environ, SPOTD_CKPT_DIR=ckpt, SPOTD_JOB="reference")
    env.pop("SPOTD_RESUME_DIR", None)
    t0 = time.monotonic()
    cp = subprocess.run([PY3, TRAIN] + list(train_args), env=env,
                        capture_output=True, text=True, timeout=240)
    if cp.returncode != 0:
        print("FAIL reference run exited %d\n%s%s" % (cp.returncode,
                                                     cp.stdout[-2000:],
                                                     cp.stderr[-2000:]))
        raise SystemExit(1)
    losses = {int(m.group(1)): m.group(2)
              for m in map(STEP_RE.match, cp.stdout.splitlines()) if m}
    print("     uninterrupted reference run: %.1f s" % (time.monotonic() - t0),
          flush=True)
    return ckpt, losses


def same_checkpoint(a, b):
    """None when checkpoint folders a and b hold the same files byte for
    byte (the empty SPOTD_COMPLETE marker aside), else why not."""
    try:
        fa = sorted(f for f in os.listdir(a) if f != MARKER)
        fb = sorted(f for f in os.listdir(b) if f != MARKER)
    except OSError as e:
        return str(e)
    if fa != fb:
        return "files differ: %s vs %s" % (fa, fb)
    if sorted(fa) != sorted(CKPT_FILES):
        return "unexpected files %s" % fa
    for f in fa:
        if not sl.same_file(os.path.join(a, f), os.path.join(b, f)):
            return "%s differs" % f
    return None


def restore_from_store(store_job, dest, name=None):
    """`spotctl restore` of a committed checkpoint (LATEST by default) into
    dest; returns the CompletedProcess."""
    args = ["restore", store_job, dest]
    if name:
        args += ["--name", name]
    return sl.spotctl(*args, timeout=120)


def _wait_lines(log, pred, timeout, start=0):
    """The first (index, time, line) of LineLog log at index >= start with
    pred(line) true, or None after timeout."""
    end = time.time() + timeout
    with log.cv:
        while True:
            for i in range(start, len(log.lines)):
                t, line = log.lines[i]
                if pred(line):
                    return i, t, line
            left = end - time.time()
            if left <= 0:
                return None
            log.cv.wait(min(left, 0.5))


class Node:
    """One "machine": a fresh working folder (must not exist yet), its own
    metadata emulator, `spotd run` of train.py with the relaunch step
    `spotctl relaunch --backend exec -- <hook>` (the hook records the
    SPOTD_* variables it got)."""

    def __init__(self, tmp, name, store, job, train_args, spotd_args=(),
                 endpoint=None):
        self.name = name
        self.wd = os.path.join(tmp, name)
        os.makedirs(self.wd)  # a fresh node: never reused
        self.emu = sl.EmulatorProc("aws")
        hook, self.hook_out = sl.relaunch_hook(self.wd)
        relaunch = "%s relaunch --backend exec --timeout 20 --state-dir %s -- %s" \
            % (sl.spotctl_exe(), os.path.join(self.wd, "relaunch-state"), hook)
        args = ["--relaunch", relaunch, "--grace", "5"] + list(spotd_args)
        if endpoint:
            args += ["--endpoint", endpoint]
        self.d = sl.Daemon(self.wd, store, job, cmd=[PY3, TRAIN] +
                           [str(a) for a in train_args], args=args,
                           provider="aws", metadata_url=self.emu.url,
                           poll_interval="200ms", echo=False)
        self.ckpt_dir = self.d.ckpt_dir
        self.notice_t = None
        self.rc = None

    # trainer output (spotd's stdout) ---------------------------------
    def wait_step(self, n, timeout=90):
        """Waits until step >= n is logged; returns that step or None."""
        def ok(line):
            m = STEP_RE.match(line)
            return m is not None and int(m.group(1)) >= n
        got = _wait_lines(self.d.out, ok, timeout)
        return int(STEP_RE.match(got[2]).group(1)) if got else None

    def losses(self):
        return {int(m.group(1)): m.group(2)
                for m in (STEP_RE.match(l) for _, l in self.d.out.lines) if m}

    def saved(self):
        """[(name, step, why)] of the trainer's 'saved' lines."""
        return [(m.group(1), int(m.group(2)), m.group(3))
                for m in (SAVED_RE.match(l) for _, l in self.d.out.lines) if m]

    def resumed(self, timeout=60):
        got = _wait_lines(self.d.out, lambda l: RESUMED_RE.match(l) is not None,
                          timeout)
        if not got:
            return None
        m = RESUMED_RE.match(got[2])
        return m.group(1), int(m.group(2))

    def last_step_before(self, t):
        """The highest step the trainer had logged by time t."""
        best = 0
        for lt, line in list(self.d.out.lines):
            m = STEP_RE.match(line)
            if m and lt <= t:
                best = max(best, int(m.group(1)))
        return best

    # spotd ------------------------------------------------------------
    def log_time(self, pattern):
        return self.d.err.time_of(pattern)

    def wait_log(self, pattern, timeout=30):
        return self.d.wait_log(pattern, timeout)

    def committed_lines(self):
        """[(name, raw, stored, secs)] from spotd's commit lines."""
        rx = re.compile(r"committed checkpoint name=(\S+) files=\d+ raw=(\d+) "
                        r"stored=(\d+) ratio=\S+ in (\S+) s")
        out = []
        for line in self.d.err.matching(rx.pattern):
            m = rx.search(line)
            out.append((m.group(1), int(m.group(2)), int(m.group(3)),
                        float(m.group(4))))
        return out

    def notice(self, deadline):
        """The emulator publishes a spot interruption notice now."""
        self.notice_t = time.time()
        self.emu.control("notice", deadline=deadline)

    def relaunches(self):
        return sl.read_jsonl(self.hook_out)

    def finish(self, timeout=120):
        self.rc = self.d.wait_exit(timeout)
        return self.rc

    def stop(self):
        self.emu.stop()
        if self.d.running():
            self.d.send(15)
            self.d.wait_exit(30)

    def dump(self, lines=40):
        """spotd's log and the trainer's last lines, for a failure report."""
        err = self.d.err.text().splitlines()
        out = self.d.out.text().splitlines()
        return ("--- %s: spotd\n%s\n--- %s: trainer (last %d lines)\n%s"
                % (self.name, "\n".join(err[-80:]), self.name, lines,
                   "\n".join(out[-lines:])))


def check_no_step_lost(c, node, what):
    """After a notice: the checkpoint the trainer saved on the signal holds
    every step it had completed when spotd signalled it (the step in
    flight may be in it too). Returns (checkpoint name, step) or None."""
    t_req = node.log_time(r"checkpoint requested \(aws-spot-terminate\)")
    sig = [s for s in node.saved() if s[2] == "signal"]
    if not c.check(t_req is not None and len(sig) == 1,
                   what + ": spotd signalled the trainer, which saved once",
                   node.dump()):
        return None
    before = node.last_step_before(t_req)
    name, step, _ = sig[0]
    c.check(step >= before, what + ": %s holds every step done before the "
            "signal (%d)" % (name, before), node.dump())
    return name, step


def check_steps(c, segments, ref, steps):
    """segments: [(node, first step it ran)]. Each node's step log continues
    where the checkpoint it resumed from left off; together they cover
    1..steps with the uninterrupted run's loss at every step."""
    merged = {}
    for i, (node, first) in enumerate(segments):
        upto = segments[i + 1][1] if i + 1 < len(segments) else steps
        got = node.losses()
        c.check(min(got or [0]) == first + 1,
                "%s: first step is %d" % (node.name, first + 1),
                "first %s" % min(got or [0]))
        for s in range(first + 1, upto + 1):
            if s in got:
                merged[s] = got[s]
    c.check(sorted(merged) == list(range(1, steps + 1)),
            "the nodes' step logs cover steps 1..%d with no gap" % steps,
            "missing: %s" % sorted(set(range(1, steps + 1)) - set(merged))[:20])
    diff = [s for s in sorted(merged) if merged[s] != ref.get(s)]
    c.check(not diff, "every step's loss equals the uninterrupted run's",
            "first differing steps: %s" % diff[:10])


class ThrottleProxy:
    """A loopback HTTP proxy in front of the S3 server. It forwards every
    request unchanged (Host included, so SigV4 still verifies); while
    `rate` is set (bytes/s) it reads request bodies no faster than that: a
    slow link for uploads. Restores are not slowed."""

    HOP = {"connection", "keep-alive", "transfer-encoding", "expect",
           "proxy-connection"}

    def __init__(self, upstream):
        up = urllib.parse.urlsplit(upstream)
        self.rate = None
        self.slowed = 0  # requests slowed
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def read_body(self, n):
                chunks, left = [], n
                t0 = time.monotonic()
                slow = proxy.rate is not None and n > 0
                if slow:
                    proxy.slowed += 1
                while left > 0:
                    b = self.rfile.read(min(left, 16384))
                    if not b:
                        raise ConnectionError("client went away")
                    chunks.append(b)
                    left -= len(b)
                    if slow and proxy.rate:
                        ahead = (n - left) / proxy.rate - (time.monotonic() - t0)
                        if ahead > 0:
                            time.sleep(ahead)
                return b"".join(chunks)

            def handle_one(self):
                try:
                    body = self.read_body(int(self.headers.get("Content-Length")
                                              or 0))
                    conn = http.client.HTTPConnection(up.hostname, up.port,
                                                      timeout=120)
                    conn.putrequest(self.command, self.path, skip_host=True,
                                    skip_accept_encoding=True)
                    for k, v in self.headers.items():
                        if k.lower() not in ThrottleProxy.HOP:
                            conn.putheader(k, v)
                    conn.endheaders(body if body else None)
                    resp = conn.getresponse()
                    data = resp.read()
                    conn.close()
                    head = self.command == "HEAD"
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in ThrottleProxy.HOP and \
                                (head or k.lower() != "content-length"):
                            self.send_header(k, v)
                    if not head:
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                except (OSError, ConnectionError, http.client.HTTPException):
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        self.server, self.url = sl.serve_http(Handler)

    def close(self):
        sl.stop_http(self.server)
