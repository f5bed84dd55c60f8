"""A fault-injecting HTTP/1.1 proxy for the integration tests (asyncio,
loopback only), to put between spotctl/spotd and the real Ceph RGW.

Requests are forwarded unchanged (Host included, so SigV4 signatures still
verify; `Expect: 100-continue` is answered here and not forwarded, as curl
does not sign it). Each request is classified (part, put, create,
complete, abort, get, head, list, listparts, delete, other) and may be hit
by one fault, decided from a seeded hash of (seed, request identity,
attempt number) so that a run is reproducible whatever order parallel
transfers arrive in:

  slowdown    answer 503 SlowDown (S3 XML error body) without forwarding
  reset_req   read half of the request body, then reset the connection
  reset_resp  forward, send half of the response (body, or head when the
              body is empty), then reset the connection
  stall       forward nothing: hold the connection with no byte moving
              for stall_s seconds (mid-body when there is a body), then
              reset it
  flip        forward, and flip one bit of the middle byte of a 2xx
              response body (a fault in transit over plain http: the
              store keeps the right bytes)
Always-on shaping: latency_ms added before each request is forwarded, and
bandwidth (bytes/s, shared by all connections and both directions).

Fractions are per request; max_per_request bounds how many attempts of
one request may be hit (so a client with enough retries always wins).
Counters (requests by kind, faults by type and kind, bytes, upstream
statuses, the access key id that signed each request) are kept in
memory and, when stats_path is set, written there as JSON after every
request so tests (or another process) can assert on them.

Use in a test:
    px = FaultProxy(upstream_url, seed=1)   # starts at once, in a thread
    px.configure(slowdown=0.3, kinds={"part"})
    ... px.url ...
    px.stats()  /  px.close()
or standalone: faultproxy.py UPSTREAM [--fault K=V ...] [--stats FILE]
(prints "listening on http://127.0.0.1:PORT").
"""
import asyncio
import hashlib
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.parse

HEAD_MAX = 64 * 1024
CHUNK = 64 * 1024
FAULTS = ("slowdown", "reset_req", "reset_resp", "stall", "flip")
SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown'
                 b'</Code><Message>Please reduce your request rate.</Message>'
                 b'<RequestId>faultproxy</RequestId></Error>')
HOP = {"connection", "keep-alive", "proxy-connection", "expect", "te",
       "upgrade", "transfer-encoding"}


def classify(method, target):
    """(kind, identity): identity names the request without the upload id,
    so its attempts can be counted."""
    u = urllib.parse.urlsplit(target)
    q = urllib.parse.parse_qs(u.query, keep_blank_values=True)
    parts = [p for p in u.path.split("/") if p]
    key = "/".join(parts[1:])
    if method == "PUT":
        kind = "part" if "partNumber" in q else "put"
    elif method == "POST":
        kind = ("create" if "uploads" in q else "complete" if "uploadId" in q
                else "delete" if "delete" in q else "other")
    elif method == "DELETE":
        kind = "abort" if "uploadId" in q else "delete"
    elif method == "HEAD":
        kind = "head"
    elif method == "GET":
        kind = ("listparts" if "uploadId" in q else "listuploads" if "uploads" in q
                else "list" if not key or "list-type" in q else "get")
    else:
        kind = "other"
    # the key's last two components: stable across runs whose prefixes
    # differ (pid, time)
    ident = "%s %s %s %s %s" % (method, kind, "/".join(parts[-2:]),
                                ",".join(q.get("partNumber", [])),
                                ",".join(q.get("Range", [])))
    return kind, ident


class Bucket:
    """A token bucket shared by all connections (bytes per second)."""

    def __init__(self):
        self.rate = 0
        self.tokens = 0.0
        self.t = time.monotonic()
        self.lock = None  # created in the loop

    async def take(self, n):
        if self.rate <= 0:
            return
        async with self.lock:
            while True:
                now = time.monotonic()
                self.tokens = min(float(self.rate) / 4,
                                  self.tokens + (now - self.t) * self.rate)
                self.t = now
                if self.tokens >= n or self.tokens >= self.rate / 4:
                    self.tokens -= n
                    return
                await asyncio.sleep(min(0.05, (n - self.tokens) / self.rate))


class FaultProxy:
    def __init__(self, upstream, seed=1, stats_path=None, port=0):
        u = urllib.parse.urlsplit(upstream)
        if u.scheme != "http" or not u.hostname.startswith("127."):
            raise ValueError("faultproxy forwards to loopback http only: " + upstream)
        self.up_host, self.up_port = u.hostname, u.port or 80
        self.seed = seed
        self.stats_path = stats_path
        self.mu = threading.Lock()
        self.cfg = {}
        self.configure()
        self.attempts = {}
        self.bucket = Bucket()
        self._reset_stats()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(port,), daemon=True)
        self.thread.start()
        if not self.ready.wait(10) or self.port is None:
            raise RuntimeError("faultproxy did not start")
        self.url = "http://127.0.0.1:%d" % self.port

    # ---- control (any thread)
    def configure(self, slowdown=0.0, reset_req=0.0, reset_resp=0.0, stall=0.0,
                  stall_s=5.0, latency_ms=0, bandwidth=0, kinds=None,
                  max_per_request=1, seed=None, flip=0.0, match=None):
        """Replaces the fault plan (everything off by default) and restarts
        the attempt counts. match: substrings of the request target; when
        given, only a request whose target holds one may be hit (one string
        is a list of one)."""
        with self.mu:
            self.cfg = dict(slowdown=slowdown, reset_req=reset_req,
                            reset_resp=reset_resp, stall=stall, stall_s=stall_s,
                            flip=flip, latency_ms=latency_ms,
                            bandwidth=bandwidth,
                            kinds=set(kinds) if kinds else None,
                            match=([match] if isinstance(match, str) else list(match))
                            if match else None,
                            max_per_request=max_per_request)
            if seed is not None:
                self.seed = seed
            self.attempts = {}
        if hasattr(self, "bucket"):
            self.bucket.rate = bandwidth

    def _reset_stats(self):
        self._stats = {"requests": {}, "faults": {f: {} for f in FAULTS},
                       "bytes_up": 0, "bytes_down": 0, "connections": 0,
                       "access_keys": {}, "statuses": {}}

    def reset_stats(self):
        with self.mu:
            self._reset_stats()
        self._write_stats()

    def stats(self):
        with self.mu:
            return json.loads(json.dumps(self._stats))

    def injected(self, fault=None):
        """How many faults were injected (of one type, or all)."""
        s = self.stats()
        types = [fault] if fault else FAULTS
        return sum(sum(s["faults"][f].values()) for f in types)

    def close(self):
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    # ---- internals
    def _write_stats(self):
        if not self.stats_path:
            return
        with self.mu:
            data = json.dumps(self._stats, indent=1, sort_keys=True)
        tmp = self.stats_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(data)
        os.replace(tmp, self.stats_path)

    def _decide(self, kind, ident, target=""):
        """The fault for this attempt of this request, or None."""
        with self.mu:
            cfg = dict(self.cfg)
            if cfg["match"] is not None and \
                    not any(m in target for m in cfg["match"]):
                return None, cfg
            n = self.attempts.get(ident, 0)
            self.attempts[ident] = n + 1
            self._stats["requests"][kind] = self._stats["requests"].get(kind, 0) + 1
            if cfg["kinds"] is not None and kind not in cfg["kinds"]:
                return None, cfg
            if n >= cfg["max_per_request"]:
                return None, cfg
            h = hashlib.sha256(("%d|%s|%d" % (self.seed, ident, n)).encode()).digest()
            r = struct.unpack(">Q", h[:8])[0] / 2.0 ** 64
            acc = 0.0
            for f in FAULTS:
                acc += cfg[f]
                if r < acc:
                    self._stats["faults"][f][kind] = self._stats["faults"][f].get(kind, 0) + 1
                    return f, cfg
            return None, cfg

    def _run(self, port):
        asyncio.set_event_loop(self.loop)
        self.bucket.lock = asyncio.Lock()
        self.port = None
        try:
            server = self.loop.run_until_complete(asyncio.start_server(
                self._client, "127.0.0.1", port, limit=HEAD_MAX, backlog=128))
            self.port = server.sockets[0].getsockname()[1]
        finally:
            self.ready.set()
        try:
            self.loop.run_forever()
        finally:
            server.close()
            for t in asyncio.all_tasks(self.loop):
                t.cancel()
            try:
                self.loop.run_until_complete(asyncio.sleep(0))
            except Exception:  # noqa: BLE001
                pass

    @staticmethod
    def _reset(writer):
        """Closes with a TCP RST (SO_LINGER 0)."""
        sock = writer.get_extra_info("socket")
        try:
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                struct.pack("ii", 1, 0))
        except OSError:
            pass
        writer.transport.abort()

    async def _send(self, writer, data, count="bytes_down"):
        for i in range(0, len(data), CHUNK):
            piece = data[i:i + CHUNK]
            await self.bucket.take(len(piece))
            writer.write(piece)
            await writer.drain()
        with self.mu:
            self._stats[count] += len(data)

    async def _read_body(self, reader, n):
        out = bytearray()
        while len(out) < n:
            piece = await reader.read(min(CHUNK, n - len(out)))
            if not piece:
                raise ConnectionError("client closed mid-body")
            await self.bucket.take(len(piece))
            out += piece
        with self.mu:
            self._stats["bytes_up"] += n
        return bytes(out)

    async def _client(self, reader, writer):
        with self.mu:
            self._stats["connections"] += 1
        up = None
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                        ConnectionError):
                    return
                up = await self._one(reader, writer, head, up)
                if up is False:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            if up:
                up[1].close()
            if not writer.transport.is_closing():
                writer.close()

    async def _one(self, reader, writer, head, up):
        """Handles one request; returns the upstream (reader, writer) to
        keep, or False to drop the client connection."""
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            if line:
                k, v = line.split(":", 1)
                headers.append((k.strip(), v.strip()))
        hmap = {k.lower(): v for k, v in headers}
        n = int(hmap.get("content-length", "0") or 0)
        kind, ident = classify(method, target)
        fault, cfg = self._decide(kind, ident, target)
        akid = hmap.get("authorization", "").partition("Credential=")[2].split("/")[0]
        with self.mu:  # which key signed (credential rotation tests)
            ak = self._stats["access_keys"]
            ak[akid] = ak.get(akid, 0) + 1
        if hmap.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        if fault == "reset_req" and n > 1:
            await self._read_body(reader, n // 2)
            self._reset(writer)
            self._write_stats()
            return False
        if fault == "stall":
            if n > 1:
                await self._read_body(reader, n // 2)
            await asyncio.sleep(cfg["stall_s"])
            self._reset(writer)
            self._write_stats()
            return False
        body = await self._read_body(reader, n) if n else b""
        if fault == "slowdown" or (fault == "reset_req"):
            # (reset_req of a request without a body: answer SlowDown)
            resp = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                    b"Content-Length: %d\r\nConnection: keep-alive\r\n\r\n"
                    % len(SLOWDOWN_BODY))
            if method != "HEAD":
                resp += SLOWDOWN_BODY
            await self._send(writer, resp)
            self._write_stats()
            return up
        if cfg["latency_ms"]:
            await asyncio.sleep(cfg["latency_ms"] / 1000.0)
        if not up:
            up = await asyncio.open_connection(self.up_host, self.up_port, limit=HEAD_MAX)
        ur, uw = up
        out = ["%s %s HTTP/1.1" % (method, target)]
        out += ["%s: %s" % (k, v) for k, v in headers if k.lower() not in HOP]
        if n or method in ("PUT", "POST"):
            if "content-length" not in hmap:
                out.append("Content-Length: %d" % n)
        uw.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body)
        await uw.drain()
        rhead = await ur.readuntil(b"\r\n\r\n")
        rlines = rhead.decode("latin-1").split("\r\n")
        status = int(rlines[0].split(" ", 2)[1])
        rh = {}
        for line in rlines[1:]:
            if line:
                k, v = line.split(":", 1)
                rh[k.strip().lower()] = v.strip()
        rbody = b""
        up_keep = True
        with self.mu:
            st = self._stats["statuses"]
            st[str(status)] = st.get(str(status), 0) + 1
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            pass
        elif "content-length" in rh:
            rbody = await ur.readexactly(int(rh["content-length"]))
        elif rh.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await ur.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    await ur.readuntil(b"\r\n")  # no trailers from RGW
                    break
                rbody += await ur.readexactly(size)
                await ur.readexactly(2)
        else:
            rbody = await ur.read()
            up_keep = False
        if rh.get("connection", "").lower() == "close":
            up_keep = False
        # re-frame with a Content-Length
        resp = [rlines[0]]
        for line in rlines[1:]:
            if line:
                k = line.split(":", 1)[0].strip().lower()
                if k not in HOP and k != "content-length":
                    resp.append(line)
        if method != "HEAD" and not (status in (204, 304) or status < 200):
            resp.append("Content-Length: %d" % len(rbody))
        elif "content-length" in rh:
            resp.append("Content-Length: %s" % rh["content-length"])
        resp.append("Connection: keep-alive")
        rdata = ("\r\n".join(resp) + "\r\n\r\n").encode("latin-1")
        if fault == "reset_resp":
            if len(rbody) > 1:
                await self._send(writer, rdata + rbody[:len(rbody) // 2])
            else:
                await self._send(writer, rdata[:len(rdata) // 2])
            await asyncio.sleep(0.05)
            self._reset(writer)
            if not up_keep:
                uw.close()
            self._write_stats()
            return False
        if fault == "flip" and 200 <= status < 300 and rbody:
            rbody = bytearray(rbody)
            rbody[len(rbody) // 2] ^= 0x04
            rbody = bytes(rbody)
        await self._send(writer, rdata + (b"" if method == "HEAD" else rbody))
        self._write_stats()
        if not up_keep:
            uw.close()
            return None
        return up


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("upstream")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stats")
    ap.add_argument("--fault", action="append", default=[],
                    help="K=V: slowdown, reset_req, reset_resp, stall, flip "
                         "(fractions), stall_s, latency_ms, bandwidth, "
                         "max_per_request, kinds=a,b, match=a,b")
    a = ap.parse_args(argv)
    kw = {}
    for kv in a.fault:
        k, v = kv.split("=", 1)
        kw[k] = set(v.split(",")) if k in ("kinds", "match") else float(v)
    if "max_per_request" in kw:
        kw["max_per_request"] = int(kw["max_per_request"])
    px = FaultProxy(a.upstream, seed=a.seed, stats_path=a.stats, port=a.port)
    px.configure(**kw)
    print("listening on " + px.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    px.close()


if __name__ == "__main__":
    main(sys.argv[1:])
