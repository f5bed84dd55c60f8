#!/usr/bin/python3
"""Failures are clear and bounded: a wrong secret key names the S3 error
code (SignatureDoesNotMatch) and is not retried; an unreachable endpoint
(a closed loopback port) fails after exactly the configured retries;
cancel works while sending and while waiting in backoff (each callback
once, from the loop, never inside the cancel); bad
configuration is refused up front."""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
import s3common  # noqa: E402

endpoint, bucket = spotlib.need_env("SPOT_TEST_S3_ENDPOINT", "SPOT_TEST_S3_BUCKET")
c = spotlib.Checks()
key = s3common.unique_prefix("err") + "x"
secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "")

with tempfile.TemporaryDirectory() as tmp:
    f = os.path.join(tmp, "x")
    open(f, "w").write("payload")

    cp = s3common.tool("--retries", "3", "put", bucket, key, f,
                       env={"AWS_SECRET_ACCESS_KEY": "wrong" + secret[5:]})
    err = cp.stderr.strip().splitlines()
    c.check(cp.returncode == 1, "wrong secret fails")
    c.check(len(err) == 1 and "SignatureDoesNotMatch" in err[0] and "403" in err[0],
            "one clear line naming SignatureDoesNotMatch", cp.stderr)
    c.check("retries=0" in cp.stderr and "retry" not in cp.stderr.replace("retries=0", ""),
            "not retried", cp.stderr)
    c.check(secret == "" or secret not in cp.stdout + cp.stderr, "no secret in the output")

    port = s3common.closed_port()
    dead = "http://127.0.0.1:%d" % port
    t0 = time.monotonic()
    cp = s3common.tool("--endpoint", dead, "--retries", "3", "--backoff-ms", "50",
                       "head", bucket, key)
    took = time.monotonic() - t0
    c.check(cp.returncode == 1, "unreachable endpoint fails")
    last = cp.stderr.strip().splitlines()[-1] if cp.stderr.strip() else ""
    c.check(last.startswith("error: HEAD s3://%s/%s: " % (bucket, key))
            and "onnect" in last and "(after 3 retries)" in last and "err=-5 EIO" in last,
            "clear error after the bounded retries", cp.stderr)
    c.check(cp.stderr.count("retry ") == 3, "exactly 3 retries logged", cp.stderr)
    c.check(took < 10, "fails quickly (%.2f s)" % took)

    cp = s3common.tool("--endpoint", dead, "--retries", "5", "--backoff-ms", "100",
                       "cancel-test", bucket, key)
    c.check(cp.returncode == 0 and cp.stdout.count("cancelled ok") == 2,
            "cancel while sending and while in backoff", cp.stdout + cp.stderr)

    cp = s3common.tool("--endpoint", "ftp://127.0.0.1:1", "head", bucket, key)
    c.check(cp.returncode == 2 and "endpoint" in cp.stderr, "bad endpoint refused", cp.stderr)
    cp = s3common.tool("head", "no", key)
    c.check(cp.returncode == 1 and "invalid bucket" in cp.stderr, "bad bucket refused",
            cp.stderr)
    cp = s3common.tool("head", bucket, key, env={"AWS_REGION": "Bad Region"})
    c.check(cp.returncode == 2 and "region" in cp.stderr, "bad region refused", cp.stderr)
    cp = s3common.tool("head", bucket, key + "-missing")
    c.check(cp.returncode == 1 and "404" in cp.stderr and "ENOENT" in cp.stderr,
            "missing key is ENOENT", cp.stderr)
c.finish()
