#!/usr/bin/python3
"""One `spotctl push` or `restore` through bench/wanproxy.py (default 60
MB/s per connection, 20 ms RTT, 2 RTTs of set-up) in front of the discard
sink (bench/s3_discard.py, push only) or the Ceph of $SPOT_TEST_S3_*, with
SPOTD_LOG_LEVEL=7: prints the concurrency changes (pace.h),
wall time, client CPU and peak RSS. Not a test: it asserts nothing.

usage: pace_bench.py SPOTCTL discard|ceph push|restore [spotctl options]
  env: SRC (folder to push), DST (restore target), JOB, NAME, RATE (MB/s)
Cleans nothing up in Ceph: delete the job (s3://BUCKET/pace-bench/JOB)."""
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"


def start(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    return p, int(p.stdout.readline().strip().split()[-1].rsplit(":", 1)[-1])


def main(argv):
    exe, target, op = argv[1:4]
    extra = argv[4:]
    env = dict(os.environ)
    procs = []
    try:
        if target == "discard":
            s, up = start([PY, os.path.join(HERE, "s3_discard.py")])
            procs.append(s)
            bucket = "discard"
            env.update(AWS_ACCESS_KEY_ID="AKIDISCARD",
                       AWS_SECRET_ACCESS_KEY="discard", AWS_REGION="us-east-1")
        else:
            up = int(env["SPOT_TEST_S3_ENDPOINT"].rsplit(":", 1)[1])
            bucket = env["SPOT_TEST_S3_BUCKET"]
        px, pport = start([PY, os.path.join(HERE, "wanproxy.py"), "127.0.0.1:%d" % up,
                           "--rate", env.get("RATE", "60"), "--rtt", "20",
                           "--setup-rtts", "2"])
        procs.append(px)
        env["SPOTD_LOG_LEVEL"] = "7"
        url = "s3://%s/pace-bench/%s" % (bucket, env.get("JOB", "j1"))
        ep = "http://127.0.0.1:%d" % pport
        if op == "push":
            cmd = [exe, "push", env["SRC"], url, "--endpoint", ep,
                   "-n", env.get("NAME", "c1")] + extra
        else:
            dst = env.get("DST", "/tmp/pace-bench-out")
            subprocess.run(["rm", "-rf", dst], check=False)
            cmd = [exe, "restore", url, dst, "--endpoint", ep] + extra
        t0 = time.monotonic()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        for line in p.stderr.splitlines():
            if " parallel " in line:
                print("  ", line.split("debug: ", 1)[-1])
        print(p.stdout.strip()[-300:])
        if p.returncode != 0:
            print(p.stderr[-2000:])
        print("RESULT %s %s %s rc %d wall %.2f s cpu %.2f s peak RSS %.0f MiB" %
              (target, op, " ".join(extra), p.returncode, wall,
               r.ru_utime + r.ru_stime, r.ru_maxrss / 1024))
    finally:
        for q in procs:
            q.terminate()


if __name__ == "__main__":
    main(sys.argv)
