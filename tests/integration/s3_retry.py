#!/usr/bin/python3
"""Retries against the real server through a faulty network: a small
proxy in front of Ceph forwards every request unchanged (Host included, so
signatures still verify) except the ones a test plans to break. It
answers 503 SlowDown or 500 InternalError itself, or cuts a response body
half way. Checks: PUT bodies are rewound and re-sent (signed and unsigned
payloads), a cut GET resumes with Range + If-Match and the bytes are
right, multipart survives a failed part and a failed complete, and the
retry count is bounded."""
import http.client
import http.server
import os
import socket
import sys
import tempfile
import threading
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
import s3common  # noqa: E402

endpoint, bucket = spotlib.need_env("SPOT_TEST_S3_ENDPOINT", "SPOT_TEST_S3_BUCKET")
up = urllib.parse.urlsplit(endpoint)
c = spotlib.Checks()

ERRORS = {
    "503": (503, b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown"
                 b"</Code><Message>Please reduce your request rate.</Message></Error>"),
    "500": (500, b"<Error><Code>InternalError</Code><Message>We encountered an "
                 b"internal error. Please try again.</Message></Error>"),
}
HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection"}


class Proxy:
    def __init__(self):
        self.lock = threading.Lock()
        self.plan = []  # [method, path substring, action], used once each
        self.log = []   # (method, path, headers, action)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_one(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                action = proxy.take(self.command, self.path)
                with proxy.lock:
                    proxy.log.append((self.command, self.path, dict(self.headers), action))
                if action in ERRORS:
                    status, payload = ERRORS[action]
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
                conn.putrequest(self.command, self.path, skip_host=True,
                                skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in HOP:
                        conn.putheader(k, v)
                conn.endheaders(body if body else None)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.end_headers()
                if self.command == "HEAD":
                    return
                if action == "cut" and len(data) > 1:
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        self.server, self.url = spotlib.serve_http(Handler)

    def take(self, method, path):
        with self.lock:
            for i, (m, sub, action) in enumerate(self.plan):
                if m == method and sub in path:
                    del self.plan[i]
                    return action
        return None

    def set_plan(self, plan):
        with self.lock:
            self.plan = [list(p) for p in plan]
            self.log = []

    def requests(self, method):
        with self.lock:
            return [r for r in self.log if r[0] == method]


px = Proxy()
prefix = s3common.unique_prefix("retry")


def tool(*args, retries="4"):
    return s3common.tool("--endpoint", px.url, "--retries", retries,
                         "--backoff-ms", "20", *args, timeout=90)


with tempfile.TemporaryDirectory() as tmp:
    big = os.path.join(tmp, "big")        # > 64 KiB: UNSIGNED-PAYLOAD
    small = os.path.join(tmp, "small")    # hashed payload
    with open(big, "wb") as f:
        f.write(os.urandom(11 * 1024 * 1024 + 17))
    with open(small, "wb") as f:
        f.write(os.urandom(1000))
    data = open(big, "rb").read()
    back = os.path.join(tmp, "back")

    # PUT: two SlowDowns, then the body must be sent again from the start
    px.set_plan([("PUT", "", "503"), ("PUT", "", "503")])
    cp = tool("put", bucket, prefix + "big", big)
    c.check(cp.returncode == 0 and "retries=2" in cp.stdout,
            "PUT retried twice after 503 SlowDown", cp.stdout + cp.stderr)
    c.check(cp.stderr.count("SlowDown") == 2, "each retry logged with the S3 code",
            cp.stderr)
    ok, detail = s3common.independent_get(bucket, prefix + "big", back)
    c.check(ok and spotlib.same_file(big, back), "boto3 reads the retried PUT intact",
            detail)

    px.set_plan([("PUT", "", "500")])
    cp = tool("put", bucket, prefix + "small", small)
    c.check(cp.returncode == 0 and "retries=1" in cp.stdout,
            "signed-payload PUT retried after 500 (hash still matches)", cp.stderr)
    ok, detail = s3common.independent_get(bucket, prefix + "small", back)
    c.check(ok and spotlib.same_file(small, back), "small object intact", detail)

    # GET cut half way: resumes where it stopped, same version
    px.set_plan([("GET", "", "cut")])
    out = os.path.join(tmp, "out")
    cp = tool("get", bucket, prefix + "big", "0", "0", out)
    c.check(cp.returncode == 0 and "retries=1" in cp.stdout,
            "GET resumed after a cut body", cp.stdout + cp.stderr)
    c.check(cp.returncode == 0 and open(out, "rb").read() == data, "resumed GET bytes right")
    gets = px.requests("GET")
    second = gets[1][2] if len(gets) > 1 else {}
    c.check(len(gets) == 2 and second.get("Range", "").startswith("bytes=")
            and second.get("Range", "").endswith("-") and second.get("If-Match"),
            "second GET asks for the rest with Range and If-Match",
            repr([(g[0], g[2].get("Range"), g[2].get("If-Match")) for g in gets]))
    try:
        first = int(second.get("Range", "bytes=0-")[6:-1])
    except ValueError:
        first = -1
    c.check(0 < first < len(data), "resume offset inside the object (%d)" % first)

    # ranged GET cut: the resumed range keeps its end
    off, length = 1000, 2 * 1024 * 1024
    px.set_plan([("GET", "", "cut")])
    cp = tool("get", bucket, prefix + "big", str(off), str(length), out)
    c.check(cp.returncode == 0 and open(out, "rb").read() == data[off:off + length],
            "ranged GET resumed with the right bytes", cp.stderr)
    gets = px.requests("GET")
    rng = gets[1][2].get("Range", "") if len(gets) > 1 else ""
    c.check(rng.endswith("-%d" % (off + length - 1)) and rng != "bytes=%d-%d" % (
        off, off + length - 1), "resumed range keeps its end: " + rng)

    # multipart: one part and the complete fail once each
    px.set_plan([("PUT", "partNumber=2", "503"), ("POST", "uploadId=", "500")])
    cp = tool("put-multipart", bucket, prefix + "mp", big, "--part-size",
              str(5 * 1024 * 1024), "--parallel", "3")
    c.check(cp.returncode == 0 and "ok parts=3" in cp.stdout,
            "multipart survives a failed part and a failed complete", cp.stdout + cp.stderr)
    c.check("part 2 retries=1" in cp.stdout, "the failed part was retried", cp.stdout)
    ok, detail = s3common.independent_get(bucket, prefix + "mp", back)
    c.check(ok and spotlib.same_file(big, back), "multipart object intact", detail)

    # bounded: more failures than retries
    px.set_plan([("HEAD", "", "503")] * 5)
    cp = tool("head", bucket, prefix + "big", retries="2")
    c.check(cp.returncode == 1 and "(after 2 retries)" in cp.stderr
            and "503" in cp.stderr and len(px.requests("HEAD")) == 3,
            "gives up after 2 retries (3 attempts)", cp.stderr)

    # never on other 4xx: a 404 is answered once
    px.set_plan([])
    cp = tool("head", bucket, prefix + "nope")
    c.check(cp.returncode == 1 and "ENOENT" in cp.stderr and len(px.requests("HEAD")) == 1,
            "404 is not retried", cp.stderr)

    s3common.tool("delete", bucket, prefix + "big", prefix + "small", prefix + "mp")
px.server.shutdown()
c.finish()
