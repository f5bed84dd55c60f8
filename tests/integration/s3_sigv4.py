#!/usr/bin/python3
"""The Authorization header curl sends (CURLOPT_AWS_SIGV4) equals the one
lib/sigv4.c computes from the request that went out, for PUT, ranged GET,
list (query needing encoding), create/abort multipart and DeleteObjects,
on a key with spaces, '+', unicode, '~', '=' and '&'; and Ceph accepts
every one of them."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
import s3common  # noqa: E402

endpoint, bucket = spotlib.need_env("SPOT_TEST_S3_ENDPOINT", "SPOT_TEST_S3_BUCKET")
c = spotlib.Checks()
key = s3common.unique_prefix("sig") + "a b+c/\u20ac~x=y&z.bin"
cp = s3common.tool("sigcheck", bucket, key)
c.check(cp.returncode == 0, "all requests accepted by the server", cp.stdout + cp.stderr)
c.check("ok sigcheck 6 requests" in cp.stdout and "MISMATCH" not in cp.stderr,
        "our signature equals curl's for 6 requests", cp.stdout + cp.stderr)
c.finish()
