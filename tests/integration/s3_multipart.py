#!/usr/bin/python3
"""40 MiB multipart upload in 8 parts sent in parallel by lib/s3 (through
s3_tool), read back by an independent reader (boto3) and compared byte for
byte; then ranged GETs across a part boundary, and no upload left over."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
import s3common  # noqa: E402

endpoint, bucket = spotlib.need_env("SPOT_TEST_S3_ENDPOINT", "SPOT_TEST_S3_BUCKET")
c = spotlib.Checks()
prefix = s3common.unique_prefix("mp")
key = prefix + "big file+ü.bin"
PART = 5 * 1024 * 1024

with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "src.bin")
    with open(src, "wb") as f:
        f.write(os.urandom(8 * PART))  # 40 MiB, 8 parts

    cp = s3common.tool("put-multipart", bucket, key, src, "--part-size", str(PART),
                       "--parallel", "8", timeout=90)
    c.check(cp.returncode == 0, "multipart upload succeeds", cp.stdout + cp.stderr)
    c.check("ok parts=8 " in cp.stdout, "8 parts", cp.stdout)
    c.check("max_in_flight=8" in cp.stdout, "all 8 parts in flight at once", cp.stdout)

    back = os.path.join(tmp, "back.bin")
    ok, detail = s3common.independent_get(bucket, key, back)
    c.check(ok, "boto3 reads the object back", detail)
    c.check(ok and spotlib.same_file(src, back), "boto3 copy is byte-identical")

    with open(src, "rb") as f:
        data = f.read()
    for off, length in ((PART - 1000, 3000), (3 * PART - 1, 2), (7 * PART - 10, 0)):
        out = os.path.join(tmp, "range.bin")
        cp = s3common.tool("get", bucket, key, str(off), str(length), out)
        want = data[off:off + length] if length else data[off:]
        got = open(out, "rb").read() if cp.returncode == 0 else b""
        c.check(cp.returncode == 0 and got == want,
                "ranged GET off=%d len=%d across a part boundary" % (off, length),
                cp.stderr)

    cp = s3common.tool("get", bucket, key, "0", "0", back)
    c.check(cp.returncode == 0 and spotlib.same_file(src, back),
            "whole GET through the sink matches", cp.stderr)
    cp = s3common.tool("head", bucket, key)
    c.check(cp.returncode == 0 and ("length=%d" % len(data)) in cp.stdout,
            "HEAD reports the size", cp.stdout + cp.stderr)

    cp = s3common.tool("list-uploads", bucket, prefix)
    c.check(cp.returncode == 0 and "uploads 0" in cp.stdout,
            "no multipart upload left behind", cp.stdout + cp.stderr)
    s3common.tool("delete", bucket, key)

c.finish()
