"""Helpers for the metadata integration tests: run spotd-emulate and
the meta_watch driver (lib/meta), trigger events, read their lines."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spotlib import EXPECTED, expect  # noqa: E402,F401 - expect for the tests

BUILD = os.environ.get("SPOT_BUILDDIR", "build")
SPOTCTL = os.environ.get("SPOTCTL", os.path.join(BUILD, "client", "spotctl"))
SPOTD_EMULATE = os.environ.get(
    "SPOTD_EMULATE", os.path.join(BUILD, "emulate", "spotd-emulate"))
META_WATCH = os.environ.get(
    "META_WATCH", os.path.join(BUILD, "tests", "integration", "meta_watch"))


STARTED = []  # processes this test started, killed if a test fails


def log(*a):
    print(*a, flush=True)


class Lines:
    """Collects a pipe's lines with their arrival time."""

    def __init__(self, pipe):
        self.lines = []
        self.cv = threading.Condition()
        self.t = threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self.t.start()

    def _run(self, pipe):
        for raw in pipe:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self.cv:
                self.lines.append((time.time(), line))
                self.cv.notify_all()

    def wait(self, pattern, timeout, start=0):
        """First line at index >= start matching pattern: (index, line)."""
        rx = re.compile(pattern)
        end = time.time() + timeout
        with self.cv:
            while True:
                for i in range(start, len(self.lines)):
                    if rx.search(self.lines[i][1]):
                        return i, self.lines[i][1]
                left = end - time.time()
                if left <= 0:
                    return None, None
                self.cv.wait(left)

    def matching(self, pattern):
        rx = re.compile(pattern)
        with self.cv:
            return [l for _, l in self.lines if rx.search(l)]

    def count(self):
        with self.cv:
            return len(self.lines)


class Emulator:
    def __init__(self, provider, *args):
        self.p = subprocess.Popen(
            [SPOTD_EMULATE, "--provider", provider, "--port", "0"] +
            list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        STARTED.append(self.p)
        self.out = Lines(self.p.stdout)
        self.err = Lines(self.p.stderr)
        _, line = self.out.wait(r"^listening on ", 10)
        if line is None:
            self.p.kill()
            raise RuntimeError("emulator did not start")
        self.url = line.split()[-1]

    def request(self, path, method="GET", headers=None, data=None):
        req = urllib.request.Request(self.url + path, method=method,
                                     headers=headers or {}, data=data)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), dict(e.headers)

    def control(self, what, **params):
        q = "&".join("%s=%s" % kv for kv in params.items())
        st, body, _ = self.request("/__emulate/" + what + ("?" + q if q else ""),
                                   method="POST", data=b"")
        expect(st == 200, (what, st, body))

    def state(self):
        st, body, _ = self.request("/__emulate/state")
        expect(st == 200)
        return json.loads(body)

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(15)
        expect(rc == 0, "emulator exit status %d" % rc)


class Watch:
    def __init__(self, url, provider="auto", *args):
        self.p = subprocess.Popen(
            [META_WATCH, "--provider", provider, "--url", url] + list(args),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        STARTED.append(self.p)
        self.out = Lines(self.p.stdout)
        self.err = Lines(self.p.stderr)
        _, line = self.out.wait(r"^provider ", 10)
        expect(line is not None and line != "provider none", line)

    def notice(self, timeout, start=0, pattern=""):
        i, line = self.out.wait(r"^notice .*" + pattern, timeout, start)
        if line is None:
            return None, None
        return i, dict(kv.split("=", 1) for kv in line.split()[1:])

    def healthy(self, timeout):
        """Waits until the last warning line is "warning-cleared" (or there
        never was a warning)."""
        end = time.time() + timeout
        while time.time() < end:
            w = self.out.matching(r"^warning")
            if not w or w[-1] == "warning-cleared":
                return True
            time.sleep(0.1)
        return False

    def notices(self):
        return self.out.matching(r"^notice ")

    def stop(self):
        """Stops the watcher; checks the exit and uv_loop_close() == 0."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(15)
        _, line = self.out.wait(r"^loop_close=", 5)
        expect(line == "loop_close=0", line)
        expect(rc == 0, "meta_watch exit status %d" % rc)


FAULT_LOGGED = {
    "throttle": r"HTTP 503",
    "malformed": r"malformed",
    "reset": r"meta [^:]*: (?!HTTP 503|malformed).*(failure|consecutive)",
}


def cycle_faults(e, w, **mixed):
    """Has emulator e inject each of throttle, malformed and reset alone
    until watcher w has logged a failure of that kind (at least 1.5 s,
    at most 15: the watcher backs off, and a loaded machine is slow), then
    the faults at the rates in mixed for 2 s."""
    for fault in ("throttle", "malformed", "reset"):
        mark = w.err.count()
        e.control("fault", clear="1", **{fault: "1"})
        time.sleep(1.5)
        _, line = w.err.wait(FAULT_LOGGED[fault], 15, mark)
        expect(line is not None, "no %s failure logged" % fault)
    e.control("fault", **mixed)
    time.sleep(2)


def stats(name, values):
    values = sorted(values)
    med = values[len(values) // 2]
    log("%s: n=%d min=%.0f median=%.0f max=%.0f ms" %
        (name, len(values), values[0], med, values[-1]))
    return med


def run(tests):
    """Runs each test function; one fails by raising (expect()) or by
    checking nothing, and so does a run of no tests."""
    failed = 0
    for t in tests:
        log("== %s" % t.__name__)
        try:
            before = EXPECTED[0]
            t()
            if EXPECTED[0] == before:
                raise RuntimeError("no check ran")
            log("ok %s" % t.__name__)
        except Exception as e:  # noqa: BLE001 - report and go on
            failed += 1
            log("FAIL %s: %r" % (t.__name__, e))
            import traceback
            traceback.print_exc(file=sys.stdout)
        finally:
            for p in STARTED:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            STARTED.clear()
    log("%d passed, %d failed" % (len(tests) - failed, failed))
    sys.exit(1 if failed or not tests else 0)
