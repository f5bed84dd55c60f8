#!/usr/bin/python3
"""A hostile or broken S3 server during restore.

A real checkpoint is pushed to the test S3 server (Ceph), its objects are
read back with boto3, and a small loopback server that answers like S3
(path-style GETs, ranged GETs as 206) serves them to `spotctl restore`
with one misbehaviour per case:

  - extra-bytes: every ranged GET answers 206 with the asked bytes and 7
    more (Content-Length says so): restore fails naming the frame's own
    length ("more than the frame's N bytes"), not "shorter than the
    manifest says", and nothing is left at or next to the target.
  - control: the same server without the fault restores the tree
    identical (the test's own control).

A manifest over the 40 MiB limit is refused before any data is fetched.

Slow servers (tests/integration/faultproxy.py capping bandwidth in front of
the real server, fast enough to stay above libcurl's low-speed limit):

  - restore with --restore-timeout 2: fails within a few seconds with a
    line naming the option, nothing left at or next to the target;
  - restore and push with a per-transfer floor (SPOT_STORE_MIN_RATE, the
    test knob of spot_store_config.min_rate): a 5 MiB frame that cannot
    move at that rate fails the op with "too slow", long before the
    transfer itself would end; the push commits nothing."""
import http.server
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402

sl.store_env()
c = sl.Checks()
url, root = sl.unique_job("hostile")
bucket = os.environ["SPOT_TEST_S3_BUCKET"]
OBJECTS = {}
MODE = {"fault": None}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        key = path[len("/%s/" % bucket):] if path.startswith("/%s/" % bucket) else None
        body = OBJECTS.get(key)
        if body is None:
            msg = (b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code>"
                   b"<Message>no</Message></Error>")
            self.send_response(404)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        status = 200
        rng = self.headers.get("Range")
        m = re.match(r"bytes=(\d+)-(\d+)$", rng or "")
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            data = body[a:b + 1]
            status = 206
            if MODE["fault"] == "extra-bytes":
                data += b"EXTRA!!"
        else:
            data = body
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(body)))
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", '"e"')
        self.end_headers()
        self.wfile.write(data)


server = None
px = None
try:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(os.path.join(src, "sub"))
        sl.write_random(os.path.join(src, "a.bin"), 3 << 20)
        with open(os.path.join(src, "sub", "b.txt"), "w") as f:
            f.write("hello\n" * 1000)
        cp = sl.spotctl("push", src, url, "--name", "ck")
        c.check(cp.returncode == 0, "push the checkpoint to the real server", cp.stderr)
        for k in sl.s3_keys(root):
            OBJECTS[k] = sl.s3_get(k)
        server, endpoint = sl.serve_http(Handler)

        def restore(dst, *extra):
            return sl.spotctl("restore", url, dst, "--endpoint", endpoint, *extra,
                              timeout=60)

        MODE["fault"] = "extra-bytes"
        dst = os.path.join(tmp, "r-extra")
        cp = restore(dst)
        err = cp.stderr.strip().splitlines()
        last = err[-1] if err else ""
        c.check(cp.returncode != 0, "extra-bytes: restore fails", cp.stderr)
        # whichever fetch sees it first: a.bin's frame or sub/b.txt's run
        # in a pack
        c.check(("more than the frame" in last or "bytes asked of pack" in last)
                and "shorter" not in last,
                "extra-bytes: the message names the frame's length: %s" % last,
                cp.stderr)
        c.check(not os.path.exists(dst) and not sl.leftovers_next_to(dst),
                "extra-bytes: nothing at or next to the target")

        MODE["fault"] = None
        sl.check_restore(c, url, src, os.path.join(tmp, "r-ok"),
                         "control: the same server without faults restores identical",
                         "--endpoint", endpoint)

        # a manifest over the documented 40 MiB limit: refused
        # as it arrives, before any data is fetched
        sl.s3_put(root + "checkpoints/huge/MANIFEST.json",
                  b'{"format":"spotd-checkpoint","files":[' + b" " * (41 << 20) + b"]}")
        dst = os.path.join(tmp, "r-huge")
        cp = sl.spotctl("restore", url, dst, "--name", "huge", timeout=60)
        last = (cp.stderr.strip().splitlines() or [""])[-1]
        c.check(cp.returncode != 0 and "larger than 40 MiB" in last,
                "huge manifest: refused naming the limit: %s" % last, cp.stderr)
        c.check(not os.path.exists(dst) and not sl.leftovers_next_to(dst),
                "huge manifest: nothing at or next to the target")

        # slow servers
        big = os.path.join(tmp, "big")
        os.makedirs(big)
        sl.write_random(os.path.join(big, "w.bin"), 6 << 20)
        cp = sl.spotctl("push", big, url, "--name", "big", "--part-size", "5M",
                        "--compress", "never")
        c.check(cp.returncode == 0, "push a 6 MiB checkpoint", cp.stderr)
        px = FaultProxy(os.environ["SPOT_TEST_S3_ENDPOINT"], seed=1)
        px.configure(bandwidth=200000)  # 5 MiB would take 26 s

        dst = os.path.join(tmp, "r-timeout")
        t0 = time.monotonic()
        cp = sl.spotctl("restore", url, dst, "--name", "big", "--endpoint", px.url,
                        "--restore-timeout", "2", timeout=60)
        took = time.monotonic() - t0
        last = (cp.stderr.strip().splitlines() or [""])[-1]
        c.check(cp.returncode != 0 and "--restore-timeout" in last and
                "within 2 s" in last,
                "restore-timeout: fails naming the option: %s" % last, cp.stderr)
        c.check(took < 10, "restore-timeout: gave up in %.1f s (< 10)" % took)
        c.check(not os.path.exists(dst) and not sl.leftovers_next_to(dst),
                "restore-timeout: nothing at or next to the target")

        slow = {"SPOT_STORE_MIN_RATE": "2000000"}  # 5 MiB: 5 s + 2.6 s
        dst = os.path.join(tmp, "r-slow")
        t0 = time.monotonic()
        cp = sl.spotctl("restore", url, dst, "--name", "big", "--endpoint", px.url,
                        env=slow, timeout=60)
        took = time.monotonic() - t0
        last = (cp.stderr.strip().splitlines() or [""])[-1]
        c.check(cp.returncode != 0 and "too slow" in last and "w.bin part" in last,
                "floor rate, restore: fails naming the frame: %s" % last, cp.stderr)
        c.check(took < 20, "floor rate, restore: gave up in %.1f s (< 20)" % took)
        c.check(not os.path.exists(dst) and not sl.leftovers_next_to(dst),
                "floor rate, restore: nothing at or next to the target")

        t0 = time.monotonic()
        cp = sl.spotctl("push", big, url, "--name", "big-slow", "--part-size", "5M",
                        "--compress", "never", "--endpoint", px.url, env=slow,
                        timeout=60)
        took = time.monotonic() - t0
        last = (cp.stderr.strip().splitlines() or [""])[-1]
        c.check(cp.returncode != 0 and "too slow" in last,
                "floor rate, push: fails: %s" % last, cp.stderr)
        c.check(took < 20, "floor rate, push: gave up in %.1f s (< 20)" % took)
        c.check(not any(k.endswith("big-slow/MANIFEST.json") for k in sl.s3_keys(root)),
                "floor rate, push: nothing committed")
finally:
    if px is not None:
        px.close()
    if server is not None:
        sl.stop_http(server)
    sl.s3_cleanup(root)
c.finish()
