#!/usr/bin/python3
"""PUT with If-None-Match: * (how a manifest commits): the first succeeds,
the second is refused with 412 -> -EEXIST, and the object keeps the first
content."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
import s3common  # noqa: E402

endpoint, bucket = spotlib.need_env("SPOT_TEST_S3_ENDPOINT", "SPOT_TEST_S3_BUCKET")
c = spotlib.Checks()
key = s3common.unique_prefix("cond") + "MANIFEST.json"

with tempfile.TemporaryDirectory() as tmp:
    a, b, back = (os.path.join(tmp, n) for n in ("a", "b", "back"))
    open(a, "w").write('{"first": true}')
    open(b, "w").write('{"second": true}')
    cp = s3common.tool("put", bucket, key, a, "--if-none-match")
    c.check(cp.returncode == 0, "first conditional PUT succeeds", cp.stderr)
    cp = s3common.tool("put", bucket, key, b, "--if-none-match")
    c.check(cp.returncode == 1, "second conditional PUT fails", cp.stdout + cp.stderr)
    c.check("412" in cp.stderr and "err=-%d EEXIST" % 17 in cp.stderr,
            "refused with 412 mapped to -EEXIST", cp.stderr)
    c.check("retries=0" in cp.stderr, "412 is not retried", cp.stderr)
    ok, detail = s3common.independent_get(bucket, key, back)
    c.check(ok and spotlib.same_file(a, back), "object keeps the first content", detail)
    cp = s3common.tool("put", bucket, key, b)
    c.check(cp.returncode == 0, "an unconditional PUT still overwrites", cp.stderr)
    s3common.tool("delete", bucket, key)
c.finish()
