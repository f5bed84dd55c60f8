#!/usr/bin/python3
"""S3 faults between spotctl and the real Ceph, through faultproxy.py.

For each fault (503 SlowDown on a fraction of requests, connection reset
mid request body, reset mid response, a stall longer than the low-speed
timeout, a bandwidth cap, added latency) `spotctl push` of a multi-part
checkpoint goes through the proxy; it must exit 0, its summary line must
report as many retries as faults were injected, and the checkpoint read
back directly from Ceph (`spotctl restore` without the proxy) must be
identical to the source. Decisions are seeded (SPOT_FAULT_SEEDS, default
"1"), so a run is reproducible. SPOT_FAULT_REPORT=FILE appends one JSON
line per push (for docs/reliability.md)."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402

endpoint, bucket = spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("faults")
LOW_SPEED = 2  # SPOT_S3_LOW_SPEED_TIME for the pushes
seeds = [int(s) for s in os.environ.get("SPOT_FAULT_SEEDS", "1").split(",")]
report = os.environ.get("SPOT_FAULT_REPORT")
ALL = None  # every kind of request

# name: (proxy settings, whether it injects retried faults)
SCENARIOS = [
    ("none", dict(), False),
    ("slowdown", dict(slowdown=0.3, max_per_request=2), True),
    ("reset-request-body", dict(reset_req=0.3, kinds={"part", "put", "complete", "create"}),
     True),
    ("reset-response", dict(reset_resp=0.25), True),
    ("stall", dict(stall=0.3, stall_s=LOW_SPEED + 3), True),
    ("bandwidth-16MB/s", dict(bandwidth=16 * 1000 * 1000), False),
    ("latency-100ms", dict(latency_ms=100), False),
]
SUMMARY = re.compile(r"^pushed (\S+): .* in ([0-9.]+) s .*, (\d+) retries")


def make_checkpoint(d):
    os.makedirs(d)
    spotlib.write_gaussian(os.path.join(d, "model.pt"), 23 * 1024 * 1024 + 4096, seed=7)
    spotlib.write_random(os.path.join(d, "optim.bin"), 6 * 1024 * 1024 + 5)
    os.makedirs(os.path.join(d, "sub"))
    with open(os.path.join(d, "sub", "meta.json"), "w") as f:
        json.dump({"step": 1234, "note": "x" * 3000}, f)


def push_names(argv, env):
    """spotctl push ARGV..., reading its threads' names
    (/proc/PID/task/*/comm) every 50 ms while it runs: (CompletedProcess,
    the set of names seen)."""
    names = set()
    p = spotlib.spotctl_popen(*argv, env=dict(os.environ, **env), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = "", ""
    while True:
        try:
            out, err = p.communicate(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            pass
        task = "/proc/%d/task" % p.pid
        try:
            for t in os.listdir(task):
                with open(os.path.join(task, t, "comm")) as f:
                    names.add(f.read().strip())
        except OSError:
            pass  # a thread ended (or the process) between the reads
    return subprocess.CompletedProcess(argv, p.returncode, out, err), names


def check_names(names, what):
    """Every thread is named by its role (docs/design.md, "Threads and the
    loop"): the main thread spotctl (its loop; curl's resolver threads
    inherit that name), push workers, and S3 I/O threads when
    SPOT_IO_THREADS asks for them."""
    role = re.compile(r"^(spotctl|push-wk-[0-9]+|s3-lane-[0-9]+)$")
    c.check(bool(names) and all(role.match(n) for n in names),
            "%s: every thread is named by its role" % what, repr(sorted(names)))
    c.check("push-wk-0" in names, "%s: a push worker was seen" % what,
            repr(sorted(names)))
    if int(os.environ.get("SPOT_IO_THREADS") or "1") > 1:
        c.check("s3-lane-0" in names, "%s: an S3 I/O thread was seen" % what,
                repr(sorted(names)))


px = FaultProxy(endpoint, seed=seeds[0])
t_start = time.monotonic()
try:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "ckpt")
        make_checkpoint(src)
        baseline = None
        for seed in seeds:
            for name, settings, retried in SCENARIOS:
                px.configure(seed=seed, **settings)
                px.reset_stats()
                ck = "%s-s%d" % (re.sub(r"[^a-z0-9]+", "-", name), seed)
                t0 = time.monotonic()
                argv = ["push", src, url, "--name", ck, "--endpoint", px.url,
                        "--part-size", "5M", "--parallel", "4"]
                penv = {"SPOT_S3_LOW_SPEED_TIME": str(LOW_SPEED)}
                if name.startswith("bandwidth"):
                    cp, names = push_names(argv, penv)
                    check_names(names, what="%s (seed %d)" % (name, seed))
                else:
                    cp = spotlib.spotctl(*argv, env=penv, timeout=150)
                wall = time.monotonic() - t0
                what = "%s (seed %d)" % (name, seed)
                m = SUMMARY.search(cp.stdout.strip().splitlines()[-1]) \
                    if cp.stdout.strip() else None
                c.check(cp.returncode == 0 and m is not None,
                        "%s: push exits 0 with a summary line" % what,
                        cp.stdout + cp.stderr)
                st = px.stats()
                injected = px.injected()
                retries = int(m.group(3)) if m else -1
                print("     %s: %.1f s, requests %s, injected %s, retries %d" % (
                    what, wall, st["requests"],
                    {f: v for f, v in st["faults"].items() if v}, retries))
                if retried:
                    c.check(injected > 0, "%s: faults were injected" % what, repr(st))
                    c.check(retries == injected,
                            "%s: the summary reports the %d retries" % (what, injected),
                            "summary says %d\n%s" % (retries, cp.stderr))
                else:
                    c.check(retries == 0, "%s: no retries" % what, cp.stdout + cp.stderr)
                if name.startswith("bandwidth"):
                    need = st["bytes_up"] / settings["bandwidth"]
                    c.check(wall >= 0.7 * need,
                            "%s: the cap held (%.1f s for %d bytes)" % (
                                what, wall, st["bytes_up"]))
                if name.startswith("latency"):
                    total = sum(st["requests"].values())
                    c.check(wall >= 0.1 * total / 4,
                            "%s: latency was added (%d requests, %.1f s)" % (
                                what, total, wall))
                if name == "none":
                    baseline = wall
                # read back straight from Ceph, not through the proxy
                out = os.path.join(tmp, "out-" + ck)
                spotlib.check_restore(c, url, src, out, "%s: restored from Ceph, identical" % what,
                                      "--name", ck, "--endpoint", endpoint)
                spotlib.run(["rm", "-rf", out])
                if report:
                    with open(report, "a") as f:
                        f.write(json.dumps({
                            "fault": name, "seed": seed, "rc": cp.returncode,
                            "intact": ok, "retries": retries, "injected": injected,
                            "seconds": round(wall, 2),
                            "baseline": round(baseline or 0, 2),
                            "requests": sum(st["requests"].values())}) + "\n")
        leftovers = spotlib.s3_uploads(root)
        print("     multipart uploads left open under the job: %d" % len(leftovers))
    c.check(time.monotonic() - t_start < 170, "bounded: %.0f s" % (time.monotonic() - t_start))
finally:
    px.close()
    spotlib.s3_cleanup(root)
c.finish()
