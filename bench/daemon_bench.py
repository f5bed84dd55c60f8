#!/usr/bin/python3
"""daemon_bench.py - spotd under a notice, side by side with what users
would otherwise do, and spotd's idle cost. Not a test: it reports, it
asserts nothing. Run it through bench/daemon_bench.sh, which builds the
project and starts and stops the local Ceph RGW (tests/s3server.sh).

1. Notice to durable, per checkpoint size (default 256M, 1G, 4G): a fake
   trainer (this file, `trainer` mode) holds the checkpoint in memory
   (fp32: weights N(0, 0.02), Adam m N(0, 1e-3), v = m^2, generated once
   into a cache folder) and on SIGUSR1 writes it like torch.save would:
   from memory into SPOTD_CKPT_DIR/NAME/{model.pt,optim.pt}, fsync, then
   SPOTD_COMPLETE. It runs under `spotd run --provider aws --metadata-url
   EMULATOR --interval 0`; the notice is posted to the emulator's
   /__emulate/notice at a known wall-clock time, and every stderr line of
   spotd is stamped with the wall clock as it is read:
     detect          notice posted -> "checkpoint requested"
     save            -> "checkpoint NAME is complete"
     upload+commit   -> "committed checkpoint name=NAME"
   Then the same checkpoint folder alone with `spotctl push`, with
   `tar | zstd -T0 -1 | aws s3 cp -` and with `aws s3 cp --recursive`.
   The server is warmed with one upload first (measured against Ceph:
   the first is 25-40% slower). Median of --runs runs.
2. Idle cost: spotd with `sleep 100000` as the trainer, polling the AWS
   emulator at its default 1 Hz, for --idle-minutes: VmRSS (and RssAnon,
   RssFile) from /proc/PID/status and utime+stime from /proc/PID/stat
   every second, plus PSS from smaps_rollup at both ends.
   Goals: RSS <= 8 MiB, CPU < 0.1% of a core, no growth.

Writes OUT/daemon.md, OUT/daemon.png and OUT/daemon.json (every run).
Only loopback traffic: the S3 endpoint and the emulator are on 127.0.0.1.
"""
import argparse
import datetime
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PY = "/usr/bin/python3"
AWS = "/usr/bin/aws"
MIB = 1 << 20
GOAL_RSS_KIB = 8 * 1024
GOAL_CPU_PCT = 0.1
# hand-written analysis appended to the report (kept in the source tree)
NOTES = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "results", "daemon_notes.md")


def log(msg):
    print("daemon_bench: " + msg, file=sys.stderr, flush=True)


def parse_size(s):
    m = re.fullmatch(r"(\d+)([MG]?)i?B?", s.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError("bad size %r (e.g. 256M, 1G)" % s)
    n = int(m.group(1))
    return n * (1 << 30 if m.group(2).upper() == "G" else MIB)


def size_label(n):
    return "%d GiB" % (n >> 30) if n >= 1 << 30 and n % (1 << 30) == 0 \
        else "%d MiB" % (n >> 20)


# ------------------------------------------------------------- trainer mode

def torch_state(nbytes):
    """A real-shaped fp32 training state in torch tensors of 64 MiB (16 Mi
    values, a layer each): weights N(0, 0.02) a third; Adam's exp_avg
    N(0, 1e-3) and exp_avg_sq its square, the other two thirds. Returns
    {file name: object for torch.save}."""
    import torch
    try:  # numpy's normals are several times faster than torch.randn
        import numpy as np
        rng = np.random.default_rng(nbytes)

        def randn(k):
            return torch.from_numpy(rng.standard_normal(k, dtype=np.float32))
    except ImportError:
        g = torch.Generator().manual_seed(nbytes)

        def randn(k):
            return torch.randn(k, generator=g)
    layer = 16 * MIB
    third = nbytes // 3 // 4

    def tensors(nvalues, scale):
        out, left = [], nvalues
        while left > 0:
            k = min(layer, left)
            out.append(randn(k) * scale)
            left -= k
        return out

    model = {"layer%d.weight" % i: t for i, t in enumerate(tensors(third, 0.02))}
    m = tensors((nbytes // 4 - third) // 2, 1e-3)
    state = {i: {"step": torch.tensor(1000.0), "exp_avg": t, "exp_avg_sq": t * t}
             for i, t in enumerate(m)}
    return {"model.pt": model,
            "optim.pt": {"state": state, "param_groups": [
                {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8,
                 "weight_decay": 0.0, "params": list(state)}]}}


def trainer_main(cache, events_path, write_mbps=0.0, kind="fake"):
    """The trainer: load the checkpoint into memory, say ready, then
    write it out on each SIGUSR1 and exit on SIGTERM. kind "fake" holds
    the bytes of the files in cache and writes them; "torch" builds a
    training state of cache (a byte count) in torch tensors and saves it
    with torch.save, as a trainer does."""
    ck = int(os.environ.get("SPOTD_SIGNAL") or signal.SIGUSR1)
    signal.pthread_sigmask(signal.SIG_BLOCK, {ck, signal.SIGTERM})
    ev = open(events_path, "a")

    def emit(kind, **kw):
        kw.update(ev=kind, t=time.time())
        ev.write(json.dumps(kw) + "\n")
        ev.flush()

    files = []
    state = None
    if kind == "torch":
        import torch
        state = torch_state(int(cache))
        emit("ready", bytes=int(cache), torch=torch.__version__)
    else:
        for name in sorted(os.listdir(cache)):
            path = os.path.join(cache, name)
            buf = bytearray(os.path.getsize(path))
            with open(path, "rb", buffering=0) as f:
                mv, got = memoryview(buf), 0
                while got < len(buf):
                    n = f.readinto(mv[got:])
                    if not n:
                        raise SystemExit("short read of " + path)
                    got += n
            files.append((name, buf))
        emit("ready", bytes=sum(len(b) for _, b in files))
    ckpt_dir = os.environ["SPOTD_CKPT_DIR"]
    n = 0
    while True:
        info = signal.sigtimedwait({ck, signal.SIGTERM}, 60)
        if info is None:
            continue
        if info.si_signo == signal.SIGTERM:
            emit("term")
            return 0
        n += 1
        t0 = time.time()
        emit("signal")
        name = "ckpt-%03d" % n
        d = os.path.join(ckpt_dir, name)
        os.makedirs(d)
        if state is not None:
            import torch
            for fname in sorted(state):
                path = os.path.join(d, fname)
                torch.save(state[fname], path)
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
        for fname, buf in files:
            fd = os.open(os.path.join(d, fname),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            mv, off = memoryview(buf), 0
            while off < len(buf):
                off += os.write(fd, mv[off:off + 64 * MIB])
                if write_mbps > 0:  # a trainer serializing as it goes
                    ahead = t0 + (off + sum(len(b) for f2, b in files
                                            if f2 < fname)) / (write_mbps * 1e6) \
                        - time.time()
                    if ahead > 0:
                        time.sleep(ahead)
            os.fsync(fd)
            os.close(fd)
        t1 = time.time()
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)
        os.close(dfd)
        # the marker last, once every file is durable
        open(os.path.join(d, "SPOTD_COMPLETE"), "w").close()
        emit("saved", name=name, write_s=t1 - t0, total_s=time.time() - t0)


# ---------------------------------------------------------------- helpers

def gen_cache(path, nbytes):
    """fp32 checkpoint of nbytes in path/{model.pt, optim.pt}: a third
    weights N(0, 0.02), two thirds Adam m N(0, 1e-3) and v = m^2."""
    third = nbytes // 3 // 4 * 4
    want = {"model.pt": third, "optim.pt": nbytes - third}
    if os.path.isdir(path) and all(
            os.path.exists(os.path.join(path, k)) and
            os.path.getsize(os.path.join(path, k)) == v for k, v in want.items()):
        return
    log("generating %s of fp32 checkpoint data in %s" % (size_label(nbytes), path))
    # Debian's numpy, through /usr/bin/python3 (this script's interpreter)
    import numpy as np
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    rng = np.random.default_rng(nbytes)
    chunk = 16 * MIB  # values

    def write(fname, nvalues, gen):
        with open(os.path.join(path, fname), "wb") as f:
            left = nvalues
            while left > 0:
                k = min(chunk, left)
                gen(k).astype(np.float32).tofile(f)
                left -= k

    write("model.pt", third // 4,
          lambda k: rng.standard_normal(k, dtype=np.float32) * np.float32(0.02))
    half = (nbytes - third) // 4 // 2
    write("optim.pt", half,
          lambda k: rng.standard_normal(k, dtype=np.float32) * np.float32(1e-3))
    with open(os.path.join(path, "optim.pt"), "ab") as f:
        left = (nbytes - third) // 4 - half
        while left > 0:
            k = min(chunk, left)
            (rng.standard_normal(k, dtype=np.float32) * np.float32(1e-3)) \
                .__pow__(2).astype(np.float32).tofile(f)
            left -= k


class LineLog:
    """Reads a pipe line by line in a thread, stamping each line with the
    wall clock when it is read."""

    def __init__(self, pipe, echo=None):
        self.lines = []
        self.cond = threading.Condition()
        self.echo = echo
        self.t = threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self.t.start()

    def _run(self, pipe):
        for raw in pipe:
            now = time.time()
            line = raw.decode(errors="replace").rstrip("\n")
            with self.cond:
                self.lines.append((now, line))
                self.cond.notify_all()
            if self.echo is not None:
                self.echo.write(line + "\n")
                self.echo.flush()
        with self.cond:
            self.lines.append((time.time(), None))  # EOF
            self.cond.notify_all()

    def wait(self, pattern, timeout):
        """(time, line) of the first line matching pattern, or (None, None)
        on timeout or EOF."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        i = 0
        with self.cond:
            while True:
                while i < len(self.lines):
                    t, line = self.lines[i]
                    if line is None:
                        return None, None
                    if rx.search(line):
                        return t, line
                    i += 1
                left = end - time.monotonic()
                if left <= 0:
                    return None, None
                self.cond.wait(left)

    def text(self):
        with self.cond:
            return "\n".join(l for _, l in self.lines if l is not None)


OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Emulator:
    def __init__(self, emulator):
        self.p = subprocess.Popen([emulator, "--provider", "aws",
                                   "--port", "0"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
        self.out = LineLog(self.p.stdout)
        t, line = self.out.wait(r"^listening on ", 10)
        if line is None:
            self.stop()
            raise SystemExit("spotd-emulate did not start:\n" + self.out.text())
        self.url = line.split()[-1]

    def post(self, what, **params):
        q = "&".join("%s=%s" % kv for kv in params.items())
        req = urllib.request.Request("%s/__emulate/%s%s" % (
            self.url, what, "?" + q if q else ""), data=b"", method="POST")
        with OPENER.open(req, timeout=5) as r:
            r.read()

    def state(self):
        with OPENER.open(self.url + "/__emulate/state", timeout=5) as r:
            return json.loads(r.read())

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def stop_spotd(p, err, trainer_mark):
    """Stops spotd if it still runs (SIGTERM twice: the first asks for a
    final checkpoint, the second stops at once), then SIGKILL; and its
    trainer, by the pid spotd logged, if that process is still ours."""
    for sig in (signal.SIGTERM, signal.SIGTERM):
        if p.poll() is None:
            p.send_signal(sig)
            time.sleep(0.5)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    line = err.wait(r"trainer pid=\d+ started", 0)[1]
    if line is None:
        return
    pid = int(re.search(r"pid=(\d+)", line).group(1))
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            if trainer_mark in f.read():
                os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ")


def stamp(line):
    """The wall clock a spotd log line was written at (its UTC prefix, ms),
    as seconds since the epoch; None without one."""
    m = STAMP.match(line or "")
    if not m:
        return None
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f") \
        .replace(tzinfo=datetime.timezone.utc).timestamp()


# The phases of notice -> durable, each from one log line of spotd to the
# next (the push's state and follow lines are at debug level). A phase
# whose lines are missing (no overlap: no follow) is None.
TAIL_PHASES = (
    # key, from-line pattern, to-line pattern, what it is
    ("t_marker", r"checkpoint \S+ is complete", r"push name=\S+: SPOTD_COMPLETE is there",
     "the push's scan sees the marker (after spotd's watch)"),
    ("t_drain", r"push name=\S+: SPOTD_COMPLETE is there", r"push name=\S+ follow drain -> final",
     "the files started before the marker: the rest compressed, "
     "uploaded, multipart completes"),
    ("t_final", r"push name=\S+ follow drain -> final", r"push name=\S+: final walk: ",
     "the final walk: list, stat, sample, and the parts read before the "
     "marker read again (CRC32C)"),
    ("t_rest", (r"push name=\S+: final walk: ", r"push name=\S+ state resume -> transfer"),
     r"push name=\S+ state transfer -> verify",
     "files not started before the marker (small ones packed, changed ones)"),
    ("t_verify", r"push name=\S+ state transfer -> verify", r"push name=\S+ state verify -> ",
     "stat of every file again"),
    ("t_manifest", r"push name=\S+ state verify -> ", r"push name=\S+ state commit -> latest",
     "MANIFEST.json PUT (If-None-Match), with the lease read first when held"),
    ("t_latest", r"push name=\S+ state commit -> latest", r"push name=\S+ state latest -> retain",
     "LATEST compare-and-swap"),
    ("t_retain", r"push name=\S+ state latest -> retain", r"push name=\S+ state retain -> done",
     "retention (list, older manifests)"),
    ("t_report", r"push name=\S+ state retain -> done", r"committed checkpoint name=",
     "the push's result to spotd's log"),
)


def tail_breakdown(lines):
    """{key: seconds} of TAIL_PHASES from spotd's (time read, line) list,
    plus what was read and stored when the marker was seen."""
    def first(pattern, after=None):
        rx = re.compile(pattern)
        for _, line in lines:
            if line is None or not rx.search(line):
                continue
            t = stamp(line)
            if t is not None and (after is None or t >= after):
                return t, line
        return None, None

    out = {}
    t_complete = first(r"checkpoint \S+ is complete")[0]
    for key, a, b, _ in TAIL_PHASES:
        ta = None
        for alt in (a,) if isinstance(a, str) else a:
            ta = first(alt, None)[0]
            if ta is not None:
                break
        tb = first(b, ta)[0] if ta is not None else None
        out[key] = tb - ta if ta is not None and tb is not None else None
    t, line = first(r"SPOTD_COMPLETE is there after")
    m = re.search(r"(\d+) of (\d+) bytes read and (\d+) bytes stored", line or "")
    if m:
        out["read_at_marker"] = int(m.group(1))
        out["known_at_marker"] = int(m.group(2))
        out["stored_at_marker"] = int(m.group(3))
    m = re.search(r"(\d+) bytes read (?:before the marker read )?again",
                  first(r"bytes read (?:before the marker read )?again")[1] or "")
    out["reread"] = int(m.group(1)) if m else None
    t_commit = first(r"committed checkpoint name=")[0]
    out["t_tail"] = (t_commit - t_complete) if t_complete and t_commit else None
    return out


class Bench:
    def __init__(self, a):
        self.a = a
        self.spotd = os.path.join(a.build, "daemon", "spotd")
        self.spotctl = os.path.join(a.build, "client", "spotctl")
        self.emulator = os.path.join(a.build, "emulate", "spotd-emulate")
        for exe in (self.spotd, self.spotctl, self.emulator):
            if not os.access(exe, os.X_OK):
                raise SystemExit("no %s: build first (bench/daemon_bench.sh does)" % exe)
        self.endpoint = os.environ.get("SPOT_TEST_S3_ENDPOINT")
        self.bucket = os.environ.get("SPOT_TEST_S3_BUCKET")
        if not self.endpoint or not self.bucket:
            raise SystemExit("SPOT_TEST_S3_ENDPOINT/BUCKET unset: run bench/daemon_bench.sh")
        if not re.match(r"^http://(127\.\d+\.\d+\.\d+|localhost)(:\d+)?$", self.endpoint):
            raise SystemExit("refusing a non-loopback endpoint " + self.endpoint)
        os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
        os.environ["AWS_ENDPOINT_URL"] = self.endpoint
        self.work = a.work
        os.makedirs(self.work, exist_ok=True)
        self.rng = random.Random(2024)
        self.children = []

    # -- store housekeeping
    def wipe(self, prefix):
        if not os.access(AWS, os.X_OK):
            return  # no aws CLI (the GPU host): a fresh s3_mem per run
        subprocess.run([AWS, "--endpoint-url", self.endpoint, "s3", "rm",
                        "--recursive", "--quiet", "s3://%s/%s/" % (self.bucket, prefix)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self.a.ceph_dir:  # free the space now, not in 2 h
            subprocess.run(["radosgw-admin", "-c",
                            os.path.join(self.a.ceph_dir, "ceph.conf"),
                            "gc", "process", "--include-all"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def timed(self, argv, shell=False):
        t0 = time.monotonic()
        cp = subprocess.run(argv, shell=shell, executable="/bin/bash" if shell else None,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        dt = time.monotonic() - t0
        if cp.returncode != 0:
            raise SystemExit("failed (%d): %s\n%s" % (cp.returncode, argv,
                                                     cp.stderr.decode(errors="replace")))
        return dt

    def push(self, src, tag):
        return self.timed([self.spotctl, "push", "-q", src,
                           "s3://%s/%s/push/%s" % (self.bucket, self.a.prefix, tag), "--name", "c"])

    def aws_pipeline(self, src, tag):
        cmd = ("set -o pipefail; tar -C '%s' -cf - . | zstd -T0 -1 -q -c | "
               "%s --endpoint-url %s s3 cp --quiet - s3://%s/%s/zpipe/%s.tar.zst"
               % (src, AWS, self.endpoint, self.bucket, self.a.prefix, tag))
        return self.timed(cmd, shell=True)

    def aws_cp(self, src, tag):
        return self.timed([AWS, "--endpoint-url", self.endpoint, "s3", "cp",
                           "--quiet", "--recursive", src,
                           "s3://%s/%s/awscp/%s/" % (self.bucket, self.a.prefix, tag)])

    # -- spotd
    def start_spotd(self, wd, job, store, trainer, extra=()):
        os.makedirs(wd, exist_ok=True)
        emu = Emulator(self.emulator)
        argv = [self.spotd, "run", "--job", job, "--store", store,
                "--ckpt-dir", os.path.join(wd, "ckpt"),
                "--socket", os.path.join(wd, "spotd.sock"),
                "--provider", "aws", "--metadata-url", emu.url,
                "--interval", "0", "--restore=false",
                # the push's phases after the marker are debug lines
                "--log-level", "debug"] + list(extra) + ["--"] + trainer
        if os.environ.get("LD_LIBRARY_PATH") and trainer[:1] != ["sleep"]:
            # spotd's libraries (a packed build) are not the trainer's
            argv[argv.index("--") + 1:] = ["env", "-u", "LD_LIBRARY_PATH"] + trainer
        errf = open(os.path.join(wd, "spotd.err"), "w")
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.children.append(p)
        return emu, p, LineLog(p.stderr, errf)

    def notice_run(self, nbytes, r):
        label = "%dM-r%d" % (nbytes >> 20, r)
        wd = os.path.join(self.work, "run-" + label)
        shutil.rmtree(wd, ignore_errors=True)
        cache = os.path.join(self.work, "cache", "%dM" % (nbytes >> 20))
        events = os.path.join(wd, "trainer.jsonl")
        job = "n-%s-%d" % (label, os.getpid())
        os.makedirs(wd)
        emu, p, err = self.start_spotd(
            wd, job, "s3://%s/%s/spotd" % (self.bucket, self.a.prefix),
            [self.a.python, os.path.abspath(__file__), "trainer",
             str(nbytes) if self.a.trainer == "torch" else cache, events,
             str(self.a.write_mbps), self.a.trainer],
            ["--overlap=" + ("true" if self.a.overlap == "on" else "false")])
        try:
            if err.wait(r"state \S+ -> running", 60)[0] is None:
                raise SystemExit("spotd did not start:\n" + err.text())
            end = time.monotonic() + 120
            while not (os.path.exists(events) and '"ready"' in open(events).read()):
                if time.monotonic() > end or p.poll() is not None:
                    raise SystemExit("trainer not ready:\n" + err.text())
                time.sleep(0.05)
            # a random phase against the 1 Hz poll, after a few polls
            time.sleep(1.5 + self.rng.random())
            t_notice = time.time()
            emu.post("notice")
            t_posted = time.time()
            t_commit, cline = err.wait(r"committed checkpoint name=", 900)
            if t_commit is None:
                raise SystemExit("no commit:\n" + err.text())
            rc = p.wait(120)
            t_seen = err.wait(r"interruption notice: ", 0)[0]
            t_req = err.wait(r"checkpoint requested \(", 0)[0]
            t_done = err.wait(r"checkpoint \S+ is complete", 0)[0]
            m = re.search(r"raw=(\d+) stored=(\d+) ratio=([\d.]+) in ([\d.]+) s "
                          r"\((\d+) retries[;)]", cline)
            evs = [json.loads(l) for l in open(events)]
            saved = [e for e in evs if e["ev"] == "saved"]
            sig = [e for e in evs if e["ev"] == "signal"]
        finally:
            stop_spotd(p, err, b"daemon_bench.py\0trainer\0")
            emu.stop()
        res = {
            "size": nbytes, "run": r, "rc": rc, "post_s": t_posted - t_notice,
            "seen": t_seen - t_notice, "detect": t_req - t_notice,
            "save": t_done - t_req, "upload": t_commit - t_done,
            "total": t_commit - t_notice,
            "signal_delivery": sig[0]["t"] - t_req if sig else None,
            "trainer_write": saved[0]["write_s"] if saved else None,
            "trainer_save": saved[0]["total_s"] if saved else None,
            "raw": int(m.group(1)) if m else None,
            "stored": int(m.group(2)) if m else None,
            "ratio": float(m.group(3)) if m else None,
            "spotd_upload_s": float(m.group(4)) if m else None,
            "retries": int(m.group(5)) if m else None,
        }
        res["overlap"] = self.a.overlap
        with err.cond:
            res.update(tail_breakdown(list(err.lines)))
        shutil.rmtree(os.path.join(wd, "ckpt"), ignore_errors=True)
        self.wipe(self.a.prefix + "/spotd")
        if self.a.spotd_only:
            res["push"] = res["aws_pipeline"] = res["aws_cp"] = None
            log("%s (overlap %s): detect %.2f save %.2f upload+commit %.2f = "
                "%.2f s (rc %s)" % (label, self.a.overlap, res["detect"],
                                     res["save"], res["upload"], res["total"], rc))
            return res
        res["push"] = self.push(cache, label)
        self.wipe(self.a.prefix + "/push")
        res["aws_pipeline"] = self.aws_pipeline(cache, label)
        self.wipe(self.a.prefix + "/zpipe")
        res["aws_cp"] = self.aws_cp(cache, label)
        self.wipe(self.a.prefix + "/awscp")
        log("%s: detect %.2f save %.2f upload+commit %.2f = %.2f s; push %.2f, "
            "aws pipeline %.2f, aws cp %.2f (rc %s)" % (
                label, res["detect"], res["save"], res["upload"], res["total"],
                res["push"], res["aws_pipeline"], res["aws_cp"], rc))
        return res

    def warm(self):
        cache = os.path.join(self.work, "cache", "%dM" % (min(self.a.sizes) >> 20))
        log("warming the server")
        self.push(cache, "warm")
        if not self.a.spotd_only:
            self.aws_cp(cache, "warm")
        self.wipe(self.a.prefix)

    # -- idle
    def idle(self, minutes, out):
        wd = os.path.join(self.work, "idle")
        shutil.rmtree(wd, ignore_errors=True)
        emu, p, err = self.start_spotd(wd, "idle-%d" % os.getpid(),
                                       "s3://%s/dbench-idle" % self.bucket,
                                       ["sleep", "100000"])
        try:
            t, line = err.wait(r"trainer pid=\d+ started", 60)
            if line is None or err.wait(r"state \S+ -> running", 30)[0] is None:
                raise SystemExit("idle spotd did not start:\n" + err.text())
            time.sleep(5)  # settle: a few polls
            pid = p.pid
            hz = os.sysconf("SC_CLK_TCK")

            def status():
                d = {}
                with open("/proc/%d/status" % pid) as f:
                    for l in f:
                        k, _, v = l.partition(":")
                        if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM", "Threads"):
                            d[k] = int(v.split()[0])
                with open("/proc/%d/stat" % pid) as f:
                    st = f.read().rsplit(")", 1)[1].split()
                d["ticks"] = int(st[11]) + int(st[12])  # utime + stime
                with open("/proc/%d/schedstat" % pid) as f:
                    d["sched_ns"] = int(f.read().split()[0])
                return d

            def pss():
                with open("/proc/%d/smaps_rollup" % pid) as f:
                    return {k: int(v.split()[0]) for k, _, v in
                            (l.partition(":") for l in f if ":" in l and
                             not l[0].isdigit() and l.split(":")[0] in
                             ("Rss", "Pss", "Pss_Anon", "Pss_File",
                              "Private_Dirty", "Shared_Clean"))}

            req0 = emu.state().get("requests", 0)
            pss0 = pss()
            s0 = status()
            w0 = time.monotonic()
            samples = []
            n = int(minutes * 60)
            log("idle: sampling spotd pid %d every second for %g min" % (pid, minutes))
            for i in range(1, n + 1):
                # absolute schedule: no drift
                time.sleep(max(0.0, w0 + i - time.monotonic()))
                if p.poll() is not None:
                    raise SystemExit("idle spotd exited:\n" + err.text())
                s = status()
                s["t"] = time.monotonic() - w0
                samples.append(s)
            w1 = time.monotonic()
            s1 = samples[-1]
            pss1 = pss()
            libs = smaps_by_file(pid)
            req1 = emu.state().get("requests", 0)
            wall = w1 - w0
            rss = [s["VmRSS"] for s in samples]
            res = {
                "minutes": minutes, "wall_s": wall, "hz": hz,
                "cpu_s_stat": (s1["ticks"] - s0["ticks"]) / hz,
                "cpu_s_sched": (s1["sched_ns"] - s0["sched_ns"]) / 1e9,
                "rss_first": s0["VmRSS"], "rss_last": s1["VmRSS"],
                "rss_min": min(rss), "rss_max": max(rss),
                "anon_first": s0["RssAnon"], "anon_last": s1["RssAnon"],
                "anon_max": max(s["RssAnon"] for s in samples),
                "file_last": s1["RssFile"], "hwm": s1["VmHWM"],
                "threads": s1["Threads"], "pss_first": pss0, "pss_last": pss1,
                "requests": req1 - req0, "rss_by_mapping": libs,
                "samples": [(round(s["t"], 1), s["VmRSS"], s["RssAnon"],
                             s["ticks"] - s0["ticks"]) for s in samples],
            }
            res["cpu_pct"] = 100.0 * res["cpu_s_stat"] / wall
            res["cpu_pct_sched"] = 100.0 * res["cpu_s_sched"] / wall
            log("idle: cpu %.4f%% of a core (%.3f%% by schedstat), VmRSS %d..%d KiB, "
                "RssAnon %d..%d KiB, %d emulator requests in %.0f s" % (
                    res["cpu_pct"], res["cpu_pct_sched"], res["rss_min"],
                    res["rss_max"], res["anon_first"], res["anon_max"],
                    res["requests"], wall))
            out.update(res)
        finally:
            stop_spotd(p, err, b"sleep\0100000")
            emu.stop()
            self.wipe("dbench-idle")


def smaps_by_file(pid):
    """[(KiB of Rss, KiB of Private_Dirty, mapping)] largest first."""
    acc = {}
    name = ""
    with open("/proc/%d/smaps" % pid) as f:
        for l in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", l):
                parts = l.split(None, 5)
                name = parts[5].strip() if len(parts) > 5 else "[anon]"
                name = name or "[anon]"
            elif l.startswith("Rss:") or l.startswith("Private_Dirty:"):
                k = 0 if l.startswith("Rss:") else 1
                acc.setdefault(name, [0, 0])[k] += int(l.split()[1])
    return sorted(((v[0], v[1], os.path.basename(k) if k.startswith("/") else k)
                   for k, v in acc.items() if v[0] > 0), reverse=True)


# ------------------------------------------------------------------ report

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def summarize(runs, sizes):
    rows = []
    for n in sizes:
        rs = [r for r in runs if r["size"] == n]
        if not rs:
            continue
        row = {"size": n, "runs": len(rs)}
        for k in ("detect", "seen", "save", "upload", "total", "push",
                  "aws_pipeline", "aws_cp", "ratio", "trainer_write",
                  "signal_delivery"):
            row[k] = med(r[k] for r in rs)
        # ratios per run, then their median (a ratio of medians mixes runs)
        for alt in ("push", "aws_pipeline", "aws_cp"):
            if any(r[alt] is None for r in rs):  # --spotd-only
                row["up_" + alt] = row["n2d_" + alt] = float("nan")
                continue
            row["up_" + alt] = med(r[alt] / r["upload"] for r in rs)
            row["n2d_" + alt] = med((r["detect"] + r["save"] + r[alt]) / r["total"]
                                    for r in rs)
        row["upload_mbs"] = med(r["size"] / 1e6 / r["upload"] for r in rs)
        for k in [p[0] for p in TAIL_PHASES] + ["t_tail", "read_at_marker",
                                                 "stored_at_marker", "reread",
                                                 "trainer_save"]:
            row[k] = med(r.get(k) for r in rs)
        row["detect_min"] = min(r["detect"] for r in rs)
        row["detect_max"] = max(r["detect"] for r in rs)
        rows.append(row)
    return rows


def breakdown_table(rows):
    """Where notice -> durable goes, a column per size (medians of the
    runs; the phases' medians need not add up to the tail's)."""
    def sec(x):
        return "–" if x is None or x != x else "%.2f" % x

    def mib(x):
        return "–" if x is None or x != x else "%.0f" % (x / MIB)

    L = ["### Where the time goes\n",
         "From the stamps of spotd's log lines (`--log-level debug`: the "
         "push's state and follow lines), medians of the runs. *Uploaded "
         "while saving*: what the push had read (and compressed) and stored "
         "when it saw the marker. The tail is `is complete` → `committed`; "
         "its phases follow one another (a phase's median need not add up "
         "with the others' to the tail's).\n"]
    L.append("| phase | " + " | ".join(size_label(r["size"]) for r in rows) + " |")
    L.append("|---|" + "---:|" * len(rows))

    def line(label, key, fmt=sec):
        L.append("| %s | %s |" % (label, " | ".join(fmt(r.get(key)) for r in rows)))

    line("detect s (notice → `checkpoint requested`)", "detect")
    line("save s (→ `is complete`; the trainer's)", "save")
    line("&nbsp;&nbsp;of which the trainer's write + fsync s", "trainer_write")
    line("read while saving, MiB", "read_at_marker", mib)
    line("stored while saving, MiB (compressed)", "stored_at_marker", mib)
    line("**tail s** (`is complete` → `committed`)", "t_tail")
    for key, _, _, what in TAIL_PHASES:
        line("&nbsp;&nbsp;" + what + " s", key)
    line("&nbsp;&nbsp;parts read before the marker, read again after it, MiB",
         "reread", mib)
    line("**notice→durable s**", "total")
    L.append("")
    return L


def write_report(a, rows, runs, idle, machine):
    L = []
    L.append("# spotd daemon benchmark\n")
    L.append("`bench/daemon_bench.sh %s` on this machine (%s): %s (release build), local Ceph RGW "
             "(tests/s3server.sh) on loopback, `spotd-emulate --provider aws` as the "
             "metadata service. Warm server (one upload first). Medians of %d run(s) "
             "per size. Figures are wall-clock seconds on a shared, noisy machine: "
             "compare ratios, not absolute times.\n" % (
                 " ".join(a.argv_shown) or "(defaults)", machine, a.build_label, a.runs))
    if rows:
        L.append("## Notice to durable\n")
        if getattr(a, "trainer", "fake") == "torch":
            L.append("The trainer (`--trainer torch`) holds a training state in "
                     "torch tensors of 64 MiB (fp32 weights N(0, 0.02) a third; "
                     "Adam's exp_avg N(0, 1e-3) and exp_avg_sq its square) and "
                     "on SIGUSR1 saves it with `torch.save` into `model.pt` and "
                     "`optim.pt`, fsyncs them and the folder, then creates "
                     "SPOTD_COMPLETE. What follows about the fake trainer's "
                     "files holds for these two.\n")
        L.append("A fake trainer holds an fp32 checkpoint in memory (weights N(0, 0.02), "
                 "Adam m N(0, 1e-3), v = m²; `model.pt` a third, `optim.pt` two "
                 "thirds) and on SIGUSR1 writes it from memory, fsyncs each file and "
                 "the folder, then creates SPOTD_COMPLETE (it reacts at once: a real "
                 "trainer adds up to one training step). It runs under `spotd run "
                 "--provider aws --metadata-url EMU --interval 0` (1 Hz polling, 16 MiB "
                 "parts, compress auto). The notice is posted to the emulator at a "
                 "random phase of the poll; times are taken from the wall clock as "
                 "spotd's stderr lines are read:\n"
                 "detect = notice → `checkpoint requested`, save → `is complete`, "
                 "upload+commit → `committed checkpoint` (manifest written, LATEST "
                 "moved). The alternatives upload the same folder alone, from the page "
                 "cache: `spotctl push` (defaults: 8 MiB parts, 4 in flight), "
                 "`tar -C DIR -cf - . | zstd -T0 -1 | aws s3 cp -` and "
                 "`aws s3 cp --recursive` (/usr/bin/aws 2.9).\n")
        L.append("| size | detect s | save s | upload+commit s | **notice→durable s** "
                 "| push alone s | aws pipeline s | aws cp s |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            L.append("| %s | %.2f | %.2f | %.2f | **%.2f** | %.2f | %.2f | %.2f |" % (
                size_label(r["size"]), r["detect"], r["save"], r["upload"],
                r["total"], r["push"], r["aws_pipeline"], r["aws_cp"]))
        L.append("")
        L.append("Ratios (> 1 means spotd is faster; each the median of the per-run "
                 "ratios). Upload: the other tool's time over spotd's upload+commit. Notice→durable: detect + save + the "
                 "other tool's upload, over spotd's notice→durable (what a user with "
                 "the same detection and save, but that upload, would get). With "
                 "the overlap on, spotd compresses and uploads during the save, "
                 "which makes the save slower on a CPU-bound machine; the peers "
                 "are charged that slower save too, so these N→D ratios flatter "
                 "spotd (on this 2-core box the 4 GiB save took 11.8 s without "
                 "the overlap and 17.0 s with it).\n")
        L.append("| size | upload MB/s spotd | push ÷ spotd | aws pipeline ÷ spotd "
                 "| aws cp ÷ spotd | N→D with aws pipeline ÷ spotd | N→D with aws cp "
                 "÷ spotd | stored ratio |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            L.append("| %s | %.0f | %.2f× | %.2f× | %.2f× | %.2f× | %.2f× | %.2f |" % (
                size_label(r["size"]), r["upload_mbs"], r["up_push"],
                r["up_aws_pipeline"], r["up_aws_cp"], r["n2d_aws_pipeline"],
                r["n2d_aws_cp"], r["ratio"]))
        L.append("")
        L.append("Detect spread over the runs (1 Hz polling: expected 0–1 s plus the "
                 "signal): " + ", ".join(
                     "%s %.2f–%.2f s" % (size_label(r["size"]), r["detect_min"],
                                         r["detect_max"]) for r in rows) +
                 ". Of the detect time, the notice is seen (`interruption notice` "
                 "logged) after a median of " + ", ".join(
                     "%.2f s" % r["seen"] for r in rows) +
                 "; the trainer's own write+fsync takes " + ", ".join(
                     "%.2f s" % r["trainer_write"] for r in rows) +
                 " of the save.\n")
        if any(r.get("t_tail") == r.get("t_tail") and r.get("t_tail")
               is not None for r in rows):  # runs from before it: none
            L.extend(breakdown_table(rows))
    if idle:
        g_rss = idle["rss_max"] <= GOAL_RSS_KIB
        g_cpu = idle["cpu_pct"] < GOAL_CPU_PCT
        growth = idle["rss_last"] - idle["rss_first"]
        L.append("## Idle cost\n")
        L.append("spotd with `sleep 100000` as the trainer, polling the AWS emulator at "
                 "the default 1 Hz (spot/instance-action, rebalance recommendation and "
                 "lifecycle or maintenance paths under one IMDSv2 token), sampled every "
                 "second for %.1f min%s.\n" % (
                     idle["wall_s"] / 60,
                     " while the notice runs above went on (CPU time is the process's "
                     "own)" if idle.get("parallel") else ""))
        L.append("| measure | value | goal |")
        L.append("|---|---:|---|")
        L.append("| CPU, %% of one core (utime+stime, /proc/PID/stat) | %.4f%% (%.2f s in "
                 "%.0f s) | < %.1f%% %s |" % (
                     idle["cpu_pct"], idle["cpu_s_stat"], idle["wall_s"],
                     GOAL_CPU_PCT, "met" if g_cpu else "**missed**"))
        L.append("| CPU by schedstat (ns resolution) | %.4f%% | |" % idle["cpu_pct_sched"])
        L.append("| VmRSS min / max | %d / %d KiB (%.1f / %.1f MiB) | ≤ 8 MiB %s |" % (
            idle["rss_min"], idle["rss_max"], idle["rss_min"] / 1024,
            idle["rss_max"] / 1024, "met" if g_rss else "**missed**"))
        L.append("| VmRSS growth (last − first) | %+d KiB | none %s |" % (
            growth, "met" if growth <= 0 else "**missed**"))
        L.append("| of which RssAnon (heap, stacks, relocated data) first / max | "
                 "%d / %d KiB | |" % (idle["anon_first"], idle["anon_max"]))
        L.append("| of which RssFile (shared library pages) | %d KiB | |" % idle["file_last"])
        L.append("| PSS (smaps_rollup) first / last | %d / %d KiB | |" % (
            idle["pss_first"].get("Pss", 0), idle["pss_last"].get("Pss", 0)))
        L.append("| threads | %d | |" % idle["threads"])
        L.append("| emulator requests | %d (%.2f/s) | |" % (
            idle["requests"], idle["requests"] / idle["wall_s"]))
        L.append("")
        libs = idle.get("rss_by_mapping") or []
        if libs:
            L.append("Where the resident pages are at the end (/proc/PID/smaps, KiB; "
                     "file pages are shared, read-only library code and data; "
                     "private dirty pages are the process's own):\n")
            L.append("| mapping | Rss KiB | private dirty KiB |")
            L.append("|---|---:|---:|")
            top = libs[:12]
            for rss, dirty, name in top:
                L.append("| %s | %d | %d |" % (name, rss, dirty))
            rest = libs[12:]
            if rest:
                L.append("| %d other mappings | %d | %d |" % (
                    len(rest), sum(x[0] for x in rest), sum(x[1] for x in rest)))
            L.append("")
        if NOTES and os.path.exists(NOTES):
            L.append(open(NOTES).read())
    with open(os.path.join(a.out, "daemon.md"), "w") as f:
        f.write("\n".join(L))


def write_plot(a, rows, idle):
    try:
        import matplotlib
    except ImportError:
        log("no matplotlib: daemon.png not drawn")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    npanels = len(rows) + (1 if idle else 0)
    if npanels == 0:
        return
    fig, axes = plt.subplots(1, npanels, figsize=(3.6 * npanels + 1, 4.6))
    if npanels == 1:
        axes = [axes]
    colors = {"detect": "#9ecae1", "save": "#fdae6b", "upload": "#31a354"}
    for ax, r in zip(axes, rows):
        names = ["spotd", "spotctl\npush", "tar|zstd\n|aws cp -", "aws cp\n--recursive"]
        ups = [r["upload"], r["push"], r["aws_pipeline"], r["aws_cp"]]
        n2d = [None, r["n2d_push"], r["n2d_aws_pipeline"], r["n2d_aws_cp"]]
        for i, up in enumerate(ups):
            alpha = 1.0 if i == 0 else 0.45
            ax.bar(i, r["detect"], color=colors["detect"], alpha=alpha,
                   label="detect" if i == 0 else None)
            ax.bar(i, r["save"], bottom=r["detect"], color=colors["save"], alpha=alpha,
                   label="save" if i == 0 else None)
            ax.bar(i, up, bottom=r["detect"] + r["save"],
                   color=colors["upload"] if i == 0 else "#756bb1",
                   label=("upload+commit" if i == 0 else
                          "upload (alone)" if i == 1 else None))
            tot = r["detect"] + r["save"] + up
            ax.text(i, tot, "%.1f s" % tot + ("" if i == 0 else
                                              "\n%.2f×" % n2d[i]),
                    ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_title("%s checkpoint: notice → durable\n(medians; × = other ÷ spotd)"
                     % size_label(r["size"]), fontsize=9)
        ax.set_ylabel("seconds")
        ax.margins(y=0.18)
        ax.legend(fontsize=7, loc="upper left")
    if idle:
        ax = axes[-1]
        t = [s[0] / 60 for s in idle["samples"]]
        ax.plot(t, [s[1] / 1024 for s in idle["samples"]], label="VmRSS")
        ax.plot(t, [s[2] / 1024 for s in idle["samples"]], label="RssAnon")
        ax.axhline(GOAL_RSS_KIB / 1024, color="red", ls="--", lw=1, label="goal 8 MiB")
        ax.set_ylim(0, max(14, idle["rss_max"] / 1024 * 1.2))
        ax.set_xlabel("minutes")
        ax.set_ylabel("MiB")
        ax.set_title("idle spotd: CPU %.3f%% of a core" % idle["cpu_pct"], fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "daemon.png"), dpi=110)


# -------------------------------------------------------------------- main

def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "trainer":
        return trainer_main(sys.argv[2], sys.argv[3],
                            float(sys.argv[4]) if len(sys.argv) > 4 else 0.0,
                            sys.argv[5] if len(sys.argv) > 5 else "fake")
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(here, "..", ".build-bench"))
    ap.add_argument("--work", default="/tmp/spotd-daemon-bench")
    ap.add_argument("--out", default=os.path.join(here, "results"))
    ap.add_argument("--ceph-dir", help="tests/s3server.sh DIR (for gc of deleted data)")
    ap.add_argument("--sizes", default="256M,1G,4G",
                    help="checkpoint sizes, comma-separated (default 256M,1G,4G)")
    ap.add_argument("--quick", action="store_true", help="skip sizes above 1 GiB")
    ap.add_argument("--runs", type=int, default=3, help="runs per size (median)")
    ap.add_argument("--idle-minutes", type=float, default=10.0)
    ap.add_argument("--idle", choices=("parallel", "after", "skip"), default="parallel",
                    help="idle part: alongside the notice runs (default), after "
                    "them, or not at all")
    ap.add_argument("--no-notice", action="store_true", help="only the idle part")
    ap.add_argument("--overlap", choices=("on", "off"), default="on",
                    help="spotd's --overlap: upload while the trainer saves "
                    "(default on, spotd's default) or only after the marker")
    ap.add_argument("--write-mbps", type=float, default=0.0,
                    help="the fake trainer writes at most this many MB/s "
                    "(0 = as fast as it can), like a trainer serializing "
                    "tensors as it goes")
    ap.add_argument("--trainer", choices=("fake", "torch"), default="fake",
                    help="fake (default): the checkpoint's bytes held in "
                    "memory, written out; torch: a training state in torch "
                    "tensors saved with torch.save (model.pt, optim.pt)")
    ap.add_argument("--python", default=PY,
                    help="the trainer's python (default %s; torch needs "
                    "one with torch)" % PY)
    ap.add_argument("--no-warm", action="store_true",
                    help="no warming upload first (a server already busy)")
    ap.add_argument("--spotd-only", action="store_true",
                    help="notice runs of spotd only (no spotctl push, aws "
                    "pipeline or aws cp after each)")
    ap.add_argument("--prefix", default="dbench",
                    help="key prefix in the bucket (default dbench; wiped "
                    "between runs)")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite daemon.md and daemon.png from OUT/daemon.json")
    a = ap.parse_args()
    a.argv_shown = sys.argv[1:]
    a.argv_shown = [x for i, x in enumerate(a.argv_shown)
                    if not (x.startswith("--build") or x.startswith("--work") or
                            x.startswith("--ceph-dir") or
                            (i > 0 and a.argv_shown[i - 1] in
                             ("--build", "--work", "--ceph-dir")))]
    a.build = os.path.abspath(a.build)
    a.out = os.path.abspath(a.out)
    a.sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    if a.quick:
        a.sizes = [s for s in a.sizes if s <= 1 << 30]
    os.makedirs(a.out, exist_ok=True)
    if a.report_only:
        with open(os.path.join(a.out, "daemon.json")) as f:
            old = json.load(f)
        for k in ("argv_shown", "build_label", "machine"):
            setattr(a, k, old.get(k, "?"))
        a.trainer = old.get("trainer", "fake")
        runs, idle = old.get("runs", []), old.get("idle") or None
        a.sizes = sorted({r["size"] for r in runs})
        a.runs = max([r["run"] for r in runs] or [0])
        rows = summarize(runs, a.sizes)
        write_report(a, rows, runs, idle, a.machine)
        write_plot(a, rows, idle)
        return 0
    b = Bench(a)
    ver = subprocess.run([b.spotd, "--version"], capture_output=True, text=True)
    a.build_label = ((ver.stdout or ver.stderr).strip().splitlines() or ["?"])[0]
    a.machine = machine = "%d cores, %.0f GiB" % (os.cpu_count(), os.sysconf("SC_PAGE_SIZE") *
                                      os.sysconf("SC_PHYS_PAGES") / (1 << 30))

    def on_term(signum, frame):
        raise SystemExit("interrupted")
    signal.signal(signal.SIGTERM, on_term)

    idle = {}
    th = None
    runs = []
    try:
        if a.idle == "parallel" and a.idle_minutes > 0:
            idle["parallel"] = not a.no_notice
            th = threading.Thread(target=b.idle, args=(a.idle_minutes, idle), daemon=True)
            th.start()
        if not a.no_notice:
            for n in a.sizes:
                if a.trainer == "fake" or not a.spotd_only or not a.no_warm:
                    gen_cache(os.path.join(a.work, "cache", "%dM" % (n >> 20)), n)
            if not a.no_warm:
                b.warm()
            for n in a.sizes:
                for r in range(1, a.runs + 1):
                    runs.append(b.notice_run(n, r))
        if th is not None:
            th.join()
        elif a.idle == "after" and a.idle_minutes > 0:
            b.idle(a.idle_minutes, idle)
    finally:
        for p in b.children:
            if p.poll() is None:
                p.kill()
                p.wait()
    if a.idle != "skip" and a.idle_minutes > 0 and not idle.get("samples"):
        raise SystemExit("the idle part failed")
    # a part not run this time keeps its figures from the previous report
    old = {}
    try:
        with open(os.path.join(a.out, "daemon.json")) as f:
            old = json.load(f)
    except (OSError, ValueError):
        pass
    if a.no_notice and old.get("runs"):
        runs = old["runs"]
        a.sizes = sorted({r["size"] for r in runs})
        a.runs = max(r["run"] for r in runs)
        log("notice figures kept from the previous daemon.json")
    if not idle.get("samples") and old.get("idle"):
        idle = old["idle"]
        log("idle figures kept from the previous daemon.json")
    rows = summarize(runs, a.sizes)
    with open(os.path.join(a.out, "daemon.json"), "w") as f:
        json.dump({"argv_shown": a.argv_shown, "build_label": a.build_label,
                   "trainer": a.trainer,
                   "machine": machine, "runs": runs, "summary": rows,
                   "idle": idle}, f, indent=1)
    write_report(a, rows, runs, idle or None, machine)
    write_plot(a, rows, idle or None)
    sys.stdout.write(open(os.path.join(a.out, "daemon.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
