#!/usr/bin/python3
"""The ceiling of bench/wanproxy.py on this machine: N connections each
send MB megabytes through the proxy (in its own process) to a discarding
TCP sink; prints JSON with the aggregate MB/s, the expected cap
(N x rate), the proxy's CPU-seconds per GiB and its share of the run.

usage: wanproxy_ceiling.py [--conns N] [--mb MB] [--rate MB/s] [--rtt MS]"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def sink(ls):
    def serve(c):
        buf = bytearray(1 << 20)
        while c.recv_into(buf):
            pass
        c.close()
    while True:
        try:
            c, _ = ls.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def proc_cpu(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--rate", type=float, default=60.0)
    ap.add_argument("--rtt", type=float, default=20.0)
    a = ap.parse_args(argv)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(256)
    threading.Thread(target=sink, args=(ls,), daemon=True).start()
    px = subprocess.Popen([sys.executable, os.path.join(HERE, "wanproxy.py"),
                           "127.0.0.1:%d" % ls.getsockname()[1],
                           "--rate", str(a.rate), "--rtt", str(a.rtt)],
                          stdout=subprocess.PIPE, text=True)
    port = int(px.stdout.readline())
    payload = memoryview(bytearray(os.urandom(1 << 20)))

    def send():
        s = socket.create_connection(("127.0.0.1", port))
        for _ in range(a.mb):
            s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
        s.close()
    c0 = proc_cpu(px.pid)
    t0 = time.monotonic()
    ts = [threading.Thread(target=send) for _ in range(a.conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.monotonic() - t0
    cpu = proc_cpu(px.pid) - c0
    px.terminate()
    px.wait()
    total = a.conns * a.mb * (1 << 20)
    res = {"conns": a.conns, "mb_each": a.mb, "rate_mbs": a.rate,
           "rtt_ms": a.rtt, "wall_s": round(wall, 3),
           "aggregate_mbs": round(total / wall / 1e6, 1),
           "cap_mbs": a.conns * a.rate if a.rate > 0 else None,
           "proxy_cpu_s_per_gib": round(cpu / (total / (1 << 30)), 3),
           "proxy_cores_busy": round(cpu / wall, 2)}
    print(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1:])
