#!/usr/bin/python3
"""A loopback TCP proxy that makes each connection look like one over a
wide-area network to a cloud object store: a per-connection throughput cap
in each direction, a one-way delay (half the RTT) on every byte, a
connection set-up cost, and optionally loss, approximated as stalls.

It is byte-transparent (no HTTP parsing), so SigV4 signatures, `Expect:
100-continue` and keep-alive behave end to end as they would against S3:
a request costs a real round trip, a part upload a real serialisation time.

The model, per connection and per direction:
  - a link of RATE bytes/s: a chunk read at time t leaves the link at
    max(t, link free) + len/RATE and is delivered RTT/2 later (so the delay
    does not cost throughput: a full window stays in flight);
  - the window (bytes read but not yet delivered) is bounded by the pipe's
    size (WINDOW if the kernel allows it, else 1 MiB), like a socket
    buffer: a sender faster than the link is pushed back;
  - the first bytes of a connection wait SETUP_RTTS round trips (TCP
    handshake + TLS 1.3 = 2 by default; the proxy speaks plain HTTP);
  - loss (an approximation, not a packet model): each 64 KiB that crosses
    the link has probability LOSS of stalling the link for STALL_MS (a
    retransmission timeout). 1 % and 200 ms cut a lone connection from
    60 MB/s to ~21 MB/s; real TCP repairs most single losses with fast
    retransmit within a round trip, and CUBIC's window cut is not
    modelled, so treat the lossy figures as "a connection that sometimes
    stops for an RTO", which is what hurts clients with few connections.

Threads with blocking splice(2) through a kernel pipe per direction (the
pipe is the delay line and the window): the bytes never enter Python, and
the kernel work of several connections runs on several cores.

usage: wanproxy.py UPSTREAM_HOST:PORT [--port P] [--bind ADDR]
         [--rate MB/s] [--rtt MS] [--loss P] [--stall-ms MS]
         [--setup-rtts N] [--window BYTES] [--seed N] [--stats FILE]
Prints the port on stdout, then serves until killed (SIGTERM/SIGINT).
Importable: WanProxy(upstream_host, upstream_port, **opts).start()."""
import argparse
import collections
import fcntl
import json
import os
import random
import select
import signal
import socket
import sys
import threading
import time

CHUNK = 256 * 1024
LOSS_UNIT = 64 * 1024
BATCH_S = 0.002


class Pipe:
    """One direction of one connection: src -> (link model) -> dst. The
    bytes wait in a kernel pipe (the delay line: splice moves them without
    copying them through Python); only (arrival time, length) records are
    kept here."""

    def __init__(self, proxy, conn, src, dst, rng):
        self.p, self.conn, self.src, self.dst = proxy, conn, src, dst
        self.rng = rng
        self.q = collections.deque()
        self.cv = threading.Condition()
        self.link_free = 0.0
        self.rfd, self.wfd = os.pipe()
        for size in (proxy.window, 1 << 20, 256 << 10):
            try:
                fcntl.fcntl(self.wfd, fcntl.F_SETPIPE_SZ, size)
                break
            except OSError:
                continue

    def reader(self):
        try:
            time.sleep(self.p.setup_s)
            poll = select.poll()
            poll.register(self.src.fileno(), select.POLLIN)
            while not self.conn.dead:
                # wait here, not in splice: a splice blocked on an empty
                # socket holds the pipe's lock, and the writer's read of the
                # bytes already in the pipe would wait with it
                if not poll.poll(500):
                    continue
                n = os.splice(self.src.fileno(), self.wfd, CHUNK)
                if n == 0:
                    break
                if n < CHUNK // 2:
                    # let a stream gather before the next read: fewer,
                    # larger splices (at most BATCH_S later, on top of RTT/2)
                    time.sleep(BATCH_S)
                self.p.count(n)
                with self.cv:
                    self.q.append((time.monotonic(), n))
                    self.cv.notify()
        except OSError:
            self.conn.kill()
            return
        with self.cv:
            self.q.append((time.monotonic(), 0))
            self.cv.notify()

    def _deliver_at(self, t_in, n):
        p = self.p
        start = max(t_in, self.link_free)
        busy = n / p.rate if p.rate > 0 else 0.0
        if p.loss > 0:
            for _ in range(max(1, n // LOSS_UNIT)):
                if self.rng.random() < p.loss:
                    busy += p.stall_s
                    p.count_stall()
        self.link_free = start + busy
        return self.link_free + p.one_way_s

    def _coalesce(self, n, due):
        """Takes the following records due within 2 ms of this one into the
        same splice: fewer wake-ups, same schedule within 2 ms."""
        p = self.p
        while n < (1 << 20):
            with self.cv:
                if not self.q or self.q[0][1] == 0:
                    break
                t2, n2 = self.q[0]
                end = max(t2, self.link_free) + (n2 / p.rate if p.rate > 0 else 0)
                if end + p.one_way_s > due + 0.002:
                    break
                self.q.popleft()
            due = self._deliver_at(t2, n2)
            n += n2
        return n, due

    def writer(self):
        try:
            while True:
                with self.cv:
                    while not self.q and not self.conn.dead:
                        self.cv.wait(0.5)
                    if self.conn.dead:
                        return
                    t_in, n = self.q.popleft()
                if n == 0:
                    self.dst.shutdown(socket.SHUT_WR)
                    break
                due = self._deliver_at(t_in, n)
                n, due = self._coalesce(n, due)
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                while n > 0:
                    n -= os.splice(self.rfd, self.dst.fileno(), n)
        except OSError:
            self.conn.kill()
            return
        self.conn.half_done()

    def close(self):
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass


class Conn:
    def __init__(self, proxy, client, upstream, rng):
        self.client, self.upstream = client, upstream
        self.dead = False
        self.halves = 0
        self.mu = threading.Lock()
        self.pipes = [Pipe(proxy, self, client, upstream, rng),
                      Pipe(proxy, self, upstream, client, rng)]
        self.threads = []
        for pipe in self.pipes:
            for fn in (pipe.reader, pipe.writer):
                t = threading.Thread(target=fn, daemon=True)
                self.threads.append(t)

    def start(self):
        for t in self.threads:
            t.start()

    def half_done(self):
        with self.mu:
            self.halves += 1
            if self.halves == 2:
                self._close()

    def kill(self):
        with self.mu:
            if self.dead:
                return
            self.dead = True
            for s in (self.client, self.upstream):
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
            self._close()
        for pipe in self.pipes:
            with pipe.cv:
                pipe.cv.notify_all()

    def _close(self):
        self.dead = True
        for s in (self.client, self.upstream):
            try:
                s.close()
            except OSError:
                pass
        for pipe in self.pipes:
            pipe.close()


class WanProxy:
    def __init__(self, up_host, up_port, port=0, bind="127.0.0.1", rate_mbs=60.0,
                 rtt_ms=20.0, loss=0.0, stall_ms=200.0, setup_rtts=2,
                 window=4 << 20, seed=1, stats_path=None):
        if not up_host.startswith("127.") or not bind.startswith("127."):
            raise ValueError("wanproxy is loopback only")
        self.up = (up_host, up_port)
        self.rate = rate_mbs * 1e6
        self.one_way_s = rtt_ms / 2000.0
        self.setup_s = setup_rtts * rtt_ms / 1000.0
        self.loss = loss
        self.stall_s = stall_ms / 1000.0
        self.window = window
        self.seed = seed
        self.stats_path = stats_path
        self.mu = threading.Lock()
        self.st = {"connections": 0, "bytes": 0, "stalls": 0}
        self.ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind((bind, port))
        self.ls.listen(512)
        self.port = self.ls.getsockname()[1]
        self.closed = False

    def count(self, n):
        with self.mu:
            self.st["bytes"] += n

    def count_stall(self):
        with self.mu:
            self.st["stalls"] += 1

    def stats(self):
        with self.mu:
            return dict(self.st)

    def start(self):
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self):
        n = 0
        while not self.closed:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.up)
            except OSError:
                c.close()
                continue
            for s in (c, u):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            n += 1
            with self.mu:
                self.st["connections"] += 1
            Conn(self, c, u, random.Random(self.seed * 1000003 + n)).start()

    def write_stats(self):
        if self.stats_path:
            st = self.stats()
            ru = os.times()
            st["cpu_s"] = ru.user + ru.system
            tmp = self.stats_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(st, f)
            os.replace(tmp, self.stats_path)

    def close(self):
        self.closed = True
        self.ls.close()


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("upstream", help="HOST:PORT on loopback")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--rate", type=float, default=60.0,
                    help="MB/s per connection and direction (0: no cap)")
    ap.add_argument("--rtt", type=float, default=20.0, help="round trip, ms")
    ap.add_argument("--loss", type=float, default=0.0,
                    help="probability per 64 KiB of a stall")
    ap.add_argument("--stall-ms", type=float, default=200.0)
    ap.add_argument("--setup-rtts", type=float, default=2)
    ap.add_argument("--window", type=int, default=4 << 20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stats", help="write counters as JSON here every second")
    a = ap.parse_args(argv)
    host, _, port = a.upstream.rpartition(":")
    px = WanProxy(host, int(port), port=a.port, bind=a.bind, rate_mbs=a.rate,
                  rtt_ms=a.rtt, loss=a.loss, stall_ms=a.stall_ms,
                  setup_rtts=a.setup_rtts, window=a.window, seed=a.seed,
                  stats_path=a.stats).start()
    print(px.port, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(1.0):
        px.write_stats()
    px.write_stats()
    px.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
