"""Small shared helpers for the integration test scripts (python3 stdlib).

Keep this generic: environment access, running a command with a timeout,
comparing files, skipping, and collecting check results.
"""
import filecmp
import os
import subprocess
import sys

SKIP = 77

SRCDIR = os.environ.get(
    "SPOT_SRCDIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
BUILDDIR = os.environ.get("SPOT_BUILDDIR", os.path.join(SRCDIR, "build"))
PY3 = "/usr/bin/python3"


def skip(why):
    """Exit with meson's skip status."""
    print("SKIP: " + why)
    sys.exit(SKIP)


def need_env(*names):
    """The values of names, skipping the test when the first is unset (the
    server was not started) and failing when a later one is missing."""
    if not os.environ.get(names[0]):
        skip(names[0] + " is not set (run under tests/s3server.sh run DIR -- ...)")
    values = []
    for n in names:
        v = os.environ.get(n)
        if v is None:
            print("FAIL: %s is not set" % n)
            sys.exit(1)
        values.append(v)
    return values


def builddir_path(*parts):
    return os.path.join(BUILDDIR, *parts)


def srcdir_path(*parts):
    return os.path.join(SRCDIR, *parts)


def run(argv, timeout=60, env=None, check=False, input=None):
    """Runs argv and returns a CompletedProcess with text stdout/stderr.
    A timeout is a test failure, reported as returncode -9."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                            env=full_env, input=input)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        cp = subprocess.CompletedProcess(argv, -9, out, err + "\n(timed out)")
    if check and cp.returncode != 0:
        print("command failed (%d): %s\n%s%s" % (cp.returncode, " ".join(argv),
                                                cp.stdout, cp.stderr))
        sys.exit(1)
    return cp


def same_file(a, b):
    return filecmp.cmp(a, b, shallow=False)


class Checks:
    """Collects named checks; finish() exits 0 or 1. A script whose checks
    never ran (an early return, a loop over nothing) fails: passing means
    that something was checked."""

    def __init__(self):
        self.failed = []
        self.ran = 0

    def check(self, cond, what, detail=""):
        self.ran += 1
        if cond:
            print("ok   " + what)
        else:
            print("FAIL " + what + (("\n     " + detail.replace("\n", "\n     "))
                                     if detail else ""))
            self.failed.append(what)
        return cond

    def finish(self):
        if self.failed:
            print("%d check(s) failed: %s" % (len(self.failed), ", ".join(self.failed)))
            sys.exit(1)
        if self.ran == 0:
            print("FAIL no check ran")
            sys.exit(1)
        print("all %d checks passed" % self.ran)
        sys.exit(0)


class CheckFailed(Exception):
    """A failed expect()."""


EXPECTED = [0]  # expect() calls so far, for runners that count them


def expect(cond, detail=""):
    """Raises CheckFailed(detail) unless cond. What tests use instead of a
    bare `assert`, which python -O (PYTHONOPTIMIZE) removes."""
    EXPECTED[0] += 1
    if not cond:
        raise CheckFailed(detail if isinstance(detail, str) else repr(detail))


# ------------------------------------------------------------------ store
# Helpers of the checkpoint store tests (test_store_*.py): run spotctl
# against the test S3 server, read the store independently with boto3,
# make checkpoint-like files, compare folders.

_FAKE_S3 = None


def store_env():
    """Skips without a server; returns (endpoint, bucket) and sets the
    variables spotctl and boto3 need. The EC2 metadata lookup is disabled:
    169.254.169.254 is not loopback and must never be contacted.

    With SPOT_TEST_FAKE_S3=1 the server is fakes3.FakeS3 in this process
    (loopback, in memory): the quick loop of the daemon's state-machine
    tests, which do not need S3 semantics (README "Building and testing")."""
    global _FAKE_S3
    if os.environ.get("SPOT_TEST_FAKE_S3") == "1" and _FAKE_S3 is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import fakes3
        _FAKE_S3 = fakes3.FakeS3("spotd-test")
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)
        os.environ.update(SPOT_TEST_S3_ENDPOINT=_FAKE_S3.url,
                          SPOT_TEST_S3_BUCKET=_FAKE_S3.bucket,
                          AWS_ACCESS_KEY_ID="fake", AWS_SECRET_ACCESS_KEY="fake",
                          AWS_REGION="us-east-1")
    endpoint, bucket = need_env("SPOT_TEST_S3_ENDPOINT", "SPOT_TEST_S3_BUCKET")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    private_relaunch_state()
    return endpoint, bucket


def private_relaunch_state():
    """Points SPOTCTL_STATE_DIR at a folder of this test's own (removed at
    exit) unless the test chose one. `spotctl relaunch` keeps one marker per
    preemption there, named by job, checkpoint, reason and deadline; in the
    machine-wide default (/tmp/spotd-relaunch-UID) a test running at the
    same time with the same names would find it and skip its relaunch."""
    if os.environ.get("SPOTCTL_STATE_DIR"):
        return
    import atexit
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="spotd-test-relaunch-")
    atexit.register(shutil.rmtree, d, True)
    os.environ["SPOTCTL_STATE_DIR"] = d


def free_port():
    """A loopback port free right now (bound to port 0, then closed)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_one_node():
    """torchrun's options for a single-node job with its store on a free
    loopback port. --standalone puts it on localhost:29400, which any other
    torchrun on the machine (a test running at the same time) may hold.
    The static rendezvous hands the workers MASTER_ADDR=127.0.0.1; a c10d
    one hands them the machine's host name (torch 1.13), and where that
    does not resolve (a container whose /etc/hosts lacks it) the workers
    never reach the store and the job hangs."""
    return ["--nnodes", "1", "--node_rank", "0", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port())]


def unique_job(test):
    """A job root nobody else uses: (url, key_prefix). Pid and time make
    reruns and parallel runs not collide."""
    import time
    _, bucket = store_env()
    prefix = "itest-store/%s-%d-%d" % (test, os.getpid(), int(time.time() * 1000))
    return "s3://%s/%s/job" % (bucket, prefix), prefix + "/job/"


def spotctl(*args, timeout=120, env=None):
    exe = os.environ.get("SPOTCTL") or builddir_path("client", "spotctl")
    return run([exe] + [str(a) for a in args], timeout=timeout, env=env)


def spotctl_popen(*args, **kw):
    exe = os.environ.get("SPOTCTL") or builddir_path("client", "spotctl")
    return subprocess.Popen([exe] + [str(a) for a in args], **kw)


_S3 = None


def s3():
    """A boto3 client: a reader and writer that is not lib/s3."""
    global _S3
    if _S3 is None:
        import boto3
        from botocore.config import Config
        _S3 = boto3.client(
            "s3", endpoint_url=os.environ["SPOT_TEST_S3_ENDPOINT"],
            region_name=os.environ.get("AWS_REGION", "us-east-1"),
            config=Config(s3={"addressing_style": "path"},
                          retries={"max_attempts": 2}))
    return _S3


def s3_get(key):
    return s3().get_object(Bucket=os.environ["SPOT_TEST_S3_BUCKET"],
                           Key=key)["Body"].read()


def manifest_key(root, name, rel):
    """The object key of file rel of committed checkpoint name (root ends
    with '/'): the manifest names it (a per-attempt folder, store.h), or
    the pack it is in (a small file, manifest.h "Packs")."""
    import json
    m = json.loads(s3_get(root + "checkpoints/%s/MANIFEST.json" % name))
    for f in m["files"]:
        if f["path"] == rel:
            return root + "checkpoints/%s/%s" % (name, f.get("key") or f["pack"])
    raise KeyError(rel)


def s3_put(key, data):
    s3().put_object(Bucket=os.environ["SPOT_TEST_S3_BUCKET"], Key=key, Body=data)


def s3_keys(prefix):
    """Sorted keys under prefix."""
    pages = s3().get_paginator("list_objects_v2").paginate(
        Bucket=os.environ["SPOT_TEST_S3_BUCKET"], Prefix=prefix)
    return sorted(o["Key"] for p in pages for o in p.get("Contents", []))


def s3_uploads(prefix):
    """[(key, upload_id, parts)] of the multipart uploads under prefix."""
    b = os.environ["SPOT_TEST_S3_BUCKET"]
    r = s3().list_multipart_uploads(Bucket=b, Prefix=prefix)
    out = []
    for u in r.get("Uploads", []):
        try:
            parts = len(s3().list_parts(Bucket=b, Key=u["Key"],
                                        UploadId=u["UploadId"]).get("Parts", []))
        except Exception:  # noqa: BLE001 - aborted meanwhile
            parts = 0
        out.append((u["Key"], u["UploadId"], parts))
    return out


def s3_cleanup(prefix):
    """Deletes everything under prefix and aborts its uploads (best effort)."""
    b = os.environ["SPOT_TEST_S3_BUCKET"]
    try:
        for key, uid, _ in s3_uploads(prefix):
            s3().abort_multipart_upload(Bucket=b, Key=key, UploadId=uid)
        keys = s3_keys(prefix)
        for i in range(0, len(keys), 1000):
            s3().delete_objects(Bucket=b, Delete={
                "Objects": [{"Key": k} for k in keys[i:i + 1000]]})
    except Exception as e:  # noqa: BLE001
        print("cleanup of %s: %r" % (prefix, e))


def write_gaussian(path, nbytes, dtype="float32", seed=1):
    """nbytes of N(0, 1) values: fp32, or bf16 (the top half of fp32)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    chunk = 16 << 20
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(chunk, left)
            if dtype == "bfloat16":
                v = rng.standard_normal((n + 1) // 2, dtype=np.float32)
                b = (v.view(np.uint32) >> 16).astype(np.uint16).tobytes()
            else:
                b = rng.standard_normal((n + 3) // 4, dtype=np.float32).tobytes()
            f.write(b[:n])
            left -= n


def write_random(path, nbytes):
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(16 << 20, left)
            f.write(os.urandom(n))
            left -= n


def tree(root):
    """{relative path: (kind, mode, size)} of everything under root."""
    import stat
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
            out[os.path.relpath(p, root)] = (
                kind, stat.S_IMODE(st.st_mode), st.st_size if kind == "file" else 0)
    return out


def read_text(path):
    """The text of the file at path; "" when it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def check_restore(c, url, expect, dst, what, *args, timeout=120):
    """Runs `spotctl restore URL DST ARGS...` and checks (as what) that it
    succeeds and that DST is then the same tree as expect. Returns the
    completed process."""
    cp = spotctl("restore", url, dst, *args, timeout=timeout)
    ok, detail = same_tree(expect, dst) if cp.returncode == 0 else (False, "")
    c.check(cp.returncode == 0 and ok, what, cp.stdout + cp.stderr + detail)
    return cp


def same_tree(a, b):
    """(ok, detail): same paths, kinds, modes and bytes."""
    ta, tb = tree(a), tree(b)
    if ta != tb:
        diff = sorted(set(ta.items()) ^ set(tb.items()))
        return False, "trees differ: %r" % diff[:10]
    for rel, (kind, _, _) in ta.items():
        if kind == "file" and not same_file(os.path.join(a, rel), os.path.join(b, rel)):
            return False, "%s differs" % rel
    return True, ""


def cached_pages(path, length):
    """Pages of the first length bytes of path in the page cache
    (mincore(2) of a mapping, which reads nothing), or None where that
    cannot be told."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                          ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, length, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        vec = ctypes.create_string_buffer((length + page - 1) // page)
        r = libc.mincore(addr, length, vec)
        libc.munmap(addr, length)
        return None if r != 0 else sum(b & 1 for b in vec.raw)
    finally:
        os.close(fd)


def direct_io_cache_free(folder):
    """Whether O_DIRECT writes in folder leave the page cache alone: the
    file system takes O_DIRECT and is not tmpfs (whose pages are the
    file)."""
    fs = run(["stat", "-f", "-c", "%T", folder]).stdout.strip()
    if fs in ("tmpfs", "ramfs"):
        return False
    probe = os.path.join(folder, ".direct-probe")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError:
        return False
    finally:
        if os.path.exists(probe):
            os.unlink(probe)
    return True


def leftovers_next_to(path):
    """Temporary restore folders left next to path."""
    parent = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(os.path.abspath(path))
    return [n for n in os.listdir(parent) if n.startswith("." + base + ".spotd-restore")]


# ----------------------------------------------------------------- daemon
# Helpers of the daemon tests (test_daemon_*.py, test_systemd_*.py): run
# spotd on a temporary socket and checkpoint folder with a command (the
# fake trainer by default), follow its log lines, run spotd-emulate.
# Every process started here is remembered and killed (by its own pid) by
# kill_started(), which the tests call in a finally block.

import contextlib as _contextlib
import json as _json
import re as _re
import signal as _signal
import threading as _threading
import time as _time


def serve_http(handler):
    """Serves handler (an http.server.BaseHTTPRequestHandler class) on
    127.0.0.1, a free port, from a daemon thread, a thread per request.
    Returns (server, url); stop_http(server) stops it."""
    import http.server
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    _threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, "http://127.0.0.1:%d" % server.server_address[1]


def stop_http(server):
    server.shutdown()
    server.server_close()

FAKE_TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "fake_trainer.py")
_STARTED = []


def spotd_exe():
    return os.environ.get("SPOTD") or builddir_path("daemon", "spotd")


def spotctl_exe():
    return os.environ.get("SPOTCTL") or builddir_path("client", "spotctl")


def spotd_emulate_exe():
    """The emulator program; `spotctl emulate` execs the same one."""
    return (os.environ.get("SPOTD_EMULATE") or
            builddir_path("emulate", "spotd-emulate"))


def kill_started():
    """SIGKILLs the processes this test started that still run."""
    for p in _STARTED:
        if p.poll() is None:
            try:
                p.kill()
                p.wait(10)
            except Exception:  # noqa: BLE001
                pass


@_contextlib.contextmanager
def cleaned_up(prefix, *stops):
    """A with block after which, however it ends, each of stops is called,
    then kill_started() and s3_cleanup(prefix)."""
    try:
        yield
    finally:
        for stop in stops:
            stop()
        kill_started()
        s3_cleanup(prefix)


class LineLog:
    """Collects a pipe's lines (text) in a thread, with their time; echoes
    them to our stdout with a prefix when echo is set (meson keeps it)."""

    def __init__(self, pipe, echo=None):
        self.lines = []
        self.cv = _threading.Condition()
        self.echo = echo
        self.t = _threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self.t.start()

    def _run(self, pipe):
        for raw in pipe:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if self.echo:
                print("%s%s" % (self.echo, line), flush=True)
            with self.cv:
                self.lines.append((_time.time(), line))
                self.cv.notify_all()

    def wait(self, pattern, timeout, start=0):
        """First line at index >= start matching the regex: (index, line),
        or (None, None) after timeout seconds."""
        rx = _re.compile(pattern)
        end = _time.time() + timeout
        with self.cv:
            while True:
                for i in range(start, len(self.lines)):
                    if rx.search(self.lines[i][1]):
                        return i, self.lines[i][1]
                left = end - _time.time()
                if left <= 0:
                    return None, None
                self.cv.wait(left)

    def matching(self, pattern):
        rx = _re.compile(pattern)
        with self.cv:
            return [l for _, l in self.lines if rx.search(l)]

    def time_of(self, pattern):
        """Arrival time of the first matching line, or None."""
        rx = _re.compile(pattern)
        with self.cv:
            for t, l in self.lines:
                if rx.search(l):
                    return t
        return None

    def count(self):
        with self.cv:
            return len(self.lines)

    def text(self):
        with self.cv:
            return "\n".join(l for _, l in self.lines)

    def join(self, timeout=5):
        self.t.join(timeout)


def daemon_env():
    """Skips without a test S3 server; returns (endpoint, bucket). Sets
    what spotd, spotctl and boto3 need (never the real IMDS)."""
    return store_env()


def daemon_job(test):
    """A store and job nobody else uses: (store_url, job, job_key_prefix)."""
    _, bucket = daemon_env()
    prefix = "itest-daemon/%s-%d-%d" % (test, os.getpid(), int(_time.time() * 1000))
    return "s3://%s/%s" % (bucket, prefix), "job", prefix + "/job/"


class Daemon:
    """`spotd run` with its own socket and checkpoint folder under workdir.

    trainer: arguments of fake_trainer.py (its event log is
    workdir/trainer.log), or cmd: a whole command instead. args: more spotd
    options. interval: --interval (0 = no periodic checkpoints). wrapper:
    argv put before spotd's (it must exec spotd, so self.pid is spotd's)."""

    def __init__(self, workdir, store, job, trainer=(), cmd=None, args=(),
                 provider="none", metadata_url=None, interval=0, env=None,
                 echo=True, poll_interval="500ms", grace=None, wrapper=None):
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.ckpt_dir = os.path.join(workdir, "ckpt")
        self.socket = os.path.join(workdir, "spotd.sock")
        self.trainer_log = os.path.join(workdir, "trainer.log")
        if os.path.exists(self.trainer_log):  # a previous run's
            os.unlink(self.trainer_log)
        self.job, self.store = job, store
        argv = [spotd_exe(), "run", "--job", job, "--store", store,
                "--ckpt-dir", self.ckpt_dir, "--socket", self.socket,
                "--provider", provider, "--interval", str(interval)]
        if metadata_url:
            argv += ["--metadata-url", metadata_url,
                     "--poll-interval", poll_interval]
        if grace is not None:
            argv += ["--grace", str(grace)]
        argv += [str(a) for a in args]
        if cmd is None:
            cmd = [PY3, FAKE_TRAINER, "--log", self.trainer_log] + \
                [str(a) for a in trainer]
        argv += ["--"] + list(cmd)
        if wrapper:  # e.g. a shell that exports its own pid, then execs
            argv = list(wrapper) + argv
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.argv = argv
        self.t0 = _time.time()
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=full_env)
        _STARTED.append(self.p)
        self.pid = self.p.pid
        self.err = LineLog(self.p.stderr, "[spotd] " if echo else None)
        self.out = LineLog(self.p.stdout, "[stdout] " if echo else None)
        self.rc = None

    def wait_log(self, pattern, timeout=30, start=0):
        """The first stderr line matching pattern, or None."""
        return self.err.wait(pattern, timeout, start)[1]

    def wait_exit(self, timeout=60):
        """spotd's exit status; -9 (and killed) if it did not exit in time."""
        try:
            self.rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            print("spotd did not exit within %d s: killing pid %d" %
                  (timeout, self.p.pid))
            self.p.kill()
            self.p.wait(10)
            self.rc = -9
        self.err.join()
        self.out.join()
        return self.rc

    def send(self, sig):
        if self.p.poll() is None:
            self.p.send_signal(sig)

    def running(self):
        return self.p.poll() is None

    def spotctl(self, *args, timeout=60, env=None):
        """spotctl SUBCOMMAND --socket OURS ARGS..."""
        args = [str(a) for a in args]
        return run([spotctl_exe(), args[0], "--socket", self.socket] + args[1:],
                   timeout=timeout, env=env)

    def status(self):
        """`spotctl status --json` as a dict (None on failure)."""
        cp = self.spotctl("status", "--json", timeout=20)
        if cp.returncode != 0:
            print("spotctl status failed (%d): %s" % (cp.returncode, cp.stderr))
            return None
        return _json.loads(cp.stdout)

    def events(self, ev=None):
        """The fake trainer's events (dicts), optionally of one kind."""
        return trainer_events(self.trainer_log, ev)

    def wait_event(self, ev, timeout=30, pred=None):
        """The first trainer event of kind ev (matching pred), or None."""
        end = _time.time() + timeout
        while True:
            for e in self.events(ev):
                if pred is None or pred(e):
                    return e
            if _time.time() >= end:
                return None
            _time.sleep(0.05)

    def log(self):
        return self.err.text()

    def trainer_pids(self):
        """The machine's pids of the trainers started so far, from spotd's
        "trainer pid=N started" lines (a trainer runs in a pid namespace
        of its own: what it reports as its pid is that namespace's)."""
        return [int(_re.search(r"trainer pid=(\d+) started", l).group(1))
                for l in self.err.matching(r"trainer pid=\d+ started")]

    def host_pid(self, nspid, timeout=10):
        """host_pid(nspid, under=this spotd), waiting for it a while."""
        end = _time.time() + timeout
        while True:
            pid = host_pid(nspid, self.pid)
            if pid or _time.time() >= end:
                return pid
            _time.sleep(0.05)


def trainer_events(path, ev=None):
    out = []
    try:
        with open(path) as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # being written
                e = _json.loads(line)
                if ev is None or e["ev"] == ev:
                    out.append(e)
    except FileNotFoundError:
        pass
    return out


def latest(job_prefix):
    """The store's LATEST for a job root key prefix ("…/job/"), or None."""
    try:
        return s3_get(job_prefix + "LATEST").decode().strip()
    except Exception:  # noqa: BLE001 - NoSuchKey
        return None


def committed(job_prefix):
    """Names of checkpoints with a committed manifest under the job root."""
    names = []
    for k in s3_keys(job_prefix + "checkpoints/"):
        if k.endswith("/MANIFEST.json"):
            names.append(k[len(job_prefix + "checkpoints/"):].split("/")[0])
    return sorted(names)


class EmulatorProc:
    """`spotd-emulate --provider P --port 0 ARGS...` on loopback; cmd
    replaces the program (e.g. [spotctl, "emulate"]), env the environment."""

    def __init__(self, provider, *args, cmd=None, env=None):
        self.p = subprocess.Popen(
            (cmd or [spotd_emulate_exe()]) +
            ["--provider", provider, "--port", "0"] +
            [str(a) for a in args], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env)
        _STARTED.append(self.p)
        self.out = LineLog(self.p.stdout, "[emulate] ")
        self.err = LineLog(self.p.stderr, "[emulate] ")
        _, line = self.out.wait(r"^listening on ", 10)
        if line is None:
            self.p.kill()
            raise RuntimeError("the emulator did not start")
        self.url = line.split()[-1]
        expect(self.url.startswith("http://127."), self.url)

    def control(self, what, **params):
        """POST /__emulate/WHAT?params (notice, rebalance, ...)."""
        import urllib.request
        q = "&".join("%s=%s" % kv for kv in params.items())
        req = urllib.request.Request(
            self.url + "/__emulate/" + what + ("?" + q if q else ""),
            method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            expect(r.status == 200, (what, r.status))

    def state(self):
        import urllib.request
        with urllib.request.urlopen(self.url + "/__emulate/state", timeout=10) as r:
            return _json.loads(r.read().decode())

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(_signal.SIGTERM)
        try:
            return self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait(5)


def relaunch_hook(workdir):
    """(command for --relaunch, path of its output): a hook that records its
    SPOTD_* environment and the time as JSON, one object per run
    (tests/integration/relaunch_hook.c: a program, which runs within the
    second spotd leaves a relaunch step past the deadline even on a loaded
    machine, where a Python hook's start could take longer)."""
    out = os.path.join(workdir, "relaunch.jsonl")
    return "%s %s" % (builddir_path("tests", "integration", "relaunch_hook"),
                      out), out


def read_jsonl(path):
    try:
        with open(path) as f:
            return [_json.loads(l) for l in f if l.strip()]
    except FileNotFoundError:
        return []


# --------------------------------------------------------------- fake S3
# The daemon's state-machine tests run against tests/integration/fakes3.py
# (in-memory, loopback, seconds) instead of Ceph.

def fake_store(test):
    """(server, store_url, job, job_key_prefix) on a fresh FakeS3; pass
    env=server.env() to Daemon and spotctl."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fakes3
    server = fakes3.FakeS3()
    prefix = "itest-fake/%s" % test
    return server, "s3://%s/%s" % (server.bucket, prefix), "job", prefix + "/job/"


def states(d):
    """The engine's states in the order spotd entered them (its
    "state A -> B" lines)."""
    return [l.split(" -> ")[1].strip() for l in d.err.matching(r"state \S+ -> \S+$")]


ORDER = ["connecting", "restoring", "running", "draining", "relaunching",
         "stopping", "finishing", "exiting"]


def forward_only(seq):
    """True when seq (from states()) never goes back in ORDER."""
    idx = [ORDER.index(s) for s in seq if s in ORDER]
    return idx == sorted(idx) and len(idx) == len(seq)


def wait_state(d, state, timeout=20):
    """Polls `spotctl status --json` until its state is state: the status
    dict, or None."""
    end = _time.time() + timeout
    while _time.time() < end and d.running():
        cp = d.spotctl("status", "--json", timeout=10)
        if cp.returncode == 0:
            st = _json.loads(cp.stdout)
            if st.get("state") == state:
                return st
        _time.sleep(0.05)
    return None


def host_pid(nspid, under):
    """The machine's pid of the running descendant of under whose pid in
    its own pid namespace is nspid (what a trainer's os.getpid() says
    inside spotd's pid namespace for it); 0 when there is none."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                kids.setdefault(int(f.read().rsplit(") ", 1)[1].split()[1]),
                                []).append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    pending, seen = list(kids.get(under, [])), []
    while pending:
        p = pending.pop()
        seen.append(p)
        pending += kids.get(p, [])
    for p in seen:
        try:
            for line in sl_read("/proc/%d/status" % p).splitlines():
                if line.startswith("NSpid:") and \
                        int(line.split()[-1]) == nspid and not pid_gone(p):
                    return p
        except (OSError, ValueError):
            pass
    return 0


def sl_read(path):
    with open(path) as f:
        return f.read()


def pid_gone(pid):
    """True when pid no longer runs (or is a zombie)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(") ", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def write_request_file(path, seq):
    """A request file as spotd writes it (lib/core/reqfile.h, version 2)
    with request seq pending (0: none)."""
    import struct
    with open(path, "wb") as f:
        f.write(b"SPOTDREQ" + struct.pack("<IIQQQ", 2, 0, seq, 0, 0) +
                b"\0" * (4096 - 40))


def played_request_env(tmp, drop=()):
    """(env, ckpt_root, request_file): the environment of a trainer run by a test
    without spotd, with a request file in tmp that holds one pending
    request (seq 1), as spotd writes it; no spotd socket, no resume
    folder, no rank variables (and the names in drop), no GPU."""
    root = os.path.join(tmp, "ckpt")
    req = os.path.join(tmp, "spotd.sock.req")
    write_request_file(req, 1)
    env = dict(os.environ, SPOTD_CKPT_DIR=root, SPOTD_REQUEST_FILE=req,
               CUDA_VISIBLE_DEVICES="", PYTHONPATH=srcdir_path("python"))
    for k in ("SPOTD_SOCKET", "SPOTD_RESUME_DIR", "RANK", "WORLD_SIZE") + \
            tuple(drop):
        env.pop(k, None)
    return env, root, req
