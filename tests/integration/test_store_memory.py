#!/usr/bin/python3
"""Bounded memory: peak RSS (/usr/bin/time -f %M) of `spotctl push` and
`spotctl restore` of a 1 GiB fp32 checkpoint stays <= 96 MiB with 2
workers, 4 transfers and 8 MiB parts (the push's, which the restore follows; fixed here so the bound does not
depend on the core count or the default part size, 16 MiB, which doubles
every term). The pipeline holds at most workers x
(raw part + codec scratch) + (workers + parallel) x compressed part,
whatever the checkpoint size: 4 GiB measured the same (see the report of
bench/store_bench.sh), so 1 GiB keeps the test short. Memory is not
timing: asserting it is stable."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("memory")
LIMIT_KB = 96 * 1024
# ASan's shadow memory and quarantine inflate RSS: the bound is a property
# of the plain build, so sanitized runs only check correctness.
if os.environ.get("ASAN_OPTIONS"):
    LIMIT_KB = 1 << 40
SIZE = int(os.environ.get("SPOT_TEST_MEMORY_BYTES", 1 << 30))
exe = os.environ.get("SPOTCTL") or spotlib.builddir_path("client", "spotctl")
with open(exe, "rb") as _f:
    # ASan's shadow memory and quarantine are not the program's: under a
    # sanitizer build the RSS is printed, not asserted
    SANITIZED = b"__asan_init" in _f.read()


def peak_kb(args, tmp):
    out = os.path.join(tmp, "rss")
    cp = spotlib.run(["/usr/bin/time", "-f", "%M", "-o", out, exe] + args, timeout=300)
    try:
        kb = int(open(out).read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        kb = -1
    return cp, kb


try:
    with tempfile.TemporaryDirectory(dir=os.environ.get("SPOT_TEST_BIGTMP", "/tmp")) as tmp:
        src = os.path.join(tmp, "ckpt")
        os.makedirs(src)
        # two tensors: weights and the Adam state in one file
        spotlib.write_gaussian(os.path.join(src, "model.fp32"), SIZE // 2, seed=1)
        spotlib.write_gaussian(os.path.join(src, "optim.fp32"), SIZE // 2, seed=2)
        cp, kb = peak_kb(["push", src, url, "--workers", "2", "--parallel", "4",
                           "--part-size", "8M"], tmp)
        c.check(cp.returncode == 0, "push of %d MiB succeeds" % (SIZE >> 20),
                cp.stdout + cp.stderr)
        print("push peak RSS %.1f MiB (%s)" % (kb / 1024, cp.stdout.strip()))
        c.check(0 < kb and (SANITIZED or kb <= LIMIT_KB),
                "push peak RSS %.1f MiB <= 96 MiB%s" % (kb / 1024, " (ASan: not checked)" * SANITIZED))
        dst = os.path.join(tmp, "restored")
        cp, kb = peak_kb(["restore", url, dst, "--workers", "2", "--parallel", "4"], tmp)
        c.check(cp.returncode == 0, "restore succeeds", cp.stdout + cp.stderr)
        print("restore peak RSS %.1f MiB (%s)" % (kb / 1024, cp.stdout.strip()))
        c.check(0 < kb and (SANITIZED or kb <= LIMIT_KB),
                "restore peak RSS %.1f MiB <= 96 MiB%s" % (kb / 1024, " (ASan: not checked)" * SANITIZED))
        ok, detail = spotlib.same_tree(src, dst)
        c.check(ok, "the restored copy is exact", detail)
finally:
    spotlib.s3_cleanup(root)

c.finish()
