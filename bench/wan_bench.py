#!/usr/bin/python3
"""The WAN benchmark of README "Benchmarks" (driver; bench/wan_bench.sh is the entry
point). Not a test: it measures and reports, it asserts nothing.

Every client talks to its server through bench/wanproxy.py, which gives
each TCP connection a cap and a latency (default 60 MB/s per connection and
direction, 20 ms RTT, 2 RTTs of connection set-up), and in the "lossy"
variant 1 % of 64 KiB stalling 200 ms (an approximation of loss, see the
proxy). Servers: bench/s3_discard.py (push only: it stores nothing) and a
Ceph RGW of our own (tests/s3server.sh on WORK/ceph, stopped at the end,
garbage-collected after every round so its 32 GiB OSD never fills).

Cases: fp32 (1 GiB fp32 weights + Adam m + v, as bench/store_bench.sh
makes them), big (a 4 GiB checkpoint of the same kind), small (5000 files
of 4 KiB) and med (200 files of 1 MiB). Tools: spotctl push/restore with
defaults (spot: adaptive transfers in flight within the default --memory)
and, on request, with a fixed --parallel 16 (spot16), /usr/bin/aws s3 cp
(--recursive), and aws with its CRT transfer client (crt; needs the proxy
on 127.0.0.1:80, as the CRT ignores the port of --endpoint-url; skipped
when port 80 is taken). Each round runs every tool once, in turn, on the
same data; the report gives medians over rounds.

Per run: wall time, CPU-seconds (user + system of the client, from
wait4), peak RSS, and the CPU the proxy and the Ceph daemons spent.
Results go to WAN_OUT/wan.json after every run (a partial run is still a
result), then bench/wan_report.py writes wan.md and wan.png.

Environment (defaults in brackets):
  WAN_QUICK      1: one round, small sizes (64 MiB, 256 MiB, 500, 20) [0]
  WAN_RUNS       rounds [3, quick 1]
  WAN_FP32_MB WAN_BIG_MB WAN_SMALL_N WAN_MED_N   case sizes [1024 4096 5000 200]
  WAN_CASES      fp32,small,med,big       WAN_TOOLS   spot,aws,crt (+spot16)
  WAN_TARGETS    discard,ceph             WAN_VARIANTS wan,lossy
  WAN_LOSSY_CASES  cases run in the lossy variant [fp32]
  WAN_RATE WAN_RTT WAN_LOSS WAN_STALL_MS   proxy model [60 20 0.01 200]
  WAN_WORK       scratch [/tmp/spotd-wan-bench]   WAN_OUT [bench/results]
  WAN_TIMEOUT    seconds per command [900]
  WAN_CSINK_ONLY 1: only the ceiling against bench/s3_sink (C), its records
                 replacing those of the same kind in the existing wan.json [0]

The pipeline's own ceiling (the 1.3 GB/s on 2 cores the store aims at) is measured
against BUILD/bench/s3_sink, a discarding server in C that costs ~0.3
CPU-s per GiB (the Python sink costs more than spotctl itself)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
PY = "/usr/bin/python3"
AWS = "/usr/bin/aws"
GIB = 1 << 30
SPOTCTL = SINK_C = None  # set in main() from the build folder


def env(name, default):
    return os.environ.get(name, default)


QUICK = env("WAN_QUICK", "0") == "1"
RUNS = int(env("WAN_RUNS", "1" if QUICK else "3"))
SIZES = {
    "fp32_mb": int(env("WAN_FP32_MB", "64" if QUICK else "1024")),
    "big_mb": int(env("WAN_BIG_MB", "256" if QUICK else "4096")),
    "small_n": int(env("WAN_SMALL_N", "500" if QUICK else "5000")),
    "med_n": int(env("WAN_MED_N", "20" if QUICK else "200")),
}
CASES = env("WAN_CASES", "fp32,small,med,big").split(",")
TOOLS = env("WAN_TOOLS", "spot,aws,crt").split(",")
TARGETS = env("WAN_TARGETS", "discard,ceph").split(",")
VARIANTS = env("WAN_VARIANTS", "wan,lossy").split(",")
LOSSY_CASES = env("WAN_LOSSY_CASES", "fp32").split(",")
MODEL = {"rate_mbs": float(env("WAN_RATE", "60")),
         "rtt_ms": float(env("WAN_RTT", "20")),
         "loss": float(env("WAN_LOSS", "0.01")),
         "stall_ms": float(env("WAN_STALL_MS", "200")),
         "setup_rtts": 2}
WORK = env("WAN_WORK", "/tmp/spotd-wan-bench")
OUT = env("WAN_OUT", os.path.join(HERE, "results"))
TIMEOUT = float(env("WAN_TIMEOUT", "900"))
CSINK_ONLY = env("WAN_CSINK_ONLY", "0") == "1"


def log(*a):
    print("wan_bench:", *a, file=sys.stderr, flush=True)


# ---- data ------------------------------------------------------------------

GEN_FP32 = r'''
import sys, numpy as np
root, mb, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
CH = 16 << 20
def write(path, nbytes, gen):
    with open(path, "wb") as f:
        left = nbytes // 4
        while left > 0:
            n = min(CH, left)
            gen(n).astype(np.float32).tofile(f)
            left -= n
third = (mb << 20) // 3 // 4 * 4
write(root + "/model.pt", third, lambda n: rng.normal(0, 0.02, n))
write(root + "/adam_m.pt", third, lambda n: rng.normal(0, 1e-3, n))
write(root + "/adam_v.pt", third, lambda n: rng.normal(0, 1e-3, n) ** 2)
'''

GEN_FILES = r'''
import os, sys, numpy as np
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(7)
for i in range(n):
    d = os.path.join(root, "shard%02d" % (i % 50))
    os.makedirs(d, exist_ok=True)
    rng.normal(0, 0.02, size // 4).astype(np.float32).tofile(
        os.path.join(d, "t%05d.bin" % i))
'''


def tree_size(path):
    total = files = 0
    for d, _, names in os.walk(path):
        for n in names:
            total += os.path.getsize(os.path.join(d, n))
            files += 1
    return total, files


def make_data():
    specs = {"fp32": ("fp32", SIZES["fp32_mb"], 2024),
             "big": ("fp32", SIZES["big_mb"], 2025),
             "small": ("files", SIZES["small_n"], 4096),
             "med": ("files", SIZES["med_n"], 1 << 20)}
    dirs = {}
    for case in CASES:
        kind, n, arg = specs[case]
        d = os.path.join(WORK, "data", "%s-%d" % (case, n))
        dirs[case] = d
        if os.path.exists(os.path.join(d, ".done")):
            continue
        log("generating", case, n)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(os.path.join(d, "ckpt"))
        script = GEN_FP32 if kind == "fp32" else GEN_FILES
        subprocess.run([PY, "-c", script, os.path.join(d, "ckpt"), str(n), str(arg)],
                       check=True)
        open(os.path.join(d, ".done"), "w").close()
    return {c: os.path.join(d, "ckpt") for c, d in dirs.items()}


# ---- processes -------------------------------------------------------------

def proc_cpu(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def port_free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def start_printing_port(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.strip():
        p.kill()
        raise RuntimeError("did not start: %s" % cmd)
    return p, int(line)


def stop(p):
    if p and p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Ceph:
    def __init__(self):
        self.dir = os.path.join(WORK, "ceph")
        self.env = {}

    def start(self):
        log("starting Ceph in", self.dir)
        subprocess.run(["bash", os.path.join(SRC, "tests/s3server.sh"), "start",
                        self.dir], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(self.dir, "env")) as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                if k:
                    self.env[k] = v
        return self

    def pids(self):
        out = []
        for name in ("rgw", "osd"):
            try:
                with open(os.path.join(self.dir, "pids", name)) as f:
                    out.append(int(f.read().split()[0]))
            except (OSError, ValueError, IndexError):
                pass
        return out

    def cpu(self):
        return sum(proc_cpu(p) for p in self.pids())

    def gc(self):
        subprocess.run(["radosgw-admin", "-c", os.path.join(self.dir, "ceph.conf"),
                        "gc", "process", "--include-all"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=600)

    def stop(self):
        subprocess.run(["bash", os.path.join(SRC, "tests/s3server.sh"), "stop",
                        self.dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---- the tools ---------------------------------------------------------------

def aws_env(base, crt):
    cfg = os.path.join(WORK, "aws-%s.config" % ("crt" if crt else "classic"))
    with open(cfg, "w") as f:
        f.write("[default]\nregion = us-east-1\n")
        if crt:
            f.write("s3 =\n  preferred_transfer_client = crt\n")
    e = dict(base)
    e.update(AWS_CONFIG_FILE=cfg, AWS_SHARED_CREDENTIALS_FILE="/dev/null",
             AWS_EC2_METADATA_DISABLED="true", AWS_PAGER="")
    e.pop("AWS_ENDPOINT_URL", None)
    e.pop("AWS_ENDPOINT_URL_S3", None)
    return e


def command(tool, op, case_dir, url, dest, endpoint, run):
    """(argv, uses_aws_crt_config) for one transfer."""
    if tool.startswith("spot"):
        extra = ["--parallel", "16"] if tool == "spot16" else []
        if op == "push":
            return [SPOTCTL, "push", "-q", case_dir, url, "--name", "r%d" % run,
                    "--endpoint", endpoint] + extra
        return [SPOTCTL, "restore", "-q", url, dest, "--name", "r%d" % run,
                "--endpoint", endpoint] + extra
    ep = endpoint if tool == "aws" else endpoint.rsplit(":", 1)[0]
    src, dst = (case_dir, url + "/r%d/" % run) if op == "push" else \
        (url + "/r%d/" % run, dest)
    return [AWS, "--endpoint-url", ep, "s3", "cp", "--quiet", "--recursive",
            src, dst]


CHILD = [None]  # the measured process, killed if we are stopped


def on_term(*_):
    if CHILD[0] is not None:
        CHILD[0].kill()
    raise SystemExit("wan_bench: stopped")


def measure(argv, envv, log_path):
    """Runs argv; returns (ok, wall_s, cpu_s, maxrss_kib)."""
    with open(log_path, "wb") as lf:
        t0 = time.monotonic()
        p = subprocess.Popen(argv, env=envv, stdout=lf, stderr=subprocess.STDOUT)
        CHILD[0] = p
        killer = threading.Timer(TIMEOUT, p.kill)
        killer.start()
        _, status, ru = os.wait4(p.pid, 0)
        killer.cancel()
        CHILD[0] = None
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
    return (p.returncode == 0, wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss)


def tail(path, n=400):
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode("utf-8", "replace")
    except OSError:
        return ""


# ---- the rounds ----------------------------------------------------------------

class Bench:
    def __init__(self):
        self.results = {"model": MODEL, "sizes": SIZES, "runs": RUNS,
                        "quick": QUICK, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                 time.gmtime()),
                        "nproc": os.cpu_count(), "records": [], "notes": []}
        self.json_path = os.path.join(OUT, "wan.json")

    def save(self):
        tmp = self.json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.results, f, indent=1)
        os.replace(tmp, self.json_path)

    def ceiling(self):
        self.results["proxy_ceiling"] = []
        for conns, rate in ((16, MODEL["rate_mbs"]), (32, MODEL["rate_mbs"]), (16, 0)):
            r = subprocess.run([PY, os.path.join(HERE, "wanproxy_ceiling.py"),
                                "--conns", str(conns), "--mb", "64" if not QUICK else "16",
                                "--rate", str(rate), "--rtt", str(MODEL["rtt_ms"])],
                               capture_output=True, text=True, check=True)
            self.results["proxy_ceiling"].append(json.loads(r.stdout))
            log("proxy ceiling", r.stdout.strip())
        self.save()

    def proxy(self, upstream_port, variant):
        port = 80 if port_free(80) else 0
        cmd = [PY, os.path.join(HERE, "wanproxy.py"), "127.0.0.1:%d" % upstream_port,
               "--port", str(port), "--rate", str(MODEL["rate_mbs"]),
               "--rtt", str(MODEL["rtt_ms"]), "--setup-rtts", str(MODEL["setup_rtts"])]
        if variant == "lossy":
            cmd += ["--loss", str(MODEL["loss"]), "--stall-ms", str(MODEL["stall_ms"])]
        return start_printing_port(cmd)

    def one(self, rec, argv, envv, px, ceph):
        logp = os.path.join(WORK, "last.log")
        pc0, sc0 = proc_cpu(px.pid) if px else 0.0, ceph.cpu() if ceph else 0.0
        ok, wall, cpu, rss = measure(argv, envv, logp)
        rec.update(ok=ok, wall_s=round(wall, 3), cpu_s=round(cpu, 3), rss_kib=rss,
                   proxy_cpu_s=round(proc_cpu(px.pid) - pc0, 3) if px else 0.0,
                   server_cpu_s=round(ceph.cpu() - sc0, 3) if ceph else None)
        if not ok:
            rec["error"] = tail(logp)
            log("FAILED", rec["tool"], rec["op"], rec["case"], rec["error"][-200:])
        log("%-7s %-5s %-7s %-6s %-6s run %d: %.2f s, %.2f CPU-s, %d MiB" % (
            rec["target"], rec["variant"], rec["case"], rec["tool"], rec["op"],
            rec["run"], wall, cpu, rss >> 10))
        self.results["records"].append(rec)
        self.save()
        return ok

    def wipe(self, base_env, ceph):
        e = aws_env(base_env, False)
        subprocess.run([AWS, "--endpoint-url", ceph.env["SPOT_TEST_S3_ENDPOINT"], "s3",
                        "rm", "--quiet", "--recursive",
                        "s3://%s/wan/" % ceph.env["SPOT_TEST_S3_BUCKET"]],
                       env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ceph.gc()

    def target(self, target, data, ceph):
        if target == "discard":
            sink, up_port = start_printing_port([PY, os.path.join(HERE, "s3_discard.py")])
            bucket = "discard"
            base = discard_env()
        else:
            sink = None
            up_port = int(ceph.env["SPOT_TEST_S3_ENDPOINT"].rsplit(":", 1)[1])
            bucket = ceph.env["SPOT_TEST_S3_BUCKET"]
            base = dict(os.environ, **ceph.env)
        try:
            if target == "discard" and "spot" in TOOLS and "fp32" in CASES:
                self.direct(data["fp32"], up_port, base)
                self.csink(data, base)
            for variant in VARIANTS:
                px, port = self.proxy(up_port, variant)
                try:
                    self.variant(target, variant, data, ceph if target == "ceph" else None,
                                 bucket, base, px, port)
                finally:
                    stop(px)
        finally:
            stop(sink)

    def csink(self, data, base):
        """The pipeline's own ceiling: spotctl push straight to the C sink,
        1 GiB and the 4 GiB checkpoint."""
        if not os.access(SINK_C, os.X_OK):
            self.results["notes"].append("no %s: no C sink ceiling" % SINK_C)
            return
        sink, port = start_printing_port([SINK_C])
        try:
            for case in [c for c in ("fp32", "big") if c in data]:
                size, files = tree_size(data[case])
                for run in range(1, RUNS + 1):
                    rec = {"target": "discard", "variant": "csink", "case": case,
                           "tool": "spot", "op": "push", "run": run, "bytes": size,
                           "files": files}
                    argv = command("spot", "push", data[case], "s3://discard/wan/csink",
                                   "", "http://127.0.0.1:%d" % port, run)
                    c0 = proc_cpu(sink.pid)
                    self.one(rec, argv, base, None, None)
                    rec["server_cpu_s"] = round(proc_cpu(sink.pid) - c0, 3)
                    self.save()
        finally:
            stop(sink)

    def direct(self, case_dir, port, base):
        """The pipeline's own ceiling: spotctl push straight to the sink."""
        size, files = tree_size(case_dir)
        for run in range(1, RUNS + 1):
            rec = {"target": "discard", "variant": "direct", "case": "fp32",
                   "tool": "spot", "op": "push", "run": run, "bytes": size,
                   "files": files}
            argv = command("spot", "push", case_dir, "s3://discard/wan/direct", "",
                           "http://127.0.0.1:%d" % port, run)
            self.one(rec, argv, base, None, None)
        # the same through the proxy with no cap and no delay: what the
        # proxy itself costs the fastest client
        px, pport = start_printing_port([PY, os.path.join(HERE, "wanproxy.py"),
                                         "127.0.0.1:%d" % port, "--rate", "0",
                                         "--rtt", "0", "--setup-rtts", "0"])
        try:
            for run in range(1, RUNS + 1):
                for tool in [t for t in TOOLS if t.startswith("spot")]:
                    rec = {"target": "discard", "variant": "noshape", "case": "fp32",
                           "tool": tool, "op": "push", "run": run, "bytes": size,
                           "files": files}
                    argv = command(tool, "push", case_dir, "s3://discard/wan/noshape",
                                   "", "http://127.0.0.1:%d" % pport, run)
                    self.one(rec, argv, base, px, None)
        finally:
            stop(px)

    def variant(self, target, variant, data, ceph, bucket, base, px, port):
        endpoint = "http://127.0.0.1:%d" % port
        tools = [t for t in TOOLS if t != "crt" or port == 80]
        if "crt" in TOOLS and port != 80:
            self.results["notes"].append("port 80 busy: no CRT figures")
        envs = {t: aws_env(base, t == "crt") if t in ("aws", "crt") else base
                for t in tools}
        cases = [c for c in CASES if variant == "wan" or c in LOSSY_CASES]
        ops = ["push"] + (["restore"] if ceph else [])
        if ceph:  # warm the server (the first upload is 25-40 % slower)
            subprocess.run([SPOTCTL, "push", "-q", data[cases[0]] if "fp32" not in data
                            else data["fp32"], "s3://%s/wan/warm" % bucket,
                            "--endpoint", endpoint], env=base,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.wipe(base, ceph)
        raw = {c: tree_size(data[c]) for c in cases}
        for case in cases:
            for run in range(1, RUNS + 1):
                # rotate the order so no tool always goes first
                order = tools[run % len(tools):] + tools[:run % len(tools)]
                for tool in order:
                    url = "s3://%s/wan/%s/%s" % (bucket, tool, case)
                    dest = os.path.join(WORK, "restore", tool)
                    for op in ops:
                        shutil.rmtree(dest, ignore_errors=True)
                        if op == "restore" and tool in ("aws", "crt"):
                            os.makedirs(dest)
                        rec = {"target": target, "variant": variant, "case": case,
                               "tool": tool, "op": op, "run": run,
                               "bytes": raw[case][0], "files": raw[case][1]}
                        argv = command(tool, op, data[case], url, dest, endpoint, run)
                        ok = self.one(rec, argv, envs[tool], px, ceph)
                        if op == "restore" and ok:
                            got = tree_size(dest)
                            rec["verified"] = got == raw[case]
                            if not rec["verified"]:
                                log("restore of %s by %s differs: %s vs %s" % (
                                    case, tool, got, raw[case]))
                            self.save()
                        if not ok:
                            break
                    shutil.rmtree(dest, ignore_errors=True)
                if ceph:
                    self.wipe(base, ceph)


def memory_budget():
    """spotctl's default --memory in bytes, from its --help, or None."""
    import re
    out = subprocess.run([SPOTCTL, "push", "--help"], capture_output=True,
                         text=True).stdout
    m = re.search(r"--memory SIZE.*default (\d+)([KMG])", out)
    if not m:
        return None
    return int(m.group(1)) << {"K": 10, "M": 20, "G": 30}[m.group(2)]


def discard_env():
    """The environment of a client of the discard sinks (any credentials)."""
    return dict(os.environ, AWS_ACCESS_KEY_ID="AKIDISCARD",
                AWS_SECRET_ACCESS_KEY="discard", AWS_REGION="us-east-1",
                AWS_DEFAULT_REGION="us-east-1")


def report(b):
    subprocess.run([PY, os.path.join(HERE, "wan_report.py"), b.json_path,
                    os.path.join(OUT, "wan.md"), os.path.join(OUT, "wan.png")])


def main():
    global SPOTCTL, SINK_C
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SRC, "build")
    SPOTCTL = os.path.join(os.path.abspath(build), "client", "spotctl")
    SINK_C = os.path.join(os.path.abspath(build), "bench", "s3_sink")
    if not os.access(SPOTCTL, os.X_OK):
        sys.exit("no %s: build first" % SPOTCTL)
    os.makedirs(os.path.join(WORK, "restore"), exist_ok=True)
    os.makedirs(OUT, exist_ok=True)
    signal.signal(signal.SIGTERM, on_term)
    b = Bench()
    b.results["memory_budget"] = memory_budget()
    data = make_data()
    if CSINK_ONLY:
        with open(b.json_path) as f:
            b.results = json.load(f)
        b.results["records"] = [r for r in b.results["records"]
                                if r["variant"] != "csink"]
        b.results["notes"] = [n for n in b.results.get("notes", [])
                              if "C sink" not in n]
        b.csink(data, discard_env())
        b.save()
        report(b)
        return
    b.ceiling()
    ceph = None
    try:
        if "ceph" in TARGETS:
            ceph = Ceph().start()
        for target in TARGETS:
            b.target(target, data, ceph)
    finally:
        if ceph:
            ceph.stop()
        b.results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        b.save()
        shutil.rmtree(os.path.join(WORK, "restore"), ignore_errors=True)
        report(b)


if __name__ == "__main__":
    main()
