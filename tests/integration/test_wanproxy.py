#!/usr/bin/python3
"""A functional check of bench/wanproxy.py, the WAN emulator of the
benchmark (not a timing benchmark: the margins are wide). Through the proxy
set to 20 MB/s per connection, 100 ms RTT and one RTT of set-up:

- bytes arrive unchanged, both ways (an echo server behind it);
- the first answer on a new connection costs set-up + one RTT (>= 0.18 s);
- one connection moving 8 MB takes >= 0.32 s (the cap), and two at once
  take about as long as one (the cap is per connection, not shared);
- with loss set to 1 every 64 KiB stalls the link (counted, and slower).
Loopback only, no server needed."""
import hashlib
import os
import socket
import sys
import threading
import time

SRC = os.environ.get("SPOT_SRCDIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(SRC, "bench"))
import wanproxy  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

MB = 1000 * 1000


def serve(ls, echo):
    def one(c):
        buf = bytearray(1 << 16)
        while True:
            n = c.recv_into(buf)
            if not n:
                break
            if echo:
                c.sendall(buf[:n])
            elif buf[n - 1:n] == b"!":
                c.sendall(b"k")  # end marker: acknowledge
        c.close()
    while True:
        try:
            c, _ = ls.accept()
        except OSError:
            return
        threading.Thread(target=one, args=(c,), daemon=True).start()


def server(echo):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    threading.Thread(target=serve, args=(ls, echo), daemon=True).start()
    return ls


def push(port, nbytes):
    """Sends nbytes ending in '!', waits for the sink's ack; seconds."""
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.monotonic()
    s.sendall(b"x" * (nbytes - 1) + b"!")
    if s.recv(1) != b"k":
        raise RuntimeError("the sink did not acknowledge %d bytes" % nbytes)
    s.close()
    return time.monotonic() - t0


def main():
    c = spotlib.Checks()
    check = c.check

    echo = server(True)
    px = wanproxy.WanProxy("127.0.0.1", echo.getsockname()[1], rate_mbs=20,
                           rtt_ms=100, setup_rtts=1).start()
    s = socket.create_connection(("127.0.0.1", px.port))
    t0 = time.monotonic()
    s.sendall(b"ping")
    got = s.recv(16)
    first = time.monotonic() - t0
    check(got == b"ping", "echo through the proxy: %r" % got)
    check(0.18 <= first < 3, "first answer after set-up + RTT: %.3f s" % first)
    t0 = time.monotonic()
    s.sendall(b"again")
    got = s.recv(16)
    rtt = time.monotonic() - t0
    check(got == b"again" and 0.09 <= rtt < 2, "second answer after one RTT: %.3f s" % rtt)
    data = os.urandom(2 * MB)
    back = bytearray()
    sender = threading.Thread(target=s.sendall, args=(data,))
    sender.start()
    while len(back) < len(data):
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        back += chunk
    sender.join()
    check(hashlib.sha256(back).digest() == hashlib.sha256(data).digest(),
          "2 MB echoed unchanged (%d bytes back)" % len(back))
    s.close()
    px.close()

    sink = server(False)
    px = wanproxy.WanProxy("127.0.0.1", sink.getsockname()[1], rate_mbs=20,
                           rtt_ms=100, setup_rtts=1).start()
    one = push(px.port, 8 * MB)
    check(0.32 <= one < 6, "8 MB on one connection capped at 20 MB/s: %.2f s" % one)
    times = []
    ts = [threading.Thread(target=lambda: times.append(push(px.port, 8 * MB)))
          for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(len(times) == 2, "both connections acknowledged (%d)" % len(times))
    two = max(times + [one])
    check(two < 1.8 * one + 0.3,
          "two connections at once: %.2f s vs %.2f s alone (cap per connection)"
          % (two, one))
    px.close()

    px = wanproxy.WanProxy("127.0.0.1", sink.getsockname()[1], rate_mbs=200,
                           rtt_ms=10, setup_rtts=1, loss=1.0, stall_ms=30).start()
    lossy = push(px.port, 1 << 20)
    st = px.stats()
    check(st["stalls"] >= 16, "1 MiB with loss 1: %d stalls (>= 16)" % st["stalls"])
    check(lossy >= 0.4, "the stalls cost time: %.2f s (>= 0.4)" % lossy)
    px.close()
    c.finish()


if __name__ == "__main__":
    main()
