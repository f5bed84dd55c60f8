#!/usr/bin/python3
"""spotctl relaunch: the exec backend (variables passed, exit
status reported, timeout kills, dry run, idempotency per preemption, SIGTERM
passed on), the slurm backend against a fake scontrol (busy controller
retried with backoff, refusal not retried, hold + exclude-node sequence,
SIGTERM ignored while requeueing) and against a real single-node Slurm
(a bogus job id is refused), bad input (unknown backend, missing SPOTD_*
variable, outside a Slurm job, scontrol not on PATH), and the daemon: a
relaunch that fails outside a Slurm job is logged as failed and the
checkpoint stays committed; a SIGTERM while the relaunch step runs does not
turn the handled preemption into a plain stop (exit 75)."""
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metalib  # noqa: E402
import spotlib  # noqa: E402

os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
c = spotlib.Checks()
SPOTCTL = os.environ.get("SPOTCTL") or spotlib.builddir_path("client", "spotctl")
SPOTD = os.environ.get("SPOTD") or spotlib.builddir_path("daemon", "spotd")
TMP = tempfile.mkdtemp(prefix="spotd-relaunch-")
STATE = os.path.join(TMP, "state")
BACKENDS = ("exec", "slurm", "aws", "gcp")
TS = re.compile(r"^spotctl relaunch \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z: ", re.M)


def base_env(**kw):
    """A clean environment with the five variables spotd passes."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPOTD_", "SLURM_", "SPOTCTL_"))}
    env.update({
        "SPOTD_JOB": "job-1", "SPOTD_STORE": "s3://bucket/prefix/job-1",
        "SPOTD_CHECKPOINT": "step-000100", "SPOTD_REASON": "aws-spot-terminate",
        "SPOTD_DEADLINE": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                        time.gmtime(time.time() + 120)),
        "SPOTCTL_STATE_DIR": STATE,
    })
    for k, v in kw.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def relaunch(*args, env=None, timeout=60):
    try:
        cp = subprocess.run([SPOTCTL, "relaunch"] + list(args), env=env,
                            capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, -9, "", "(timed out)")
    return cp


def show(cp):
    return "rc=%d\n%s%s" % (cp.returncode, cp.stdout, cp.stderr)


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


# ------------------------------------------------------------------ exec

def test_exec():
    out = os.path.join(TMP, "vars")
    env = base_env()
    cp = relaunch("--backend", "exec", "--", "sh", "-c",
                  'env | grep ^SPOTD_ | sort > "$0"', out, env=env)
    c.check(cp.returncode == 0, "exec: a command that succeeds: exit 0", show(cp))
    got = dict(l.split("=", 1) for l in spotlib.read_text(out).splitlines())
    want = {k: env[k] for k in ("SPOTD_JOB", "SPOTD_STORE", "SPOTD_CHECKPOINT",
                                "SPOTD_REASON", "SPOTD_DEADLINE")}
    c.check(got == want, "exec: the command gets the five SPOTD_* variables",
            repr(got))
    c.check(len(TS.findall(cp.stderr)) >= 3 and "attempt 1/1" in cp.stderr,
            "exec: every attempt logged on stderr with a timestamp", cp.stderr)

    cp = relaunch("--backend", "exec", "--", "sh", "-c", "exit 3",
                  env=base_env(SPOTD_CHECKPOINT="step-000101"))
    c.check(cp.returncode == 1 and "exit status 3" in cp.stderr,
            "exec: the command's exit status is reported, exit 1", show(cp))

    pidf = os.path.join(TMP, "sleeper.pid")
    t0 = time.time()
    cp = relaunch("--backend", "exec", "--timeout", "1", "--", "sh", "-c",
                  'echo $$ > "$0"; exec sleep 30', pidf,
                  env=base_env(SPOTD_CHECKPOINT="step-000102"))
    took = time.time() - t0
    pid = int(spotlib.read_text(pidf) or "0")
    alive = pid > 0 and os.path.exists("/proc/%d" % pid)
    c.check(cp.returncode == 1 and "timed out" in cp.stderr and took < 5 and
            not alive, "exec: the timeout kills the command (%.1f s)" % took,
            show(cp))

    # SIGTERM does not stop the command's SIGTERM handler from running: it
    # is passed on, then SIGKILL after a grace.
    pidf = os.path.join(TMP, "term.pid")
    p = subprocess.Popen([SPOTCTL, "relaunch", "--backend", "exec", "--", "sh",
                          "-c", 'echo $$ > "$0"; exec sleep 30', pidf],
                         env=base_env(SPOTD_CHECKPOINT="step-000103"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(100):
        if spotlib.read_text(pidf):
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=10)
    pid = int(spotlib.read_text(pidf) or "0")
    c.check(p.returncode == 1 and "signal 15" in err and
            not os.path.exists("/proc/%d" % pid),
            "exec: SIGTERM stops the command and fails", err)

    # spotd SIGKILLs a relaunch step that overruns: the command goes too.
    pidf = os.path.join(TMP, "orphan.pid")
    p = subprocess.Popen([SPOTCTL, "relaunch", "--backend", "exec", "--", "sh",
                          "-c", 'echo $$ > "$0"; exec sleep 30', pidf],
                         env=base_env(SPOTD_CHECKPOINT="step-000104"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if spotlib.read_text(pidf):
            break
        time.sleep(0.05)
    p.kill()
    p.wait(10)
    pid = int(spotlib.read_text(pidf) or "0")
    for _ in range(40):
        if not os.path.exists("/proc/%d" % pid):
            break
        time.sleep(0.05)
    c.check(pid > 0 and not os.path.exists("/proc/%d" % pid),
            "exec: the command does not outlive a SIGKILLed spotctl", str(pid))


def test_budget_and_dry_run():
    dl = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 30))
    marker = os.path.join(TMP, "dry-ran")
    cp = relaunch("--backend", "exec", "--dry-run", "--", "touch", marker,
                  env=base_env(SPOTD_DEADLINE=dl, SPOTD_CHECKPOINT="step-7"))
    m = re.search(r"time budget: ([\d.]+) s", cp.stdout)
    c.check(cp.returncode == 0 and "would run: touch " + marker in cp.stdout
            and not os.path.exists(marker),
            "dry run: prints the command, runs nothing", show(cp))
    c.check(m is not None and 22 <= float(m.group(1)) <= 25.5,
            "default budget: until SPOTD_DEADLINE minus 5 s", show(cp))
    cp = relaunch("--backend", "exec", "--dry-run", "--", "true",
                  env=base_env(SPOTD_DEADLINE=""))
    c.check("time budget: 60.0 s" in cp.stdout,
            "default budget without a deadline: 60 s", show(cp))
    cp = relaunch("--backend", "exec", "--dry-run", "--timeout", "7", "--", "true",
                  env=base_env())
    c.check("time budget: 7.0 s" in cp.stdout, "--timeout sets the budget", show(cp))


def test_idempotent():
    count = os.path.join(TMP, "count")
    cmd = ["--backend", "exec", "--", "sh", "-c", 'echo x >> "$0"', count]
    env = base_env(SPOTD_CHECKPOINT="step-000200")
    first = relaunch(*cmd, env=env)
    second = relaunch(*cmd, env=env)
    c.check(first.returncode == 0 and second.returncode == 0 and
            spotlib.read_text(count) == "x\n" and "nothing to do" in second.stderr and
            "relaunched already" in second.stderr,
            "idempotent: a second call for the same preemption does nothing "
            "and says so", show(first) + show(second))
    dry = relaunch("--dry-run", *cmd, env=env)
    c.check("would do nothing" in dry.stdout, "dry run: says it was done", show(dry))
    third = relaunch(*cmd, env=base_env(SPOTD_CHECKPOINT="step-000201"))
    c.check(third.returncode == 0 and spotlib.read_text(count) == "x\nx\n",
            "a new checkpoint is a new preemption: relaunched", show(third))
    markers = os.listdir(STATE)
    mode = stat.S_IMODE(os.stat(STATE).st_mode)
    c.check(all(re.fullmatch(r"relaunch-[0-9a-f]{32}", m) for m in markers) and
            mode == 0o700, "markers: relaunch-<hash> in a 0700 folder",
            "%r %o" % (markers, mode))

    # A failed relaunch can be retried.
    flag = os.path.join(TMP, "ok-now")
    cmd = ["--backend", "exec", "--", "sh", "-c", 'test -e "$0"', flag]
    env = base_env(SPOTD_CHECKPOINT="step-000300")
    a = relaunch(*cmd, env=env)
    open(flag, "w").close()
    b = relaunch(*cmd, env=env)
    c.check(a.returncode == 1 and b.returncode == 0 and "nothing to do" not in b.stderr,
            "a failed relaunch is not recorded: the next call tries again",
            show(a) + show(b))

    cp = relaunch("--backend", "exec", "--retries", "2", "--", "sh", "-c", "exit 4",
                  env=base_env(SPOTD_CHECKPOINT="step-000301"))
    c.check(cp.returncode == 1 and len(re.findall(r"attempt \d/3: 'sh': exit status 4", cp.stderr)) == 3 and
            "retrying in" in cp.stderr, "exec --retries 2: three attempts", show(cp))


# ------------------------------------------------------------- bad input

def test_bad_input():
    cp = relaunch("--backend", "kubernetes", env=base_env())
    c.check(cp.returncode == 2 and "unknown backend 'kubernetes'" in cp.stderr
            and all(b in cp.stderr for b in BACKENDS),
            "unknown backend: usage error naming every backend", show(cp))
    cp = relaunch("--help")
    usage = cp.stdout.split("Backends:")[0]
    c.check(cp.returncode == 0 and all(b in usage for b in BACKENDS) and
            "SPOTD_STORE (the job root" in cp.stdout,
            "relaunch --help: every backend on the usage line, SPOTD_STORE "
            "explained", show(cp))
    cp = relaunch(env=base_env())
    c.check(cp.returncode == 2 and "--backend" in cp.stderr,
            "no backend: usage error", show(cp))
    cp = relaunch("--backend", "exec", env=base_env())
    c.check(cp.returncode == 2 and "needs a command" in cp.stderr,
            "exec without a command: usage error", show(cp))
    cp = relaunch("--backend", "slurm", "--", "x", env=base_env())
    c.check(cp.returncode == 2, "slurm with a command: usage error", show(cp))
    cp = relaunch("--backend", "exec", "--timeout", "soon", "--", "true", env=base_env())
    c.check(cp.returncode == 2 and "--timeout" in cp.stderr, "bad --timeout", show(cp))
    for var in ("SPOTD_JOB", "SPOTD_STORE", "SPOTD_CHECKPOINT", "SPOTD_REASON",
                "SPOTD_DEADLINE"):
        cp = relaunch("--backend", "exec", "--", "true", env=base_env(**{var: None}))
        c.check(cp.returncode == 1 and var + " is not set" in cp.stderr,
                "missing %s: a message naming it, exit 1" % var, show(cp))
    cp = relaunch("--backend", "exec", "--", "true", env=base_env(SPOTD_DEADLINE="soon"))
    c.check(cp.returncode == 1 and "RFC 3339" in cp.stderr, "bad SPOTD_DEADLINE",
            show(cp))
    cp = relaunch("--backend", "slurm", env=base_env())
    c.check(cp.returncode == 1 and "not inside a Slurm job" in cp.stderr,
            "slurm outside a job: clear error", show(cp))
    cp = relaunch("--backend", "slurm",
                  env=base_env(SLURM_JOB_ID="5", PATH=os.path.join(TMP, "nowhere")))
    c.check(cp.returncode == 1 and "scontrol not found" in cp.stderr,
            "slurm without scontrol on PATH: clear error", show(cp))
    cp = relaunch("--backend", "slurm", "--exclude-node",
                  env=base_env(SLURM_JOB_ID="5"))
    c.check(cp.returncode == 1 and "SLURMD_NODENAME" in cp.stderr,
            "--exclude-node without SLURMD_NODENAME: clear error", show(cp))


# ------------------------------------------------- slurm, fake scontrol

FAKE = r'''#!/bin/sh
# fake scontrol: logs its arguments; FAKE_MODE says how to answer
echo "$*" >> "$FAKE_CALLS"
n=$(wc -l < "$FAKE_CALLS")
case $FAKE_MODE in
  busy2) [ "$n" -le 2 ] && { echo "slurm_requeue error: Socket timed out on send/recv operation" >&2; exit 1; } ;;
  down) echo "slurm_requeue error: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
  refuse) echo "Requested operation is presently disabled for job $2" >&2; exit 1 ;;
  pending) echo "Job is pending execution for job $2" >&2; exit 1 ;;
  slow) sleep 1 ;;
esac
if [ "$1" = show ]; then
  echo "JobId=$3 JobName=x UserId=root(0) JobState=RUNNING Requeue=1 Restarts=0 ExcNodeList=nodeA NodeList=node7"
fi
exit 0
'''


def fake_env(mode, calls, **kw):
    bindir = os.path.join(TMP, "fakebin")
    os.makedirs(bindir, exist_ok=True)
    write_exe(os.path.join(bindir, "scontrol"), FAKE)
    if os.path.exists(calls):
        os.unlink(calls)
    return base_env(PATH=bindir + ":/usr/bin:/bin", SLURM_JOB_ID="77",
                    SLURMD_NODENAME="node7", FAKE_MODE=mode, FAKE_CALLS=calls,
                    **kw)


def test_slurm_fake():
    calls = os.path.join(TMP, "calls")
    cp = relaunch("--backend", "slurm",
                  env=fake_env("busy2", calls, SPOTD_CHECKPOINT="s-1"))
    c.check(cp.returncode == 0 and spotlib.read_text(calls) == "requeue 77\n" * 3 and
            cp.stderr.count("Slurm is busy: retrying in") == 2 and
            "attempt 3/6: scontrol requeue 77: ok" in cp.stderr,
            "slurm: a busy controller is retried with backoff", show(cp))

    t0 = time.time()
    cp = relaunch("--backend", "slurm", "--retries", "2",
                  env=fake_env("down", calls, SPOTD_CHECKPOINT="s-2"))
    c.check(cp.returncode == 1 and spotlib.read_text(calls).count("requeue 77") == 3 and
            "did not succeed" in cp.stderr and time.time() - t0 < 30,
            "slurm: gives up after --retries with a clear message", show(cp))

    cp = relaunch("--backend", "slurm",
                  env=fake_env("refuse", calls, SPOTD_CHECKPOINT="s-3"))
    c.check(cp.returncode == 1 and spotlib.read_text(calls) == "requeue 77\n" and
            "Slurm refused 'scontrol requeue 77'" in cp.stderr,
            "slurm: a refusal is not retried, clear message", show(cp))

    cp = relaunch("--backend", "slurm",
                  env=fake_env("pending", calls, SPOTD_CHECKPOINT="s-4"))
    c.check(cp.returncode == 0 and "pending already" in cp.stderr,
            "slurm: a job requeued already counts as requeued", show(cp))

    cp = relaunch("--backend", "slurm", "--hold", "--exclude-node",
                  env=fake_env("ok", calls, SPOTD_CHECKPOINT="s-5"))
    c.check(cp.returncode == 0 and spotlib.read_text(calls).splitlines() == [
        "requeuehold 77", "show job -o 77",
        "update JobId=77 ExcNodeList=nodeA,node7", "release 77"],
        "slurm --exclude-node: requeuehold, add the node to ExcNodeList, release",
        show(cp) + spotlib.read_text(calls))
    cp = relaunch("--backend", "slurm", "--hold",
                  env=fake_env("ok", calls, SPOTD_CHECKPOINT="s-6"))
    c.check(cp.returncode == 0 and spotlib.read_text(calls).splitlines() ==
            ["requeuehold 77", "release 77"], "slurm --hold: requeuehold, release",
            show(cp) + spotlib.read_text(calls))
    cp = relaunch("--backend", "slurm", "--dry-run", "--exclude-node",
                  env=fake_env("ok", calls, SPOTD_CHECKPOINT="s-7"))
    c.check(cp.returncode == 0 and not os.path.exists(calls) and
            "requeuehold 77" in cp.stdout and "release 77" in cp.stdout,
            "slurm --dry-run: prints the scontrol calls, runs none", show(cp))

    # Slurm's SIGTERM to the job right after the requeue is accepted.
    p = subprocess.Popen([SPOTCTL, "relaunch", "--backend", "slurm", "--hold"],
                         env=fake_env("slow", calls, SPOTD_CHECKPOINT="s-8"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(100):
        if spotlib.read_text(calls):
            break
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=20)
    c.check(p.returncode == 0 and "signal 15 ignored" in err and
            spotlib.read_text(calls).splitlines() == ["requeuehold 77", "release 77"],
            "slurm: SIGTERM is ignored until the held job is released", err)


def test_slurm_real():
    if not os.path.exists("/usr/sbin/slurmctld") or os.geteuid() != 0:
        print("skipped: the real-Slurm refusal (no slurm-wlm or not root)")
        return
    sdir = tempfile.mkdtemp(prefix="spotd-slurm-")
    script = spotlib.srcdir_path("tests", "slurm.sh")
    try:
        cp = spotlib.run(["bash", script, "start", sdir], timeout=300)
        if not c.check(cp.returncode == 0, "tests/slurm.sh starts", cp.stderr):
            return
        conf = os.path.join(sdir, "slurm.conf")
        cp = relaunch("--backend", "slurm",
                      env=base_env(SLURM_CONF=conf, SLURM_JOB_ID="999999",
                                   SPOTD_CHECKPOINT="real-1"))
        c.check(cp.returncode == 1 and "Slurm refused" in cp.stderr and
                "Invalid job id" in cp.stderr and cp.stderr.count("attempt 1/") == 2
                and "attempt 2/" not in cp.stderr,
                "real Slurm: requeue of a bogus job id is refused, not retried",
                show(cp))
    finally:
        spotlib.run(["bash", script, "stop", sdir], timeout=120)
        shutil.rmtree(sdir, ignore_errors=True)


# ---------------------------------------------------------------- daemon

TRAINER = r'''
import os, signal, time
want = False
def usr1(s, f):
    global want
    want = True
signal.signal(int(os.environ.get("SPOTD_SIGNAL") or signal.SIGUSR1), usr1)
step = 0
while step < 600:
    time.sleep(0.05)
    step += 1
    if want:
        want = False
        d = os.path.join(os.environ["SPOTD_CKPT_DIR"], "step-%06d" % step)
        os.makedirs(d)
        with open(os.path.join(d, "step"), "w") as f:
            f.write("%d\n" % step)
        open(os.path.join(d, "SPOTD_COMPLETE"), "w").close()
'''


def run_daemon(name, relaunch_cmd, env_extra=None):
    """spotd with a notice 3 s after start; returns (rc, log, root, ckpt)."""
    url, root = spotlib.unique_job("relaunch-" + name)
    store, job = url.rsplit("/", 1)
    work = os.path.join(TMP, "d-" + name)
    os.makedirs(work)
    trainer = os.path.join(work, "trainer.py")
    with open(trainer, "w") as f:
        f.write(TRAINER)
    # (startup includes the store check: a few round trips to Ceph)
    emu = metalib.Emulator("aws", "--notice-after", "3")
    env = base_env(AWS_ENDPOINT_URL=os.environ["SPOT_TEST_S3_ENDPOINT"],
                   PATH=os.path.dirname(SPOTCTL) + ":" + os.environ["PATH"])
    for k in list(env):
        if k.startswith("SPOTD_"):
            del env[k]
    env.update(env_extra or {})
    try:
        cp = subprocess.run(
            [SPOTD, "run", "--job", job, "--store", store, "--provider", "aws",
             "--metadata-url", emu.url, "--poll-interval", "200ms",
             "--interval", "0", "--ckpt-dir", os.path.join(work, "ckpt"),
             "--socket", os.path.join(work, "spotd.sock"),
             "--relaunch", relaunch_cmd, "--", "/usr/bin/python3", trainer],
            env=env, capture_output=True, text=True, timeout=90)
        rc, log = cp.returncode, cp.stderr
    except subprocess.TimeoutExpired as e:
        rc, log = -9, (e.stderr or b"").decode() + "\n(timed out)"
    finally:
        emu.stop()
    m = re.search(r"committed checkpoint name=(\S+)", log)
    return rc, log, root, m.group(1) if m else None


def test_daemon():
    if not os.environ.get("SPOT_TEST_S3_ENDPOINT"):
        print("skipped: the daemon checks (no SPOT_TEST_S3_ENDPOINT)")
        return
    spotlib.store_env()
    rc, log, root, ckpt = run_daemon(
        "noslurm", "spotctl relaunch --backend slurm --state-dir " + STATE,
        {"SLURM_JOB_ID": ""})
    try:
        c.check(ckpt is not None, "daemon: the final checkpoint is committed", log)
        c.check("not inside a Slurm job" in log and
                re.search(r"relaunch step failed with status 1 \(checkpoint "
                          r"\S+ stays committed\)", log) is not None,
                "daemon: its log says the relaunch failed, and why", log)
        if ckpt:
            latest = spotlib.s3_get(root + "LATEST").decode().strip()
            keys = spotlib.s3_keys(root + "checkpoints/" + ckpt + "/")
            c.check(latest == ckpt and any(k.endswith("MANIFEST.json") for k in keys),
                    "daemon: the checkpoint stays committed in the store",
                    "%s %r" % (latest, keys))
        c.check(rc == 75, "daemon: exit 75 after the handled preemption", "rc=%d" % rc)
    finally:
        spotlib.s3_cleanup(root)

    # Slurm SIGTERMs the job's processes (spotd too) as soon as the requeue
    # is accepted: the relaunch step here does the same to spotd.
    kill = ("spotctl relaunch --backend exec --state-dir %s -- sh -c "
            "'kill -TERM $(ps -o ppid= -p $PPID)'" % STATE)
    rc, log, root, ckpt = run_daemon("sigterm", kill)
    try:
        c.check("relaunch step succeeded" in log and rc == 75,
                "daemon: a SIGTERM during the relaunch step keeps the "
                "preemption's outcome (relaunched, exit 75)",
                "rc=%d\n%s" % (rc, log[-3000:]))
    finally:
        spotlib.s3_cleanup(root)


try:
    test_exec()
    test_budget_and_dry_run()
    test_idempotent()
    test_bad_input()
    test_slurm_fake()
    test_slurm_real()
    test_daemon()
finally:
    shutil.rmtree(TMP, ignore_errors=True)
c.finish()
