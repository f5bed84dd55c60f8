"""Small shared helpers for the integration test scripts (python3 stdlib).

Keep this generic: environment access, running a command with a timeout,
comparing files, skipping, and collecting check results.
"""
import filecmp
import os
import subprocess
import sys

SKIP = 77

SRCDIR = os.environ.get(
    "SPOT_SRCDIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
BUILDDIR = os.environ.get("SPOT_BUILDDIR", os.path.join(SRCDIR, "build"))
PY3 = "/usr/bin/python3"


def skip(why):
    """Exit with meson's skip status."""
    print("SKIP: " + why)
    sys.exit(SKIP)


def need_env(*names):
    """The values of names, skipping the test when the first is unset (the
    server was not started) and failing when a later one is missing."""
    if not os.environ.get(names[0]):
        skip(names[0] + " is not set (run under tests/s3server.sh run DIR -- ...)")
    values = []
    for n in names:
        v = os.environ.get(n)
        if v is None:
            print("FAIL: %s is not set" % n)
            sys.exit(1)
        values.append(v)
    return values


def builddir_path(*parts):
    return os.path.join(BUILDDIR, *parts)


def srcdir_path(*parts):
    return os.path.join(SRCDIR, *parts)


def run(argv, timeout=60, env=None, check=False, input=None):
    """Runs argv and returns a CompletedProcess with text stdout/stderr.
    A timeout is a test failure, reported as returncode -9."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                            env=full_env, input=input)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        cp = subprocess.CompletedProcess(argv, -9, out, err + "\n(timed out)")
    if check and cp.returncode != 0:
        print("command failed (%d): %s\n%s%s" % (cp.returncode, " ".join(argv),
                                                cp.stdout, cp.stderr))
        sys.exit(1)
    return cp


def same_file(a, b):
    return filecmp.cmp(a, b, shallow=False)


class Checks:
    """Collects named checks; finish() exits 0 or 1."""

    def __init__(self):
        self.failed = []

    def check(self, cond, what, detail=""):
        if cond:
            print("ok   " + what)
        else:
            print("FAIL " + what + (("\n     " + detail.replace("\n", "\n     "))
                                     if detail else ""))
            self.failed.append(what)
        return cond

    def finish(self):
        if self.failed:
            print("%d check(s) failed: %s" % (len(self.failed), ", ".join(self.failed)))
            sys.exit(1)
        print("all checks passed")
        sys.exit(0)


# ------------------------------------------------------------------ store
# Helpers of the checkpoint store tests (test_store_*.py): run spotctl
# against the test S3 server, read the store independently with boto3,
# make checkpoint-like files, compare folders.

def store_env():
    """Skips without a server; returns (endpoint, bucket) and sets the
    variables spotctl and boto3 need. The EC2 metadata lookup is disabled:
    169.254.169.254 is not loopback and must never be contacted."""
    endpoint, bucket = need_env("SPOT_TEST_S3_ENDPOINT", "SPOT_TEST_S3_BUCKET")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    return endpoint, bucket


def unique_job(test):
    """A job root nobody else uses: (url, key_prefix). Pid and time make
    reruns and parallel runs not collide."""
    import time
    _, bucket = store_env()
    prefix = "itest-store/%s-%d-%d" % (test, os.getpid(), int(time.time() * 1000))
    return "s3://%s/%s/job" % (bucket, prefix), prefix + "/job/"


def spotctl(*args, timeout=120, env=None):
    exe = os.environ.get("SPOTCTL") or builddir_path("client", "spotctl")
    return run([exe] + [str(a) for a in args], timeout=timeout, env=env)


def spotctl_popen(*args, **kw):
    exe = os.environ.get("SPOTCTL") or builddir_path("client", "spotctl")
    return subprocess.Popen([exe] + [str(a) for a in args], **kw)


_S3 = None


def s3():
    """A boto3 client: a reader and writer that is not lib/s3."""
    global _S3
    if _S3 is None:
        import boto3
        from botocore.config import Config
        _S3 = boto3.client(
            "s3", endpoint_url=os.environ["SPOT_TEST_S3_ENDPOINT"],
            region_name=os.environ.get("AWS_REGION", "us-east-1"),
            config=Config(s3={"addressing_style": "path"},
                          retries={"max_attempts": 2}))
    return _S3


def s3_get(key):
    return s3().get_object(Bucket=os.environ["SPOT_TEST_S3_BUCKET"],
                           Key=key)["Body"].read()


def s3_put(key, data):
    s3().put_object(Bucket=os.environ["SPOT_TEST_S3_BUCKET"], Key=key, Body=data)


def s3_keys(prefix):
    """Sorted keys under prefix."""
    pages = s3().get_paginator("list_objects_v2").paginate(
        Bucket=os.environ["SPOT_TEST_S3_BUCKET"], Prefix=prefix)
    return sorted(o["Key"] for p in pages for o in p.get("Contents", []))


def s3_uploads(prefix):
    """[(key, upload_id, parts)] of the multipart uploads under prefix."""
    b = os.environ["SPOT_TEST_S3_BUCKET"]
    r = s3().list_multipart_uploads(Bucket=b, Prefix=prefix)
    out = []
    for u in r.get("Uploads", []):
        try:
            parts = len(s3().list_parts(Bucket=b, Key=u["Key"],
                                        UploadId=u["UploadId"]).get("Parts", []))
        except Exception:  # noqa: BLE001 - aborted meanwhile
            parts = 0
        out.append((u["Key"], u["UploadId"], parts))
    return out


def s3_cleanup(prefix):
    """Deletes everything under prefix and aborts its uploads (best effort)."""
    b = os.environ["SPOT_TEST_S3_BUCKET"]
    try:
        for key, uid, _ in s3_uploads(prefix):
            s3().abort_multipart_upload(Bucket=b, Key=key, UploadId=uid)
        keys = s3_keys(prefix)
        for i in range(0, len(keys), 1000):
            s3().delete_objects(Bucket=b, Delete={
                "Objects": [{"Key": k} for k in keys[i:i + 1000]]})
    except Exception as e:  # noqa: BLE001
        print("cleanup of %s: %r" % (prefix, e))


def write_gaussian(path, nbytes, dtype="float32", seed=1):
    """nbytes of N(0, 1) values: fp32, or bf16 (the top half of fp32)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    chunk = 16 << 20
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(chunk, left)
            if dtype == "bfloat16":
                v = rng.standard_normal((n + 1) // 2, dtype=np.float32)
                b = (v.view(np.uint32) >> 16).astype(np.uint16).tobytes()
            else:
                b = rng.standard_normal((n + 3) // 4, dtype=np.float32).tobytes()
            f.write(b[:n])
            left -= n


def write_random(path, nbytes):
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(16 << 20, left)
            f.write(os.urandom(n))
            left -= n


def tree(root):
    """{relative path: (kind, mode, size)} of everything under root."""
    import stat
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
            out[os.path.relpath(p, root)] = (
                kind, stat.S_IMODE(st.st_mode), st.st_size if kind == "file" else 0)
    return out


def same_tree(a, b):
    """(ok, detail): same paths, kinds, modes and bytes."""
    ta, tb = tree(a), tree(b)
    if ta != tb:
        diff = sorted(set(ta.items()) ^ set(tb.items()))
        return False, "trees differ: %r" % diff[:10]
    for rel, (kind, _, _) in ta.items():
        if kind == "file" and not same_file(os.path.join(a, rel), os.path.join(b, rel)):
            return False, "%s differs" % rel
    return True, ""


def leftovers_next_to(path):
    """Temporary restore folders left next to path."""
    parent = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(os.path.abspath(path))
    return [n for n in os.listdir(parent) if n.startswith("." + base + ".spotd-restore")]
