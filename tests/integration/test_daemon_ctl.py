"""spotctl status / checkpoint / done against a real spotd (status with the
trainer's reported step, steps/s and steps at risk), and the control
socket itself: a clear error without a daemon, mode 0660, SO_PEERCRED
refusing another uid, a bad or oversized line dropping only that client;
`spotctl checkpoint --wait` answered (exit 1, with the reason) once the
request's --ckpt-timeout passes without a checkpoint, not left waiting
until a later commit or spotd's exit."""
import json
import os
import re
import signal
import socket
import stat
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def no_daemon(c, wd):
    """Without a daemon: one clear line on stderr and a non-zero exit."""
    missing = os.path.join(wd, "nobody.sock")
    for args in (["status"], ["status", "--json"], ["checkpoint"],
                 ["checkpoint", "--wait"], ["done", wd]):
        cp = sl.spotctl(args[0], "--socket", missing, *args[1:], timeout=20)
        lines = cp.stderr.strip().splitlines()
        c.check(cp.returncode != 0 and len(lines) == 1 and
                "cannot reach spotd at " + missing in lines[0] and
                "is spotd running?" in lines[0] and cp.stdout == "",
                "no daemon: spotctl %s fails with one clear line" %
                " ".join(args), "rc=%d stderr=%r" % (cp.returncode, cp.stderr))
    # a stale socket: the file exists, nobody listens
    stale = os.path.join(wd, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()
    cp = sl.spotctl("status", "--socket", stale, timeout=20)
    c.check(cp.returncode != 0 and "Connection refused" in cp.stderr and
            "is spotd running?" in cp.stderr,
            "stale socket: connection refused, said clearly", cp.stderr)
    cp = sl.spotctl("status", timeout=20, env={"SPOTD_SOCKET": missing})
    c.check(cp.returncode != 0 and missing in cp.stderr,
            "$SPOTD_SOCKET names the socket", cp.stderr)


def raw_request(path, data, timeout=10):
    """Sends data on a new connection; returns everything read until EOF."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    try:
        s.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except (socket.timeout, ConnectionResetError):
        out += b"<timeout or reset>"
    s.close()
    return out


def report_step(path, step):
    """One "step" request, as the helper's report_step() sends it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    try:
        s.sendall(b'{"v":1,"id":1,"cmd":"step","args":{"step":%d}}\n' % step)
        return s.makefile("rb").readline()
    finally:
        s.close()


def progress(c, d):
    """status shows the trainer's reported step, its steps/s and the steps
    since the last committed checkpoint's step."""
    s = d.status() or {}
    tr = s.get("trainer") or {}
    c.check(tr.get("step") is None and tr.get("steps_at_risk") is None,
            "status: no step before the trainer reports one", repr(tr))
    m = re.match(r"step-(\d+)$", (s.get("last_commit") or {}).get("name", ""))
    at = int(m.group(1)) if m else 0
    ans = report_step(d.socket, at + 10)
    time.sleep(1.2)  # the rate needs reports a second apart
    report_step(d.socket, at + 40)
    s = d.status() or {}
    tr = s.get("trainer") or {}
    rate = tr.get("steps_per_s")
    c.check(b'"ok":true' in ans and tr.get("step") == at + 40 and
            tr.get("steps_at_risk") == 40 and rate is not None and
            0 < rate <= 30,
            "status --json: step %d, %s steps/s, 40 steps at risk since "
            "step %d" % (at + 40, rate, at), repr(tr))
    cp = d.spotctl("status")
    m = re.search(
        r"(?m)^progress: +step %d, ([0-9.]+) steps/s, 40 steps at risk "
        r"\(about (\d+) s of training\)$" % (at + 40), cp.stdout)
    c.check(cp.returncode == 0 and m is not None and
            abs(int(m.group(2)) - 40 / float(m.group(1))) <= 1,
            "status: the progress line gives the steps at risk and the "
            "training time they took", cp.stdout + cp.stderr)
    c.check(not re.search(r"(?m)^last commit:.*work at risk", cp.stdout),
            "status: the commit's age is not called the work at risk",
            cp.stdout)


def with_daemon(c, wd):
    store, job, prefix = sl.daemon_job("ctl")
    with sl.cleaned_up(prefix):
        d = sl.Daemon(wd, store, job, trainer=["--step-sleep", 0.05])
        start = d.wait_event("start", 20)
        c.check(start is not None and
                d.wait_log(r"state \S+ -> running", 20) is not None,
                "the daemon runs")
        st = os.stat(d.socket)
        c.check(stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660,
                "the socket is mode 0660 (%o)" % stat.S_IMODE(st.st_mode))

        s = d.status()
        c.check(s is not None and s.get("state") == "running" and
                s.get("job") == job and s.get("store") == "%s/%s" % (store, job)
                and s.get("provider") == "none",
                "status --json: state, job, store, provider", repr(s))
        tr = (s or {}).get("trainer") or {}
        c.check(start is not None and tr.get("pid") == d.trainer_pids()[0] and
                tr.get("uptime_s", -1) >= 0 and tr.get("restart_count") == 0,
                "status --json: trainer pid, uptime, restart count", repr(tr))
        c.check(s is not None and not s.get("last_commit") and
                not s.get("notice"), "status --json: no commit, no notice yet")
        cp = d.spotctl("status")
        c.check(cp.returncode == 0 and re.search(r"(?m)^state: +running$",
                                                 cp.stdout) and
                "last commit:  none" in cp.stdout and
                "trainer:      pid %d" % (d.trainer_pids() or [0])[0] in cp.stdout,
                "status: the human table", cp.stdout + cp.stderr)
        cp = sl.spotctl("status", "--json", timeout=20,
                        env={"SPOTD_SOCKET": d.socket})
        c.check(cp.returncode == 0 and json.loads(cp.stdout)["job"] == job,
                "status finds the socket through $SPOTD_SOCKET")

        # checkpoint --wait returns the committed name
        cp = d.spotctl("checkpoint", "--wait", "--timeout", 30)
        m = re.match(r"committed (step-\d{6})$", cp.stdout.strip())
        c.check(cp.returncode == 0 and m is not None,
                "checkpoint --wait: %s" % cp.stdout.strip(), cp.stderr)
        name = m.group(1) if m else "?"
        c.check(sl.latest(prefix) == name,
                "checkpoint --wait returned after the commit (LATEST=%s)" % name)
        s = d.status() or {}
        lc = s.get("last_commit") or {}
        c.check(lc.get("name") == name and lc.get("age_s", -1) >= 0 and
                lc.get("time", "").endswith("Z"),
                "status: last commit %s with its age" % name, repr(lc))

        # checkpoint without --wait
        cp = d.spotctl("checkpoint")
        c.check(cp.returncode == 0 and cp.stdout.strip() ==
                "checkpoint requested", "checkpoint: requested", cp.stderr)
        line = d.wait_log(r"committed checkpoint name=(?!%s)" % name, 20)
        c.check(line is not None, "checkpoint: then committed")
        progress(c, d)

        # done DIR: a folder without the marker
        manual = os.path.join(d.ckpt_dir, "manual-1")
        os.makedirs(manual)
        with open(os.path.join(manual, "weights"), "wb") as f:
            f.write(os.urandom(4096))
        cp = d.spotctl("done", manual)
        c.check(cp.returncode == 0 and "manual-1" in cp.stdout,
                "done DIR: accepted", cp.stdout + cp.stderr)
        c.check(d.wait_log(r"committed checkpoint name=manual-1", 20)
                is not None and sl.latest(prefix) == "manual-1",
                "done DIR: committed, LATEST=manual-1")
        cp = d.spotctl("done", manual)
        c.check(cp.returncode != 0 and "already handled" in cp.stderr,
                "done DIR twice: already handled", cp.stderr)
        outside = os.path.join(wd, "elsewhere")
        os.makedirs(outside)
        cp = d.spotctl("done", outside)
        c.check(cp.returncode != 0 and "is not a folder directly under" in
                cp.stderr, "done DIR outside SPOTD_CKPT_DIR: refused", cp.stderr)
        cp = d.spotctl("done", os.path.join(d.ckpt_dir, "nope"))
        c.check(cp.returncode != 0 and "No such file" in cp.stderr,
                "done on a missing folder: refused", cp.stderr)

        # another uid: refused by SO_PEERCRED even when the mode lets it in
        if os.geteuid() == 0 and os.path.exists("/usr/bin/setpriv"):
            os.chmod(d.socket, 0o666)
            for p in (wd, os.path.dirname(wd)):
                os.chmod(p, 0o755)
            cp = sl.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                         "--clear-groups", sl.spotctl_exe(), "status",
                         "--socket", d.socket], timeout=20)
            c.check(cp.returncode != 0 and "permission denied" in cp.stderr,
                    "uid 65534: refused (SO_PEERCRED)", cp.stderr)
            c.check(d.wait_log(r"control: refused pid=\d+ uid=65534", 5)
                    is not None, "the log names the refused uid")
            os.chmod(d.socket, 0o660)
        else:
            print("note: not root, the other-uid check is not run")

        # an oversized line drops that client only
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        idle.connect(d.socket)
        out = raw_request(d.socket, b"x" * (70 * 1024))
        c.check(b"protocol error" in out and b"<timeout" not in out,
                "a line over 64 KiB: error answer, then the client is dropped",
                repr(out[:200]))
        out = raw_request(d.socket, b"{not json}\n")
        c.check(b"protocol error" in out and b"<timeout" not in out,
                "invalid JSON: error answer, then the client is dropped",
                repr(out[:200]))
        out = raw_request(d.socket, b'{"v":1,"id":7,"cmd":"frobnicate"}\n'
                          b'{"v":1,"id":8,"cmd":"hello"}\n', timeout=2)
        lines = [json.loads(x) for x in out.split(b"\n")
                 if x.strip() and not x.startswith(b"<")]
        c.check(len(lines) == 2 and lines[0]["ok"] is False and
                "unknown command" in lines[0]["error"] and lines[1]["ok"] and
                lines[1]["result"]["job"] == job,
                "an unknown command is answered, the client keeps going",
                repr(out[:300]))
        idle.sendall(b'{"v":1,"id":3,"cmd":"status"}\n')
        idle.settimeout(10)
        got = idle.recv(65536)
        idle.close()
        c.check(b'"ok":true' in got.replace(b" ", b""),
                "a client connected before keeps being served", repr(got[:100]))
        c.check(d.status() is not None and d.running(),
                "the daemon keeps serving new clients")

        d.send(signal.SIGTERM)
        rc = d.wait_exit(40)
        c.check(rc == 0, "SIGTERM: exit 0", "rc=%s" % rc)
        c.check(not os.path.exists(d.socket), "the socket is removed at exit")
        cp = sl.spotctl("status", "--socket", d.socket, timeout=20)
        c.check(cp.returncode != 0 and "cannot reach spotd" in cp.stderr,
                "after the exit: a clear error", cp.stderr)


def wait_timeout(c, wd):
    store, job, prefix = sl.daemon_job("ctl-wait")
    with sl.cleaned_up(prefix):
        # a trainer that never saves: the request times out after 2 s
        d = sl.Daemon(wd, store, job, args=["--ckpt-timeout", "2"],
                      trainer=["--step-sleep", 0.05, "--ignore-signal"])
        c.check(d.wait_event("start", 20) is not None and
                d.wait_log(r"state \S+ -> running", 20) is not None,
                "wait: the daemon runs")
        cp = d.spotctl("checkpoint", "--wait", "--timeout", "60", timeout=90)
        c.check(cp.returncode == 1 and
                "no checkpoint completed within 2 s" in cp.stderr,
                "checkpoint --wait ends with the request's timeout (exit 1, "
                "the reason)", "rc=%d %r" % (cp.returncode, cp.stderr))
        s = d.status()
        c.check(s is not None and s.get("state") == "running",
                "wait: spotd still runs the trainer", repr(s))
        d.send(signal.SIGTERM)
        d.wait_exit(40)


def main():
    sl.daemon_env()
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-ctl-") as wd:
        no_daemon(c, wd)
        with_daemon(c, os.path.join(wd, "d"))
        wait_timeout(c, os.path.join(wd, "w"))
    c.finish()


if __name__ == "__main__":
    main()
