#!/usr/bin/python3
"""Abort a multipart upload with two parts uploaded: afterwards neither the
upload nor the object exists (checked by lib/s3 and by boto3)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
import s3common  # noqa: E402

endpoint, bucket = spotlib.need_env("SPOT_TEST_S3_ENDPOINT", "SPOT_TEST_S3_BUCKET")
c = spotlib.Checks()
prefix = s3common.unique_prefix("abort")
key = prefix + "obj"

cp = s3common.tool("abort-test", bucket, key, timeout=60)
c.check(cp.returncode == 0, "create, 2 parts, list parts, abort", cp.stdout + cp.stderr)
c.check("parts 2" in cp.stdout, "ListParts saw both parts", cp.stdout)
c.check("head after abort: ENOENT" in cp.stdout, "HEAD after abort is ENOENT", cp.stdout)
c.check(s3common.independent_uploads(bucket, prefix) == [], "boto3: no upload left")
c.check(s3common.independent_list(bucket, prefix) == [], "boto3: no object")
c.finish()
