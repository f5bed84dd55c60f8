#!/usr/bin/python3
"""ListObjectsV2 through lib/s3 over several pages (max-keys small), with
keys that need encoding (space, '+', unicode, '=', '&', '~'), compared with
what boto3 lists; delimiter listing gives common prefixes; DeleteObjects
removes them all."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
import s3common  # noqa: E402

endpoint, bucket = spotlib.need_env("SPOT_TEST_S3_ENDPOINT", "SPOT_TEST_S3_BUCKET")
c = spotlib.Checks()
prefix = s3common.unique_prefix("list") + "a b+€/"
names = ["k0", "k 1", "k+2", "k=3&x", "k~4", "sub/k5", "sub/k6", "\u00e9t\u00e9"]
keys = sorted(prefix + n for n in names)

with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "x")
    with open(src, "wb") as f:
        f.write(b"hello")
    for k in keys:
        cp = s3common.tool("put", bucket, k, src)
        c.check(cp.returncode == 0, "put %r" % k, cp.stderr)

cp = s3common.tool("list", bucket, prefix, "--max-keys", "3")
listed = sorted(l.split(" ", 1)[1].rsplit(" ", 1)[0]
                for l in cp.stdout.splitlines() if l.startswith("key "))
c.check(cp.returncode == 0, "list succeeds", cp.stderr)
c.check("pages 3 objects 8" in cp.stdout, "8 keys in 3 pages of 3", cp.stdout)
c.check(listed == keys, "every key listed exactly once, decoded", repr(listed))
c.check(s3common.independent_list(bucket, prefix) == keys, "boto3 sees the same keys")

cp = s3common.tool("list", bucket, prefix, "--delimiter", "/")
c.check(cp.returncode == 0 and ("prefix %ssub/" % prefix) in cp.stdout
        and "pages 1 objects 6" in cp.stdout,
        "delimiter gives a common prefix", cp.stdout + cp.stderr)

cp = s3common.tool("delete", bucket, *keys)
c.check(cp.returncode == 0 and "ok failed=0" in cp.stdout, "DeleteObjects", cp.stdout + cp.stderr)
cp = s3common.tool("list", bucket, prefix)
c.check(cp.returncode == 0 and "pages 1 objects 0" in cp.stdout, "nothing left", cp.stdout)
c.finish()
