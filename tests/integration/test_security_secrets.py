#!/usr/bin/python3
"""No secret in any output, and none reachable through a core dump.

A full run with the instance role as the only credentials (the emulator
serves the Ceph test key pair and a session token as role credentials;
nothing in the environment or files): spotd (AWS provider, periodic
checkpoints, then an interruption notice), `spotctl status --json` while
it runs, then spotctl push, list and restore, everything at debug level
(SPOTD_LOG_LEVEL=7). All stdout and stderr is captured (the trainer's own
event log, which dumps its environment, is not output of ours) and
scanned for the secret key, the session token and every IMDSv2 token the
emulator issued (read from its /__emulate/state). None may appear.

Core dumps: spotd and spotctl set PR_SET_DUMPABLE 0. Checked where it
can fail: both run as `nobody`, and another `nobody` process must not be
able to read their /proc/PID/environ (a dumpable process's is readable
by its own uid; a non-dumpable one's belongs to root)."""
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

endpoint, bucket = sl.daemon_env()
c = sl.Checks()
store, job, prefix = sl.daemon_job("secrets")
SECRET = os.environ["AWS_SECRET_ACCESS_KEY"]
AKID = os.environ["AWS_ACCESS_KEY_ID"]
TOKEN = "SESSIONTOKEN" + secrets.token_hex(16)
outputs = []  # (label, text)


def role_only_env(emu_url, home):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") or k in ("AWS_REGION", "AWS_DEFAULT_REGION",
                                                "AWS_ENDPOINT_URL")}
    env.update(HOME=home, AWS_EC2_METADATA_SERVICE_ENDPOINT=emu_url, SPOTD_LOG_LEVEL="7")
    return env


def spotctl(env, *args, timeout=120):
    cp = subprocess.run([sl.spotctl_exe()] + [str(a) for a in args], capture_output=True,
                        text=True, timeout=timeout, env=env)
    outputs.append(("spotctl " + args[0], cp.stdout + cp.stderr))
    return cp


def environ_readable_by_nobody(pid):
    cp = sl.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                 "cat", "/proc/%d/environ" % pid], timeout=10)
    return cp.returncode == 0


emu = None
d = None
try:
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        home = os.path.join(tmp, "home")
        os.makedirs(home)
        creds = os.path.join(tmp, "role.json")
        with open(creds, "w") as f:
            f.write('{"AccessKeyId": "%s", "SecretAccessKey": "%s", "Token": "%s"}'
                    % (AKID, SECRET, TOKEN))
        emu = sl.EmulatorProc("aws", "--role-creds", creds)
        env = role_only_env(emu.url, home)
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)  # what sl.Daemon passes on
        try:
            d = sl.Daemon(os.path.join(tmp, "d"), store, job, provider="aws",
                          metadata_url=emu.url, interval=2, echo=False,
                          args=["--log-level", "debug"],
                          trainer=["--step-sleep", "0.05"])
        finally:
            os.environ.clear()
            os.environ.update(saved)
        committed = d.wait_log(r"committed", 40)
        c.check(committed is not None, "spotd committed a periodic checkpoint", d.log()[-2000:])
        st = d.spotctl("status", "--json", env=env)
        outputs.append(("status --json", st.stdout + st.stderr))
        st2 = d.spotctl("status", env=env)
        outputs.append(("status", st2.stdout + st2.stderr))
        c.check(st.returncode == 0 and '"' in st.stdout, "status --json answered", st.stderr)
        # non-dumpable: /proc/PID/environ of spotd belongs to root
        c.check(os.stat("/proc/%d/environ" % d.pid).st_uid == 0 and
                open("/proc/%d/status" % d.pid).read().find("TracerPid") >= 0,
                "spotd's /proc entries are root's")
        emu.control("notice", deadline=20)
        rc = d.wait_exit(30)
        c.check(rc == 75, "spotd handled the notice and exited 75 (got %s)" % rc,
                d.log()[-2000:])
        outputs.append(("spotd stderr", d.err.text()))
        outputs.append(("spotd stdout", d.out.text()))
        c.check(any("refresh" in ln or "instance" in ln for ln in d.err.matching("aws")),
                "spotd used the instance role (debug log mentions it)",
                "\n".join(d.err.matching("aws"))[-1500:])

        src = os.path.join(tmp, "ckpt")
        os.makedirs(src)
        sl.write_random(os.path.join(src, "w.bin"), 6 * 1024 * 1024)
        cp = spotctl(env, "push", src, store + "/" + job, "--name", "manual")
        c.check(cp.returncode == 0, "spotctl push with the role", cp.stderr[-1500:])
        cp = spotctl(env, "list", store + "/" + job)
        c.check(cp.returncode == 0 and "manual" in cp.stdout, "spotctl list", cp.stderr[-1500:])
        cp = spotctl(env, "list", store + "/" + job, "--json")
        cp = spotctl(env, "restore", store + "/" + job, os.path.join(tmp, "back"),
                     "--name", "manual")
        c.check(cp.returncode == 0, "spotctl restore", cp.stderr[-1500:])
        # a failure path too: a wrong secret in the environment
        bad = dict(env, AWS_ACCESS_KEY_ID=AKID, AWS_SECRET_ACCESS_KEY="x" + SECRET[1:])
        cp = spotctl(bad, "list", store + "/" + job)
        c.check(cp.returncode != 0, "a wrong secret fails")
        bad_secret = bad["AWS_SECRET_ACCESS_KEY"]

        st = emu.state()
        tokens = st.get("tokens", [])
        c.check(len(tokens) > 0, "the emulator issued IMDSv2 tokens (%d)" % len(tokens))
        needles = [("secret key", SECRET), ("wrong secret", bad_secret),
                   ("session token", TOKEN)] + [("IMDS token", t) for t in tokens]
        total = sum(len(t) for _, t in outputs)
        c.check(total > 2000 and any("debug" in t.lower() or "<7>" in t or "state" in t
                                     for _, t in outputs),
                "scanned %d bytes of output from %d sources" % (total, len(outputs)))
        leaks = ["%s in %s" % (what, label) for what, n in needles
                 for label, text in outputs if n and n in text]
        c.check(not leaks, "no secret key, session token or IMDS token in any output",
                "; ".join(sorted(set(leaks))))

        # core dumps: both programs non-dumpable, checked as another process of
        # the same (non-root) uid
        emu2 = subprocess.Popen(["setpriv", "--reuid", "nobody", "--regid", "nogroup",
                                 "--clear-groups", sl.spotd_emulate_exe(),
                                 "--provider", "aws", "--port", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        sl._STARTED.append(emu2)
        sleeper = subprocess.Popen(["setpriv", "--reuid", "nobody", "--regid", "nogroup",
                                    "--clear-groups", "sleep", "30"])
        sl._STARTED.append(sleeper)
        time.sleep(0.5)
        c.check(environ_readable_by_nobody(sleeper.pid),
                "control: a dumpable nobody process's environ is readable by nobody")
        c.check(emu2.poll() is None and not environ_readable_by_nobody(emu2.pid),
                "spotd-emulate (as nobody) is not dumpable: its environ is not readable")
        wd = os.path.join(tmp, "nobody")
        os.makedirs(wd)
        os.chmod(wd, 0o777)
        sd = subprocess.Popen(["setpriv", "--reuid", "nobody", "--regid", "nogroup",
                               "--clear-groups", sl.spotd_exe(), "run", "--job", "j",
                               "--store", store, "--provider", "none", "--interval", "0",
                               "--ckpt-dir", os.path.join(wd, "ckpt"),
                               "--socket", os.path.join(wd, "s.sock"), "--", "sleep", "30"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, HOME=wd))
        sl._STARTED.append(sd)
        ok = False
        for _ in range(50):
            if os.path.exists(os.path.join(wd, "s.sock")) or sd.poll() is not None:
                break
            time.sleep(0.1)
        c.check(sd.poll() is None, "spotd runs as nobody")
        if sd.poll() is None:
            ok = not environ_readable_by_nobody(sd.pid)
        c.check(ok, "spotd (as nobody) is not dumpable: its environ is not readable")
        for p in (emu2, sleeper, sd):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
finally:
    if d is not None and d.running():
        d.send(signal.SIGKILL)
    if emu is not None:
        emu.stop()
    sl.kill_started()
    sl.s3_cleanup(prefix)
c.finish()
