"""sd_notify, tested with our own NOTIFY_SOCKET (a datagram socket with
SO_PASSCRED, so each message's sender pid is known): READY=1 after the
restore and the launch, STATUS= lines through the life of the job,
WATCHDOG=1 every WATCHDOG_USEC/2 when WATCHDOG_PID is spotd's pid (and
not when it names another process), STOPPING=1 at the end, and none of
the service variables leaking into the trainer."""
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

SO_PASSCRED = getattr(socket, "SO_PASSCRED", 16)
SCM_CREDENTIALS = getattr(socket, "SCM_CREDENTIALS", 2)


class NotifySocket:
    def __init__(self, path):
        self.path = path
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(path)
        self.s.setsockopt(socket.SOL_SOCKET, SO_PASSCRED, 1)
        self.s.settimeout(0.2)
        self.msgs = []  # (time, sender pid, text)
        self.stop = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        size = socket.CMSG_SPACE(struct.calcsize("3i"))
        while not self.stop:
            try:
                data, anc, _, _ = self.s.recvmsg(4096, size)
            except socket.timeout:
                continue
            pid = None
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == SCM_CREDENTIALS:
                    pid = struct.unpack("3i", cdata[:12])[0]
            self.msgs.append((time.time(), pid, data.decode()))

    def close(self):
        self.stop = True
        self.t.join(2)
        self.s.close()

    def fields(self):
        """[(time, pid, key, value)] one per line of each message."""
        out = []
        for t, pid, text in self.msgs:
            for line in text.split("\n"):
                if "=" in line:
                    k, v = line.split("=", 1)
                    out.append((t, pid, k, v))
        return out


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("notify")
    ns = None
    try:
        with tempfile.TemporaryDirectory(prefix="spotd-notify-") as wd:
            # a committed checkpoint, so the run below restores first
            d0 = sl.Daemon(os.path.join(wd, "seed"), store, job,
                           trainer=["--every", 3, "--exit-at", 3,
                                    "--step-sleep", 0.02])
            c.check(d0.wait_exit(60) == 0 and sl.latest(prefix) ==
                    "step-000003", "seed: step-000003 committed")

            ns = NotifySocket(os.path.join(wd, "notify.sock"))
            env = {"NOTIFY_SOCKET": ns.path, "WATCHDOG_USEC": "2000000"}
            wrap = ["/bin/sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; '
                    'exec "$@"', "sh"]
            d = sl.Daemon(os.path.join(wd, "run"), store, job, env=env,
                          wrapper=wrap, trainer=["--step-sleep", 0.05])
            start = d.wait_event("start", 30)
            c.check(start is not None and start["step"] == 3,
                    "the trainer resumed from step-000003")
            time.sleep(3.0)  # watchdog pings
            cp = d.spotctl("checkpoint", "--wait", "--timeout", 30)
            c.check(cp.returncode == 0, "a checkpoint is committed", cp.stderr)
            name = cp.stdout.split()[-1] if cp.returncode == 0 else "?"
            time.sleep(0.3)
            d.send(signal.SIGTERM)
            rc = d.wait_exit(40)
            c.check(rc == 0, "SIGTERM: exit 0", "rc=%s" % rc)
            time.sleep(0.3)
            f = ns.fields()
            print("notify messages:")
            for t, pid, text in ns.msgs:
                if text != "WATCHDOG=1":
                    print("  %.3f pid=%s %r" % (t - d.t0, pid, text))

            pids = set(pid for _, pid, _, _ in f)
            c.check(pids == {d.pid}, "every message comes from spotd's pid %d "
                    "(NotifyAccess=main)" % d.pid, "senders %s" % pids)
            keys = [k for _, _, k, _ in f]
            statuses = [v for _, _, k, v in f if k == "STATUS"]
            ready = [i for i, k in enumerate(keys) if k == "READY"]
            c.check(len(ready) == 1, "READY=1 sent once (%d)" % len(ready))
            i_restoring = next((i for i, (_, _, k, v) in enumerate(f)
                                if k == "STATUS" and v == "restoring"), None)
            c.check(ready and i_restoring is not None and
                    i_restoring < ready[0],
                    "READY=1 after STATUS=restoring")
            running = [v for _, _, k, v in f
                       if k == "STATUS" and v.startswith("running, trainer pid")]
            c.check(ready and start and running and
                    running[0] == "running, trainer pid %d" %
                    (d.trainer_pids() or [0])[0] and
                    keys[ready[0] + 1] == "STATUS",
                    "READY=1 comes with the launched trainer's pid: %s" %
                    (running[:1],))
            c.check(not d.err.matching(r"restored checkpoint") or
                    d.err.time_of(r"restored checkpoint") <= f[ready[0]][0]
                    if ready else False, "READY=1 after the restore's log line")
            for want in ("connecting", "restoring", "committed " + name,
                         "draining", "stopping", "exiting"):
                c.check(want in statuses, "STATUS=%s" % want)
            wd_times = [t for t, _, k, v in f if k == "WATCHDOG" and v == "1"]
            gaps = [b - a for a, b in zip(wd_times, wd_times[1:])]
            # every WATCHDOG_USEC/2 = 1 s; systemd would kill spotd after a
            # gap of 2 s (a loaded machine delays a ping, never by that much)
            mid = sorted(gaps)[len(gaps) // 2] if gaps else -1
            c.check(len(wd_times) >= 3 and gaps and max(gaps) < 2.0 and
                    0.5 < mid < 1.5,
                    "WATCHDOG=1 every ~1 s (%d pings, median gap %.2f s, "
                    "largest %.2f s)" % (len(wd_times), mid,
                                         max(gaps) if gaps else -1))
            c.check(keys and keys[-1] in ("STOPPING", "STATUS") and
                    "STOPPING" in keys and
                    keys.index("STOPPING") > max(i for i, k in enumerate(keys)
                                                 if k == "READY"),
                    "STOPPING=1 at the end", repr(keys[-4:]))
            tenv = start["env"] if start else {}
            c.check(not any(k.startswith(("NOTIFY_SOCKET", "WATCHDOG_"))
                            for k in tenv),
                    "the trainer does not inherit NOTIFY_SOCKET/WATCHDOG_*",
                    repr(tenv))
            ns.close()

            # WATCHDOG_PID naming another process: no pings from spotd
            ns = NotifySocket(os.path.join(wd, "notify2.sock"))
            env = {"NOTIFY_SOCKET": ns.path, "WATCHDOG_USEC": "200000",
                   "WATCHDOG_PID": "1"}
            d = sl.Daemon(os.path.join(wd, "run2"), store, job, env=env,
                          trainer=["--step-sleep", 0.05])
            c.check(d.wait_event("start", 30) is not None, "second run starts")
            time.sleep(1.5)
            d.send(signal.SIGTERM)
            c.check(d.wait_exit(40) == 0, "second run: exit 0")
            time.sleep(0.2)
            keys = [k for _, _, k, _ in ns.fields()]
            c.check("READY" in keys and "WATCHDOG" not in keys,
                    "WATCHDOG_PID of another process: READY but no WATCHDOG=1",
                    repr(keys))
    finally:
        if ns is not None:
            ns.close()
        sl.kill_started()
        sl.s3_cleanup(prefix)
    c.finish()


if __name__ == "__main__":
    main()
