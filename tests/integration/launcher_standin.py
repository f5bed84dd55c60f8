#!/usr/bin/python3
"""A stand-in for torch 2.x's torchrun, for the tests: the same process
topology without torch 2.x.

    launcher_standin.py --nproc N -- COMMAND [ARG...]

- Starts N copies of COMMAND, each with start_new_session=True (torch's
  elastic SubprocessHandler does this since 2.0): every worker is the
  leader of its own session and process group, so a signal to the
  launcher's group never reaches it.
- Sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
  MASTER_ADDR (127.0.0.1) and MASTER_PORT (a free port) as torchrun does
  on one node.
- Forwards SIGTERM and SIGINT to each worker's process group with
  os.killpg, as torchrun's shutdown does; SIGKILL to the groups still
  there 30 s later.
- Ignores SIGUSR1 (a launcher that takes no part in checkpoints).
- When a worker fails the others are stopped the same way and the
  launcher exits 1; when all exit 0 it exits 0.
Prints one line "launcher pid=P workers=P1,P2,..." on stderr.
"""
import os
import signal
import socket
import subprocess
import sys
import time

GRACE = 30.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    argv = sys.argv[1:]
    if len(argv) < 4 or argv[0] != "--nproc" or argv[2] != "--":
        sys.exit("usage: launcher_standin.py --nproc N -- COMMAND [ARG...]")
    n = int(argv[1])
    cmd = argv[3:]
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    port = str(free_port())
    procs = []
    stopping = []

    def stop(sig):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def on_signal(signum, frame):
        stopping.append(time.monotonic())
        stop(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r),
                   WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
    print("launcher pid=%d workers=%s" % (
        os.getpid(), ",".join(str(p.pid) for p in procs)),
        file=sys.stderr, flush=True)
    failed = None
    while any(p.poll() is None for p in procs):
        for p in procs:
            rc = p.poll()
            if rc not in (None, 0) and failed is None and not stopping:
                failed = rc
                stopping.append(time.monotonic())
                stop(signal.SIGTERM)
        if stopping and time.monotonic() - stopping[0] > GRACE:
            stop(signal.SIGKILL)
        time.sleep(0.1)
    if failed is not None or any(p.returncode != 0 for p in procs):
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
