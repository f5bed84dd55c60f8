#!/usr/bin/python3
"""The If-Match form strategy of lib/io/lease.c and lib/io/store/latest.c (lease.h),
against a loopback stand-in for the two behaviours that matter (AWS S3
cannot run here; Ceph 16 RGW's, which compares If-Match with the bare
ETag, is exercised by test_lease.py against the real Ceph):

- "aws":  PUT If-Match matches only the quoted ETag, as AWS documents;
- "ceph": PUT If-Match matches only the bare ETag (Ceph 16 RGW), a quoted
          one is answered 412 even when the ETag matches.

Both keep objects with their user metadata, answer If-None-Match: * with
412 and return ETags quoted. A holder acquires, renews several times,
moves LATEST and releases; a second owner takes over the released lease.
Checks: everything succeeds against both; the AWS-like server never
receives a bare If-Match (a server might ignore a malformed one and
overwrite unconditionally); against the Ceph-like one each process pays at
most one refused PUT to learn the form."""
import hashlib
import http.server
import os
import re
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402


class Store:
    def __init__(self, mode):
        self.mode = mode
        self.objects = {}  # path -> (body, meta)
        self.if_match = []  # (path, value, status)
        self.lock = threading.Lock()


def handler_for(store):
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def reply(self, status, body=b"", headers=()):
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            with store.lock:
                o = store.objects.get(self.path)
            if o is None:
                self.reply(404, b"<Error><Code>NoSuchKey</Code><Message>no</Message></Error>")
                return
            body, meta = o
            self.reply(200, body, [("ETag", '"%s"' % hashlib.md5(body).hexdigest())] +
                       [("x-amz-meta-" + k, v) for k, v in meta.items()])

        def do_PUT(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            meta = {k[11:].lower(): v for k, v in self.headers.items()
                    if k.lower().startswith("x-amz-meta-")}
            im, inm = self.headers.get("If-Match"), self.headers.get("If-None-Match")
            with store.lock:
                cur = store.objects.get(self.path)
                status = 200
                if inm == "*" and cur is not None:
                    status = 412
                if im is not None:
                    if cur is None:
                        status = 404 if store.mode == "aws" else 412
                    else:
                        tag = hashlib.md5(cur[0]).hexdigest()
                        want = '"%s"' % tag if store.mode == "aws" else tag
                        if im != want:
                            status = 412
                    store.if_match.append((self.path, im, status))
                if status == 200:
                    store.objects[self.path] = (body, meta)
            if status == 200:
                self.reply(200, b"", [("ETag", '"%s"' % hashlib.md5(body).hexdigest())])
            elif status == 404:
                self.reply(404, b"<Error><Code>NoSuchKey</Code><Message>no</Message></Error>")
            else:
                self.reply(412, b"<Error><Code>PreconditionFailed</Code>"
                           b"<Message>At least one of the pre-conditions you specified "
                           b"did not hold</Message></Error>")

    return H


def run_mode(c, mode):
    store = Store(mode)
    server, endpoint = spotlib.serve_http(handler_for(store))
    url = "s3://bucket-%s/p/job" % mode
    env = {"AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "secret",
           "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_ENDPOINT_URL": endpoint, "SPOTD_LOG_LEVEL": "7"}
    try:
        a = spotlib.spotctl("lease", url, "--owner", "A", "--ttl", "1.5", "--hold", "2.2",
                            "--set-latest", "ck1", "--seq", "1", env=env, timeout=30)
        c.check(a.returncode == 0 and "released owner=A" in a.stdout,
                "%s: acquire, renew, move LATEST, release" % mode, a.stdout + a.stderr)
        renews = len(re.findall(r"held -> renewing", a.stderr))
        b = spotlib.spotctl("lease", url, "--owner", "B", "--hold", "0.1",
                            "--set-latest", "ck2", "--seq", "1", env=env, timeout=30)
        c.check(b.returncode == 0 and re.search(r"acquired owner=B epoch=2 ", b.stdout),
                "%s: B takes over the released lease (epoch 2) and moves LATEST" % mode,
                b.stdout + b.stderr)
        latest = store.objects.get("/bucket-%s/p/job/LATEST" % mode)
        c.check(latest is not None and latest[0] == b"ck2" and
                latest[1].get("spotd-order") == "2.1",
                "%s: LATEST is ck2 at order 2.1" % mode, repr(latest))
        vals = store.if_match
        quoted = [v for _, v, _ in vals if v.startswith('"')]
        bare = [v for _, v, _ in vals if not v.startswith('"')]
        refused = [x for x in vals if x[2] != 200]
        print("%s: %d renewals by A; If-Match sent %d times (%d quoted, %d bare), "
              "%d refused" % (mode, renews, len(vals), len(quoted), len(bare), len(refused)))
        c.check(renews >= 3, "%s: A renewed several times" % mode, a.stderr[-2000:])
        if mode == "aws":
            c.check(not bare and not refused,
                    "aws: never a bare If-Match, never refused", repr(vals))
        else:
            c.check(len(refused) <= 2 and all(v.startswith('"') for _, v, _ in refused),
                    "ceph: at most one refused (quoted) If-Match per process",
                    repr(vals))
            c.check(len(bare) >= renews, "ceph: the bare form is used afterwards",
                    repr(vals))
    finally:
        spotlib.stop_http(server)


def main():
    c = spotlib.Checks()
    for mode in ("aws", "ceph"):
        run_mode(c, mode)
    c.finish()


if __name__ == "__main__":
    main()
