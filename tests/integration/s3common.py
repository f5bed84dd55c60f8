"""S3 helpers shared by the s3_*.py integration tests: run s3_tool, read
back independently (tests/s3check.py when present, else boto3 directly)."""
import os
import socket
import uuid

import spotlib

TOOL = spotlib.builddir_path("tests", "integration", "s3_tool")
S3CHECK = spotlib.srcdir_path("tests", "s3check.py")


def unique_prefix(name):
    return "itest/%s-%s/" % (name, uuid.uuid4().hex[:8])


def tool(*args, timeout=60, env=None):
    """Runs s3_tool; SPOT_S3_TOOL_WRAPPER (e.g. "valgrind -q
    --error-exitcode=99") runs it under a checker."""
    wrapper = os.environ.get("SPOT_S3_TOOL_WRAPPER", "").split()
    return spotlib.run(wrapper + [TOOL] + list(args), timeout=timeout * (5 if wrapper else 1),
                       env=env)


def closed_port():
    """A loopback port nobody listens on (bound, then closed)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _boto3():
    import boto3
    from botocore.config import Config
    return boto3.client(
        "s3", endpoint_url=os.environ["SPOT_TEST_S3_ENDPOINT"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=Config(s3={"addressing_style": "path"}))


def independent_get(bucket, key, out):
    """(ok, detail): the object read by a reader that is not lib/s3."""
    if os.path.exists(S3CHECK):
        cp = spotlib.run([spotlib.PY3, S3CHECK, "get", bucket, key, out], timeout=120)
        return cp.returncode == 0, cp.stdout + cp.stderr
    try:
        _boto3().download_file(bucket, key, out)
        return True, "boto3"
    except Exception as e:  # noqa: BLE001 - report anything
        return False, repr(e)


def independent_list(bucket, prefix):
    """Keys under prefix as another reader sees them, or None."""
    try:
        pages = _boto3().get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for p in pages for o in p.get("Contents", []))
    except Exception as e:  # noqa: BLE001
        print("boto3 list failed: %r" % e)
        return None


def independent_uploads(bucket, prefix):
    try:
        r = _boto3().list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        return [u["Key"] for u in r.get("Uploads", [])]
    except Exception as e:  # noqa: BLE001
        print("boto3 list uploads failed: %r" % e)
        return None
