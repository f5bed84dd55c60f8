#!/usr/bin/python3
"""s3check.py - an independent S3 reader/writer for integration tests.

    s3check.py get BUCKET KEY OUTFILE      download an object ("-": stdout)
    s3check.py list BUCKET PREFIX          keys, one per line
    s3check.py uploads BUCKET PREFIX       in-progress multipart uploads,
                                           "KEY UPLOADID" per line
    s3check.py put BUCKET KEY INFILE       upload a file ("-": stdin)
    s3check.py delete-prefix BUCKET PREFIX delete every object under PREFIX
                                           and abort its multipart uploads

The endpoint comes from SPOT_TEST_S3_ENDPOINT, credentials from
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN if set),
the region from AWS_REGION or AWS_DEFAULT_REGION (default us-east-1).
Path-style addressing, SigV4, no retries: the test sees the server's answer.
On error: one line on stderr, exit 1 (2 for bad usage).
"""

import os
import shutil
import sys

import boto3
import botocore.config
import botocore.exceptions

PROG = "s3check"


class Usage(Exception):
    pass


def client():
    endpoint = os.environ.get("SPOT_TEST_S3_ENDPOINT")
    if not endpoint:
        raise Usage("SPOT_TEST_S3_ENDPOINT is not set")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        if not os.environ.get(var):
            raise Usage(var + " is not set")
    region = (os.environ.get("AWS_REGION")
              or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
    config = botocore.config.Config(
        signature_version="s3v4",
        s3={"addressing_style": "path"},
        retries={"max_attempts": 1},
        connect_timeout=10,
        read_timeout=120,
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=os.environ.get("AWS_SESSION_TOKEN") or None,
        config=config,
    )


def cmd_get(s3, bucket, key, outfile):
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    if outfile == "-":
        shutil.copyfileobj(body, sys.stdout.buffer, 1 << 20)
        sys.stdout.buffer.flush()
        return
    # Write next to the target and rename, so that a failed read leaves no
    # partial file behind.
    tmp = "%s.s3check-%d" % (outfile, os.getpid())
    try:
        with open(tmp, "wb") as f:
            shutil.copyfileobj(body, f, 1 << 20)
        os.replace(tmp, outfile)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def list_keys(s3, bucket, prefix):
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix)
    for page in pages:
        for obj in page.get("Contents", []):
            yield obj["Key"]


def list_uploads(s3, bucket, prefix):
    pages = s3.get_paginator("list_multipart_uploads").paginate(
        Bucket=bucket, Prefix=prefix)
    for page in pages:
        for up in page.get("Uploads", []):
            yield up["Key"], up["UploadId"]


def cmd_list(s3, bucket, prefix):
    for key in list_keys(s3, bucket, prefix):
        print(key)


def cmd_uploads(s3, bucket, prefix):
    for key, upload_id in list_uploads(s3, bucket, prefix):
        print(key, upload_id)


def cmd_put(s3, bucket, key, infile):
    if infile == "-":
        s3.upload_fileobj(sys.stdin.buffer, bucket, key)
    else:
        # upload_file switches to multipart above 8 MiB.
        s3.upload_file(infile, bucket, key)


def cmd_delete_prefix(s3, bucket, prefix):
    # Collect first: deleting while paginating can skip keys.
    keys = list(list_keys(s3, bucket, prefix))
    for i in range(0, len(keys), 1000):
        batch = [{"Key": k} for k in keys[i:i + 1000]]
        resp = s3.delete_objects(
            Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        errors = resp.get("Errors", [])
        if errors:
            e = errors[0]
            raise RuntimeError("delete %s: %s: %s (%d failed)" % (
                e.get("Key"), e.get("Code"), e.get("Message"), len(errors)))
    for key, upload_id in list(list_uploads(s3, bucket, prefix)):
        try:
            s3.abort_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id)
        except botocore.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchUpload":
                raise


COMMANDS = {
    "get": (cmd_get, ("BUCKET", "KEY", "OUTFILE")),
    "list": (cmd_list, ("BUCKET", "PREFIX")),
    "uploads": (cmd_uploads, ("BUCKET", "PREFIX")),
    "put": (cmd_put, ("BUCKET", "KEY", "INFILE")),
    "delete-prefix": (cmd_delete_prefix, ("BUCKET", "PREFIX")),
}


def usage():
    lines = ["usage:"] + ["  %s %s %s" % (PROG, name, " ".join(args))
                          for name, (_, args) in COMMANDS.items()]
    return "\n".join(lines)


def describe(e):
    if isinstance(e, botocore.exceptions.ClientError):
        err = e.response.get("Error", {})
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = err.get("Code") or "?"
        msg = err.get("Message") or ""
        return ("HTTP %s %s %s" % (status, code, msg)).strip()
    if isinstance(e, OSError) and e.filename:
        return "%s: %s" % (e.filename, e.strerror or e)
    return str(e) or type(e).__name__


def main(argv):
    if len(argv) < 2 or argv[1] not in COMMANDS:
        print(usage(), file=sys.stderr)
        return 2
    name = argv[1]
    fn, params = COMMANDS[name]
    args = argv[2:]
    if len(args) != len(params):
        print("%s %s: expects %s" % (PROG, name, " ".join(params)),
              file=sys.stderr)
        return 2
    try:
        fn(client(), *args)
    except Usage as e:
        print("%s %s: %s" % (PROG, name, e), file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Reader went away (e.g. `| head`): not our failure. Point stdout
        # at /dev/null so the flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one clear line, never a traceback
        print("%s %s %s: %s" % (PROG, name, " ".join(args), describe(e)),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
