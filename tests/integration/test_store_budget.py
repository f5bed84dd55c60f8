#!/usr/bin/python3
"""Concurrency that follows the network, within a memory budget (issue
15.1), against the real Ceph RGW:

1. Through bench/wanproxy.py (each connection capped at 8 MB/s, 20 ms
   RTT: the connections, not the CPU, are what limits) `spotctl push` and
   `spotctl restore` of 320 MiB with `--memory 128M --part-size 5M` and
   adaptive concurrency: the data round-trips, the debug log shows the
   transfers in flight growing above the start (8), never above what the
   budget fits, and the peak RSS (/usr/bin/time %M) stays within the
   budget plus a baseline measured here (the same spotctl restoring a
   1 MiB folder: binary, libraries, curl, the loop).
2. Through tests/integration/faultproxy.py answering 503 SlowDown to a
   third of the part uploads (each part at most once) with --parallel
   unset: the push backs off ("throttled" in the log: fewer transfers),
   still succeeds, and the data round-trips.
3. `--parallel 3` is a fixed count: no change in the log.
No timing assertions: only what happened, and memory."""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402

SRC = os.environ.get("SPOT_SRCDIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(SRC, "bench"))
import wanproxy  # noqa: E402

endpoint, bucket = spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("budget")
url2, root2 = spotlib.unique_job("budget-slow")
MIB = 1 << 20
BUDGET = 128 * MIB
SIZE = int(os.environ.get("SPOT_TEST_BUDGET_BYTES", 320 * MIB))
exe = os.environ.get("SPOTCTL") or spotlib.builddir_path("client", "spotctl")
with open(exe, "rb") as _f:
    # ASan's shadow memory and quarantine are not the program's
    SANITIZED = b"__asan_init" in _f.read()
DEBUG = {"SPOTD_LOG_LEVEL": "7"}
CHANGE = re.compile(r"(push|restore) name=\S+ parallel (\d+) -> (\d+) \(([^;)]*)")
START = re.compile(r"(push|restore) name=\S+ parallel (\d+) \((adaptive|fixed), "
                   r"at most (\d+)")


def measured(args, tmp):
    """(CompletedProcess, peak RSS in bytes) of spotctl ARGS."""
    out = os.path.join(tmp, "rss")
    cp = spotlib.run(["/usr/bin/time", "-f", "%M", "-o", out, exe] + args,
                     timeout=300, env=DEBUG)
    try:
        kb = int(open(out).read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        kb = -1
    return cp, kb * 1024


def changes(text, op):
    return [(int(a), int(b), why) for o, a, b, why in CHANGE.findall(text) if o == op]


def start_of(text, op):
    for o, start, kind, most in START.findall(text):
        if o == op:
            return int(start), kind, int(most)
    return None


def check_adaptive(cp, rss, op, baseline):
    log = cp.stderr
    st = start_of(log, op)
    ch = changes(log, op)
    c.check(cp.returncode == 0, "%s through the WAN proxy succeeds" % op,
            cp.stdout + log[-3000:])
    c.check(st is not None and st[1] == "adaptive",
            "%s: adaptive concurrency, started at %s" % (op, st), log[-2000:])
    if st is None:
        return
    start, _, most = st
    peak = max([start] + [b for _, b, _ in ch])
    print("%s: start %d, at most %d, changes %s, peak RSS %.1f MiB" %
          (op, start, most, ch, rss / MIB))
    c.check(peak > start, "%s: the transfers in flight grew above the start "
            "(%d -> %d)" % (op, start, peak), str(ch))
    c.check(peak <= most and most <= BUDGET // (5 * MIB),
            "%s: never above what the budget fits (%d)" % (op, most), str(ch))
    limit = BUDGET + baseline
    c.check(rss > 0 and (SANITIZED or rss <= limit),
            "%s: peak RSS %.1f MiB <= budget %d MiB + baseline %.1f MiB%s" %
            (op, rss / MIB, BUDGET // MIB, baseline / MIB,
             " (ASan: not checked)" * SANITIZED))


try:
    with tempfile.TemporaryDirectory(dir=os.environ.get("SPOT_TEST_BIGTMP", "/tmp")) as tmp:
        # the baseline: the same binary moving a 1 MiB folder
        small = os.path.join(tmp, "small")
        os.makedirs(small)
        spotlib.write_gaussian(os.path.join(small, "t.fp32"), MIB, seed=3)
        cp, b1 = measured(["push", small, url, "-n", "base", "--memory", "128M"], tmp)
        c.check(cp.returncode == 0, "baseline push", cp.stderr[-2000:])
        cp, b2 = measured(["restore", url, os.path.join(tmp, "small.out"), "-n", "base"], tmp)
        c.check(cp.returncode == 0, "baseline restore", cp.stderr[-2000:])
        # The restore's: its coders are sized for 1 MiB frames. (The push's
        # are for whole parts, and meson's MALLOC_PERTURB_ touches every
        # allocated byte: 2 x 16 MiB of coders the budget already counts.)
        baseline = b2
        print("baseline peak RSS %.1f MiB (push %.1f, restore %.1f)" % (baseline / MIB, b1 / MIB, b2 / MIB))

        src = os.path.join(tmp, "ckpt")
        os.makedirs(src)
        spotlib.write_gaussian(os.path.join(src, "model.fp32"), SIZE // 2, seed=1)
        spotlib.write_gaussian(os.path.join(src, "optim.fp32"), SIZE // 2, seed=2)

        # 1. adaptive, through a WAN whose connections are the limit
        host, port = endpoint.split("//", 1)[1].rsplit(":", 1)
        wan = wanproxy.WanProxy(host, int(port), rate_mbs=8.0, rtt_ms=20.0,
                                setup_rtts=1).start()
        wurl = "http://127.0.0.1:%d" % wan.port
        try:
            cp, rss = measured(["push", src, url, "-n", "big", "--endpoint", wurl,
                                "--memory", "128M", "--part-size", "5M"], tmp)
            check_adaptive(cp, rss, "push", baseline)
            dst = os.path.join(tmp, "restored")
            cp, rss = measured(["restore", url, dst, "-n", "big", "--endpoint", wurl,
                                "--memory", "128M"], tmp)
            check_adaptive(cp, rss, "restore", baseline)
            ok, detail = spotlib.same_tree(src, dst)
            c.check(ok, "the restored copy is exact", detail)
        finally:
            wan.close()

        # 2. 503 SlowDown on a third of the parts: it backs off, still works
        slow = os.path.join(tmp, "slow")
        os.makedirs(slow)
        spotlib.write_gaussian(os.path.join(slow, "w.fp32"), 96 * MIB, seed=4)
        px = FaultProxy(endpoint, seed=7)
        try:
            px.configure(slowdown=0.34, kinds={"part"}, max_per_request=1)
            cp, _ = measured(["push", slow, url2, "-n", "slow", "--endpoint", px.url,
                              "--part-size", "5M"], tmp)
            cuts = [x for x in changes(cp.stderr, "push") if x[2] == "throttled"]
            print("throttled: injected %s, cuts %s" % (px.injected("slowdown"), cuts))
            c.check(cp.returncode == 0, "push with 503 SlowDown answers succeeds",
                    cp.stderr[-3000:])
            c.check(px.injected("slowdown") > 0, "SlowDown was answered")
            c.check(len(cuts) >= 1 and all(b < a for a, b, _ in cuts),
                    "the push backed off on SlowDown (%s)" % cuts, cp.stderr[-3000:])
        finally:
            px.close()
        dst2 = os.path.join(tmp, "slow.out")
        cp = spotlib.spotctl("restore", url2, dst2, "-n", "slow", timeout=120)
        c.check(cp.returncode == 0, "restore of the throttled push", cp.stderr)
        ok, detail = spotlib.same_tree(slow, dst2)
        c.check(ok, "the throttled push round-trips", detail)

        # 3. --parallel N is fixed
        dst3 = os.path.join(tmp, "fixed.out")
        cp = spotlib.run([exe, "restore", url2, dst3, "-n", "slow", "--parallel", "3"],
                         timeout=120, env=DEBUG)
        st = start_of(cp.stderr, "restore")
        c.check(cp.returncode == 0 and st is not None and st[:2] == (3, "fixed") and
                not changes(cp.stderr, "restore"),
                "--parallel 3 is a fixed count (%s)" % (st,), cp.stderr[-2000:])
finally:
    spotlib.s3_cleanup(root)
    spotlib.s3_cleanup(root2)

c.finish()
