#!/usr/bin/python3
"""The spotd demo (run it through `bash tools/demo`, which installs and
builds first): a real PyTorch run survives a spot preemption.

  1. a local S3 server (Ceph RGW, tests/s3server.sh) and a fake cloud
     metadata service (`spotd-emulate --provider aws`);
  2. node 1: examples/pytorch/train.py under `spotd run`, in a working
     folder of its own; mid-training the metadata service announces a spot
     interruption; spotd has the trainer checkpoint, compresses and uploads
     the checkpoint, commits it, runs the relaunch step (`spotctl relaunch
     --backend exec`) and stops the trainer;
  3. node 2: a fresh working folder (node 1's checkpoint folder deleted) and
     a fresh metadata service; spotd restores the checkpoint from S3 and the
     trainer finishes the run;
  4. a short report; everything started here is stopped (by pid).

Exit status 0 only when the run ends at the right step and no step
completed before the notice was lost. Every line of every process is kept
in the work folder (--work, default .build-demo/run).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY3 = "/usr/bin/python3"
TRAIN = os.path.join(SRC, "examples", "pytorch", "train.py")
JOB = "demo-llm"

T0 = time.monotonic()
OUT_LOCK = threading.Lock()


# --------------------------------------------------------------- output
def stamp():
    return "[%6.1fs]" % (time.monotonic() - T0)


def say(text=""):
    """Explanations for the reader, between the phases."""
    with OUT_LOCK:
        for line in text.split("\n"):
            print(("         " + line) if line else "", flush=True)


def title(text):
    with OUT_LOCK:
        print("\n%s == %s" % (stamp(), text), flush=True)


def show(who, line):
    with OUT_LOCK:
        print("%s %-16s %s" % (stamp(), who, line), flush=True)


class Failed(Exception):
    pass


# ------------------------------------------------------------ processes
class Proc:
    """A child process whose output lines are timestamped, kept in a log
    file and in memory, and shown through a filter."""

    def __init__(self, argv, who, logdir, show_fn=None, env=None, cwd=None,
                 stdin=subprocess.DEVNULL):
        self.who = who
        self.lines = []  # (time.monotonic(), stream, text)
        self.cv = threading.Condition()
        self.show_fn = show_fn
        self.log = open(os.path.join(logdir, who.replace(" ", "-") + ".log"),
                        "w")
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env, cwd=cwd,
                                  stdin=stdin)
        self.threads = [threading.Thread(target=self._read, args=(s, n),
                                         daemon=True)
                        for s, n in ((self.p.stdout, "out"),
                                     (self.p.stderr, "err"))]
        for t in self.threads:
            t.start()

    def _read(self, pipe, name):
        for raw in pipe:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            t = time.monotonic()
            with self.cv:
                self.lines.append((t, name, line))
                self.log.write("%.3f %s %s\n" % (t - T0, name, line))
                self.log.flush()
                self.cv.notify_all()
            if self.show_fn:
                self.show_fn(name, line)

    def wait_line(self, rx, timeout, stream=None):
        """(time, match) of the first line matching rx, or raises Failed."""
        rx = re.compile(rx)
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                for t, s, line in self.lines:
                    m = rx.search(line)
                    if m and (stream is None or s == stream):
                        return t, m
                left = end - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and
                                 not any(th.is_alive() for th in self.threads)):
                    raise Failed("%s: no line like /%s/ within %d s (see %s)"
                                 % (self.who, rx.pattern, timeout,
                                    self.log.name))
                self.cv.wait(min(left, 0.5))

    def first(self, rx, stream=None):
        """(time, match) of the first line matching rx so far, or None."""
        rx = re.compile(rx)
        with self.cv:
            for t, s, line in self.lines:
                m = rx.search(line)
                if m and (stream is None or s == stream):
                    return t, m
        return None

    def all(self, rx, stream=None):
        rx = re.compile(rx)
        with self.cv:
            return [(t, m) for t, s, line in self.lines
                    for m in [rx.search(line)]
                    if m and (stream is None or s == stream)]

    def wait_exit(self, timeout):
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise Failed("%s did not exit within %d s" % (self.who, timeout))
        for t in self.threads:
            t.join(5)
        return rc

    def running(self):
        return self.p.poll() is None

    def stop(self, sig=signal.SIGTERM, wait=10):
        if self.p.poll() is None:
            try:
                self.p.send_signal(sig)
                self.p.wait(wait)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        for t in self.threads:
            t.join(2)
        self.log.close()


# spotd's log lines worth a newcomer's attention (the rest is in the log
# file); its warnings and errors are always shown.
SPOTD_SHOWN = re.compile(
    r"no committed checkpoint|restored checkpoint|trainer pid=\d+ started|"
    r"interruption notice:|checkpoint requested|checkpoint \S+ is complete|"
    r"uploading|committed checkpoint|relaunch|stopping trainer|"
    r"trainer pid=\d+ (ended|exited)|exit status")
SPOTD_HIDDEN = re.compile(r"state \S+ -> ")
RELAUNCH_HIDDEN = re.compile(r"attempt \d+/\d+: |relaunch done")
SPOTD_PREFIX = re.compile(r"^spotd: (info|notice|debug): ")
LOG_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")  # lib/core/log.c
STEP_RE = re.compile(r"^step (\d+) loss (\S+)$")


def node_filter(node, show_every):
    def f(stream, line):
        if stream == "out":  # the trainer
            m = STEP_RE.match(line)
            if m and int(m.group(1)) % show_every != 0:
                return
            show(node + " trainer", line)
            return
        line = LOG_TIME.sub("", line)  # the demo shows its own clock
        if line.startswith("spotctl relaunch "):
            if not RELAUNCH_HIDDEN.search(line):
                show(node + " relaunch", re.sub(r"^spotctl relaunch \S+: ",
                                                "", line))
            return
        if line.startswith("demo hook: "):
            show(node + " relaunch", line[len("demo hook: "):])
            return
        m = SPOTD_PREFIX.match(line)
        if m is None or (SPOTD_SHOWN.search(line) and
                         not SPOTD_HIDDEN.search(line)):
            line = SPOTD_PREFIX.sub("", line)
            line = re.sub(r"^spotd: ", "", line)  # warnings, errors
            line = re.sub(r"^(relaunch: running) '.*' \(",
                          r"\1 'spotctl relaunch --backend exec -- "
                          r"request-node.sh' (", line)
            show(node + " spotd", line)
    return f


# ----------------------------------------------------------------- demo
class Demo:
    def __init__(self, args):
        self.a = args
        self.work = os.path.abspath(args.work)
        self.procs = []
        self.ceph_dir = os.path.join(self.work, "ceph")
        self.ceph_started = False
        self.env = dict(os.environ)
        self.trainer_pids = []

    # --- infrastructure
    def start_ceph(self):
        title("1. A local S3 server and a fake cloud")
        say("spotd uploads checkpoints to S3. Here S3 is a real Ceph RGW on\n"
            "127.0.0.1 (tests/s3server.sh; a throwaway cluster in %s)."
            % self.ceph_dir)
        self.ceph_started = True
        t = time.monotonic()
        port = [str(self.a.s3_port)] if self.a.s3_port else []
        cp = subprocess.run(["bash", os.path.join(SRC, "tests", "s3server.sh"),
                             "start", self.ceph_dir] + port, capture_output=True,
                            text=True, timeout=300)
        if cp.returncode != 0:
            raise Failed("the S3 server did not start:\n" + cp.stderr[-2000:])
        with open(os.path.join(self.ceph_dir, "env")) as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                if k:
                    self.env[k] = v
        self.endpoint = self.env["SPOT_TEST_S3_ENDPOINT"]
        self.bucket = self.env["SPOT_TEST_S3_BUCKET"]
        self.store = "s3://%s/demo-%d" % (self.bucket, int(time.time()))
        # Never ask the real EC2 metadata service (not loopback).
        self.env["AWS_EC2_METADATA_DISABLED"] = "true"
        self.env["AWS_ENDPOINT_URL"] = self.endpoint
        show("s3", "Ceph RGW ready at %s in %.0f s; checkpoints go to %s/%s"
             % (self.endpoint, time.monotonic() - t, self.store, JOB))

    def start_emulator(self, node):
        p = Proc([self.a.emulate, "--provider", "aws", "--port", "0"],
                 node + " metadata", self.work, env=self.env)
        self.procs.append(p)
        _, m = p.wait_line(r"^listening on (http://127\.\S+)", 15)
        show(node + " metadata", "fake AWS instance metadata at %s" % m.group(1))
        return p, m.group(1)

    def spotd(self, node, workdir, meta_url):
        hook = os.path.join(self.work, "request-node.sh")
        relaunch = "%s relaunch --backend exec --state-dir %s -- /bin/sh %s" % (
            self.a.spotctl, os.path.join(self.work, "relaunch-state"), hook)
        argv = [self.a.spotd, "run", "--job", JOB, "--store", self.store,
                "--provider", "aws", "--metadata-url", meta_url,
                "--interval", "0", "--ckpt-dir", os.path.join(workdir, "ckpt"),
                "--socket", os.path.join(workdir, "spotd.sock"),
                "--relaunch", relaunch, "--",
                PY3, TRAIN, "--model-size", self.a.model_size,
                "--steps", str(self.a.steps), "--log-every", "1"]
        env = dict(self.env)
        p = Proc(argv, node, self.work, node_filter(node, self.a.show_every),
                 env=env, cwd=workdir)
        self.procs.append(p)
        return p

    def write_hook(self):
        """The relaunch step's command (spotctl relaunch --backend exec runs
        it): on a cloud it would ask for a new machine; here it leaves the
        request for this driver, which plays the cloud."""
        self.request = os.path.join(self.work, "node-request.json")
        with open(os.path.join(self.work, "request-node.sh"), "w") as f:
            f.write('#!/bin/sh\n'
                    '# Relaunch hook of the demo: ask "the cloud" (the demo '
                    'driver) for a new node.\n'
                    'set -e\n'
                    'req=%s\n'
                    'printf \'{"job": "%%s", "store": "%%s", "checkpoint": '
                    '"%%s", "reason": "%%s", "deadline": "%%s"}\\n\' '
                    '"$SPOTD_JOB" "$SPOTD_STORE" "$SPOTD_CHECKPOINT" '
                    '"$SPOTD_REASON" "$SPOTD_DEADLINE" >"$req.tmp"\n'
                    'mv "$req.tmp" "$req"\n'
                    'echo "demo hook: new node requested to resume from '
                    '$SPOTD_CHECKPOINT" >&2\n' % self.request)

    # --- phases
    def node1(self):
        title("2. Node 1 trains under spotd")
        say("spotd runs examples/pytorch/train.py (a %s MLP; its checkpoint,\n"
            "weights + Adam state, is about 600 MB) and watches the instance\n"
            "metadata for a spot interruption notice. The trainer prints every\n"
            "step; every %dth is shown here." % (self.a.model_size,
                                                 self.a.show_every))
        wd = os.path.join(self.work, "node1")
        os.makedirs(wd)
        self.emu1, url = self.start_emulator("node 1")
        self.n1 = self.spotd("node 1", wd, url)
        self.n1_dir = wd
        self.n1.wait_line(r"^step %d loss" % self.a.notice_at, 300, "out")

        title("3. The cloud takes the machine back")
        say("The metadata service now announces: this spot instance will be\n"
            "stopped in 2 minutes (AWS's notice). spotd asks the trainer for a\n"
            "checkpoint (through the request file the trainer's helper\n"
            "reads after each step; a signal only for trainers without the\n"
            "helper), which it writes after the current step;\n"
            "spotd compresses it with zstd and uploads it in parallel parts,\n"
            "writes the manifest last (the commit), runs the relaunch step and\n"
            "only then stops the trainer.")
        self.t_notice = time.monotonic()
        req = urllib.request.Request(self.emu1_url() + "/__emulate/notice",
                                     method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                raise Failed("the emulator refused the notice: %d" % r.status)
        show("node 1 metadata", "spot interruption notice published "
             "(instance-action: terminate in 120 s)")
        rc = self.n1.wait_exit(300)
        show("node 1", "spotd exited with status %d (75 = preempted, resume "
             "elsewhere)" % rc)
        if rc != 75:
            raise Failed("node 1's spotd exited %d, not 75" % rc)
        self.emu1.stop()

    def emu1_url(self):
        return self.emu1.first(r"^listening on (\S+)")[1].group(1)

    def node2(self):
        title("4. A new machine resumes")
        if not os.path.exists(self.request):
            raise Failed("the relaunch step did not ask for a new node")
        with open(self.request) as f:
            req = json.load(f)
        shutil.rmtree(os.path.join(self.n1_dir, "ckpt"))
        say("The relaunch step asked for a new node to resume from %s.\n"
            "Node 1 is gone, with its disk: its checkpoint folder has been\n"
            "deleted. Node 2 starts in an empty folder with its own metadata\n"
            "service; spotd restores the newest committed checkpoint from S3\n"
            "before it starts the same command, which resumes from it."
            % req["checkpoint"])
        wd = os.path.join(self.work, "node2")
        os.makedirs(wd)
        self.emu2, url = self.start_emulator("node 2")
        self.t_node2 = time.monotonic()
        self.n2 = self.spotd("node 2", wd, url)
        self.n2_dir = wd
        self.req = req
        rc = self.n2.wait_exit(900)
        show("node 2", "spotd exited with status %d (the trainer's)" % rc)
        self.emu2.stop()
        if rc != 0:
            raise Failed("node 2's spotd exited %d, not 0" % rc)

    def store_listing(self):
        cp = subprocess.run([self.a.spotctl, "list", "%s/%s" % (self.store,
                                                               JOB)],
                            capture_output=True, text=True, env=self.env,
                            timeout=60)
        return cp

    # --- report
    def report(self):
        title("5. Report")
        steps = self.a.steps
        n1, n2 = self.n1, self.n2
        commit = r"committed checkpoint name=(\S+) files=\d+ raw=(\d+) " \
                 r"stored=(\d+) ratio=(\S+) in (\S+) s"
        t_req, _ = n1.wait_line(r"checkpoint requested \(aws-spot-terminate\)",
                                1)
        t_seen, _ = n1.wait_line(r"interruption notice:", 1)
        t_saved, saved = n1.wait_line(
            r"^saved (\S+) at step (\d+) \(signal, .* in (\S+) s\)", 1, "out")
        ck_name, ck_step = saved.group(1), int(saved.group(2))
        t_save0 = max(t_seen, t_saved - float(saved.group(3)))
        t_commit, cm = n1.wait_line(commit, 1)
        if cm.group(1) != ck_name:
            raise Failed("node 1 committed %s, not %s" % (cm.group(1),
                                                          ck_name))
        before = max([int(m.group(1)) for t, m in n1.all(STEP_RE.pattern,
                                                          "out")
                      if t <= t_req] or [0])
        n1_last = max(int(m.group(1)) for _, m in n1.all(STEP_RE.pattern,
                                                           "out"))
        t_res, res = n2.wait_line(r"^resumed from (\S+) at step (\d+)", 1,
                                  "out")
        _, rst = n2.wait_line(r"restored checkpoint (\S+) into \S+ \((\d+) "
                              r"bytes in (\S+) s\)", 1)
        _, done = n2.wait_line(r"^done at step (\d+)", 1, "out")
        final = "step-%06d" % steps
        _, fcm = n2.wait_line(r"committed checkpoint name=%s " % final, 1)
        n2_first = min(int(m.group(1)) for _, m in n2.all(STEP_RE.pattern,
                                                           "out"))
        raw, stored = int(cm.group(2)), int(cm.group(3))

        lost = before - ck_step if ck_step < before else 0
        redone = n1_last - ck_step
        rows = [
            ("training steps", "%d of %d (node 1: 1-%d, node 2: %d-%d)" % (
                int(done.group(1)), steps, n1_last, n2_first,
                int(done.group(1)))),
            ("steps lost", "%d: spotd signalled the trainer after step %d; "
             "its checkpoint %s holds steps 1-%d" % (lost, before, ck_name,
                                                     ck_step)),
            ("steps redone", "%d (node 1 kept training while its checkpoint "
             "uploaded)" % redone),
            ("notice to durable", "%.1f s (notice seen %.1f s, step in flight "
             "%.1f s, save %.1f s, compress + upload + commit %.1f s)" % (
                 t_commit - self.t_notice, t_seen - self.t_notice,
                 t_save0 - t_seen, t_saved - t_save0, t_commit - t_saved)),
            ("checkpoint", "%s: %.1f MB raw, %.1f MB stored in S3 (ratio %s)"
             % (ck_name, raw / 1e6, stored / 1e6, cm.group(4))),
            ("time to resume", "%.1f s from node 2's start to training "
             "(restore of %.1f MB from S3: %s s)" % (
                 t_res - self.t_node2, int(rst.group(2)) / 1e6,
                 rst.group(3))),
        ]
        for k, v in rows:
            show("report", "%-18s %s" % (k, v))
        ls = self.store_listing()
        say("\nThe store (spotctl list %s/%s):" % (self.store, JOB))
        say(ls.stdout.rstrip())

        problems = self.history(lost)
        if int(done.group(1)) != steps:
            problems.append("the run ended at step %s, not %d"
                            % (done.group(1), steps))
        if lost:
            problems.append("%d completed step(s) lost" % lost)
        if res.group(1) != ck_name or int(res.group(2)) != ck_step or \
                self.req.get("checkpoint") != ck_name:
            problems.append("node 2 resumed from %s at step %s, not from %s"
                            % (res.group(1), res.group(2), ck_name))
        if n2_first != ck_step + 1:
            problems.append("node 2's first step is %d, not %d"
                            % (n2_first, ck_step + 1))
        if fcm is None or ("* = LATEST (%s)" % final) not in ls.stdout:
            problems.append("the final %s is not the store's LATEST" % final)
        if problems:
            raise Failed("; ".join(problems))
        say("\nThe run was preempted once and finished on another machine "
            "with no\ncompleted step lost. Logs: %s" % self.work)

    def history(self, lost):
        """`spotctl history` of the job (what spotd recorded in the store)
        and its timeline picture; the problems found in it."""
        url = "%s/%s" % (self.store, JOB)
        png = os.path.join(self.work, "timeline.png")
        say("\nThe job's history (spotctl history %s --plot %s):" % (url, png))
        cp = subprocess.run([self.a.spotctl, "history", url, "--plot", png],
                            capture_output=True, text=True, env=self.env,
                            timeout=60)
        say((cp.stdout + cp.stderr).rstrip())
        js = subprocess.run([self.a.spotctl, "history", url, "--json"],
                            capture_output=True, text=True, env=self.env,
                            timeout=60)
        try:
            s = json.loads(js.stdout)["summary"]
        except (ValueError, KeyError):
            return ["spotctl history --json failed: %s" % js.stderr.strip()]
        problems = []
        if s.get("runs") != 2 or s.get("preemptions") != 1:
            problems.append("the history shows %s runs, %s preemptions, not "
                            "2 and 1" % (s.get("runs"), s.get("preemptions")))
        if s.get("lost_steps") != lost:
            problems.append("the history says %s steps lost, the demo "
                            "measured %d" % (s.get("lost_steps"), lost))
        if cp.returncode != 0 or not os.path.exists(png):
            problems.append("spotctl history --plot failed")
        return problems

    # --- cleanup
    def stop_all(self):
        for p in reversed(self.procs):
            if p.running():
                # spotd: a first SIGTERM asks for a final checkpoint, a
                # second stops at once.
                p.p.send_signal(signal.SIGTERM)
                time.sleep(0.2)
                p.stop(signal.SIGTERM, 10)
            else:
                p.stop()
        # Trainers spotd started (each in its own session), should spotd
        # have been killed before it could stop them.
        for p in self.procs:
            for _, m in p.all(r"trainer pid=(\d+) started"):
                pid = int(m.group(1))
                try:
                    with open("/proc/%d/cmdline" % pid, "rb") as f:
                        if TRAIN.encode() in f.read():
                            os.killpg(pid, signal.SIGKILL)
                except (OSError, ProcessLookupError):
                    pass
        if self.ceph_started:
            subprocess.run(["bash", os.path.join(SRC, "tests", "s3server.sh"),
                            "stop", self.ceph_dir], capture_output=True,
                           timeout=120)

    def run(self):
        if os.path.exists(self.work):
            if os.path.isdir(self.ceph_dir):  # an interrupted earlier run's
                subprocess.run(["bash", os.path.join(SRC, "tests",
                                                     "s3server.sh"),
                                "stop", self.ceph_dir], capture_output=True,
                               timeout=120)
            shutil.rmtree(self.work)
        os.makedirs(self.work)
        self.write_hook()
        print("spotd demo: a PyTorch training run on a spot machine is "
              "preempted\nand resumes on another one. About 2-3 minutes.",
              flush=True)
        self.start_ceph()
        self.node1()
        self.node2()
        self.report()


def main():
    ap = argparse.ArgumentParser(description="the spotd demo (see the "
                                 "module docstring)")
    ap.add_argument("--spotd", required=True)
    ap.add_argument("--spotctl", required=True)
    ap.add_argument("--emulate", required=True, help="spotd-emulate")
    ap.add_argument("--work", default=os.path.join(SRC, ".build-demo", "run"))
    ap.add_argument("--model-size", default="large")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--notice-at", type=int, default=15,
                    help="publish the notice once this step is done")
    ap.add_argument("--show-every", type=int, default=5)
    ap.add_argument("--s3-port", type=int, default=0,
                    help="the local S3 server's port (default: 7480 if "
                    "free, else another free port)")
    a = ap.parse_args()
    if not 0 < a.notice_at < a.steps - 5:
        ap.error("--notice-at must be between 1 and --steps - 5")

    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)

    d = Demo(a)
    rc = 1
    try:
        d.run()
        rc = 0
    except Failed as e:
        print("\n%s demo FAILED: %s" % (stamp(), e), flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
        rc = 130
    finally:
        print("%s stopping everything the demo started" % stamp(), flush=True)
        d.stop_all()
        print("%s done (%s)" % (stamp(), "ok" if rc == 0 else "exit %d" % rc),
              flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
