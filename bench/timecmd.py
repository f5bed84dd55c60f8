#!/usr/bin/env python3
"""timecmd.py - what bench/node_bench.sh asks of /usr/bin/time, for a
machine without it (the GPU host has no Debian packages):

  timecmd.py -o FILE CMD [ARG...]

runs CMD with this process's stdin, stdout and stderr, then writes one
line to FILE: wall seconds, user CPU seconds, system CPU seconds and peak
RSS in KiB (`/usr/bin/time -f '%e %U %S %M'`), from wait4(2) of CMD
alone. Exits with CMD's status (128 + N when a signal N ended it)."""
import os
import subprocess
import sys
import time


def main(argv):
    if len(argv) < 4 or argv[1] != "-o":
        sys.stderr.write("usage: timecmd.py -o FILE CMD [ARG...]\n")
        return 2
    out, cmd = argv[2], argv[3:]
    t0 = time.monotonic()
    try:
        p = subprocess.Popen(cmd)
    except OSError as e:
        sys.stderr.write("timecmd.py: %s: %s\n" % (cmd[0], e.strerror))
        return 127
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = 0  # reaped here: Popen must not wait for it again
    with open(out, "w") as f:
        f.write("%.2f %.2f %.2f %d\n" % (wall, ru.ru_utime, ru.ru_stime,
                                         ru.ru_maxrss))
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
