"""The Kubernetes manifests' container, run as the manifests say, outside
Kubernetes (no cluster here): the `command`, `args` and `env` of the
`train` container are read from deploy/kubernetes/*.yaml and run as they
are, with only what a cluster would provide put in by the test:

- each volumeMount's path moved into a temporary folder (the ConfigMap's
  spotd.conf written there, its store set to the test's and its provider
  to none or to a metadata emulator);
- `$(VAR)` expanded from the container's env, as the kubelet does;
- JOB_COMPLETION_INDEX set as the Job controller would;
- the Secret's keys from the test's own credentials;
- the trainer after `--` replaced by fake_trainer.py.

1. Single-node pod: ready (the readinessProbe's command exits 0), the
   metrics file on its emptyDir, a checkpoint, then SIGTERM: the final
   checkpoint is committed and spotd exits 75 within
   terminationGracePeriodSeconds, an exit code the podFailurePolicy
   ignores (a new pod, not counted).
2. The next pod restores it; given less SIGTERM grace than its last
   checkpoint took, spotd says so in one line and still exits 75.
3. A bad config: exit 78, which the podFailurePolicy fails the Job on.
4. The Indexed Job, two pods: rank and node count from the environment
   only; both join one run through the store (no --run-id); a metadata
   notice on pod 0 preempts both (exit 75 each, one commit); the next
   run (both pods join the next run) restores it on both ranks.
5. The Indexed Job with the manifest's torchrun (2 nodes, one gloo worker
   each, Debian's torch): a node drain (SIGTERM) of pod 1 only. Its spotd
   publishes the drain to the other rank as a notice is published; both
   workers save at the same step, the job commits one checkpoint and both
   spotd exit 75 (pod 0's trainer dies with its peer, which is no
   failure). Both pods start again and resume from that checkpoint, and the
   history shows one preemption and 0 steps lost."""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import json

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

K8S = sl.srcdir_path("deploy", "kubernetes")
DDP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_trainer.py")


def load(name):
    with open(os.path.join(K8S, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def values():
    with open(os.path.join(K8S, "values.yaml")) as f:
        return yaml.safe_load(f)


def job_of(name):
    return [d for d in load(name) if d["kind"] == "Job"][0]


def train_container(job):
    return [c for c in job["spec"]["template"]["spec"]["containers"]
            if c["name"] == "train"][0]


def policy_codes(job, action):
    out = []
    for r in job["spec"]["podFailurePolicy"]["rules"]:
        if r["action"] == action and "onExitCodes" in r:
            out += r["onExitCodes"]["values"]
    return out


def expand(s, env):
    """The kubelet's $(VAR) expansion: defined names only, $$ is $."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)


def config_text(extra):
    cm = [d for d in load("config.yaml") if d["kind"] == "ConfigMap"][0]
    return cm["data"]["spotd.conf"], extra


class Pod(sl.Daemon):
    """The train container of JOB (a manifest file) as one process."""

    def __init__(self, workdir, manifest, store, job_id, conf_extra,
                 trainer, downward, env_over=None, cmd=None):
        self.job_obj = job_of(manifest)
        c = train_container(self.job_obj)
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        mounts = {}
        for m in c["volumeMounts"]:
            mounts[m["mountPath"]] = os.path.join(workdir, m["name"])
            os.makedirs(mounts[m["mountPath"]], exist_ok=True)
        self.mounts = mounts
        # The ConfigMap, with the test's store and metadata service.
        conf, _ = config_text(conf_extra)
        conf = re.sub(r"(?m)^store = .*$", "store = " + store, conf)
        conf = re.sub(r"(?m)^job = .*$", "job = " + job_id, conf)
        conf += "".join("%s = %s\n" % kv for kv in conf_extra.items())
        with open(os.path.join(mounts["/etc/spotd"], "spotd.conf"), "w") as f:
            f.write(conf)
        # The container's env, as the kubelet builds it.
        env = dict(os.environ)
        self.manifest_env = {}
        for e in c.get("env", []):
            if "value" in e:
                v = e["value"]
            elif "fieldRef" in e["valueFrom"]:
                v = downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in e["valueFrom"]:
                v = os.environ.get(e["valueFrom"]["secretKeyRef"]["key"])
                if v is None:
                    continue  # optional: true, no Secret
            else:
                raise RuntimeError("unknown env source %r" % e)
            env[e["name"]] = expand(v, env)
            self.manifest_env[e["name"]] = env[e["name"]]
        if "JOB_COMPLETION_INDEX" in downward:
            env["JOB_COMPLETION_INDEX"] = downward["JOB_COMPLETION_INDEX"]
        env.update(env_over or {})
        self.env = env
        args = [self.remap(expand(a, env)) for a in c["args"]]
        cut = args.index("--")
        self.trainer_args = args[cut + 1:]
        self.trainer_log = os.path.join(workdir, "trainer.log")
        if os.path.exists(self.trainer_log):
            os.unlink(self.trainer_log)
        self.socket = self.remap("/run/spotd/spotd.sock")
        self.metrics = self.remap("/var/run/spotd-metrics/spotd.prom")
        self.probe = [self.remap(a) for a in
                      c["readinessProbe"]["exec"]["command"]]
        self.probe[0] = sl.spotctl_exe()
        self.job, self.store = job_id, store
        if cmd is None:
            cmd = [sl.PY3, sl.FAKE_TRAINER, "--log", self.trainer_log] + \
                [str(a) for a in trainer]
        else:
            cmd = cmd(self.trainer_args)
        argv = [sl.spotd_exe()] + args[:cut + 1] + cmd
        self.argv = argv
        self.t0 = time.time()
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env)
        sl._STARTED.append(self.p)
        self.pid = self.p.pid
        self.err = sl.LineLog(self.p.stderr, "[pod %s] " % os.path.basename(workdir))
        self.out = sl.LineLog(self.p.stdout, "[stdout] ")
        self.rc = None

    def remap(self, a):
        for mp in sorted(self.mounts, key=len, reverse=True):
            if a == mp or a.startswith(mp + "/"):
                return self.mounts[mp] + a[len(mp):]
        return a

    def ready(self):
        return sl.run(self.probe, timeout=20).returncode == 0


def single_node(c, wd, store):
    v = values()
    job = job_of("train-job.yaml")
    grace = job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    ignore, fail = policy_codes(job, "Ignore"), policy_codes(job, "FailJob")
    job_id = "llama-ft"
    extra = {"provider": "none"}
    # 1: SIGTERM with the grace period
    p = Pod(os.path.join(wd, "pod-a"), "train-job.yaml", store, job_id,
            extra, ["--step-sleep", 0.2], {})
    c.check(p.wait_event("start", 60) is not None, "pod: the trainer started")
    c.check(p.manifest_env.get("SPOTD_TERMINATION_GRACE") ==
            str(v["spotd_grace_s"]), "pod: SPOTD_TERMINATION_GRACE from the manifest")
    ok = False
    for _ in range(40):
        if p.ready():
            ok = True
            break
        time.sleep(0.5)
    c.check(ok, "pod: the readinessProbe command exits 0: %s" % " ".join(p.probe))
    cp = p.spotctl("checkpoint", "--wait", "--timeout", 60, timeout=90)
    c.check(cp.returncode == 0, "pod: a checkpoint is committed", cp.stderr)
    seen = False
    for _ in range(60):  # rewritten every 15 s; the first at start
        if os.path.exists(p.metrics):
            seen = True
            break
        time.sleep(0.5)
    c.check(seen, "pod: the metrics file on its emptyDir (%s)" % p.metrics)
    if seen:
        with open(p.metrics) as f:
            text = f.read()
        c.check("spotd_" in text, "pod: the metrics file holds spotd's metrics")
    p.send(signal.SIGTERM)
    rc = p.wait_exit(grace)
    c.check(p.err.matching(r"SIGTERM grace: %d s" % v["spotd_grace_s"]) != [],
            "pod: spotd drains with the pod's grace")
    c.check(rc == 75 and 75 in ignore,
            "pod: SIGTERM -> final checkpoint -> exit %s within %d s; the "
            "podFailurePolicy ignores %s" % (rc, grace, ignore))
    final = p.err.matching(r"preempted: the final checkpoint \S+ is committed")
    c.check(final != [], "pod: the final checkpoint is committed",
            p.err.text()[-600:])

    # 2: the next pod restores; too little grace is said in one line
    q = Pod(os.path.join(wd, "pod-b"), "train-job.yaml", store, job_id,
            extra, ["--step-sleep", 0.2, "--save-delay", 3], {},
            env_over={"SPOTD_TERMINATION_GRACE": "1"})
    st = q.wait_event("start", 60)
    c.check(st is not None and st.get("env", {}).get("SPOTD_RESUME_DIR"),
            "next pod: the trainer resumes from the restored checkpoint",
            repr(st))
    cp = q.spotctl("checkpoint", "--wait", "--timeout", 60, timeout=90)
    c.check(cp.returncode == 0, "next pod: a checkpoint (3 s to save)", cp.stderr)
    q.send(signal.SIGTERM)
    rc = q.wait_exit(grace)
    warn = q.err.matching(r"the final checkpoint needs about [0-9.]+ s but "
                          r"the deadline is in [0-9.]+ s")
    c.check(warn != [], "next pod: one line says the grace is shorter than "
            "the last checkpoint took", repr(warn))
    c.check(rc == 75, "next pod: exit %s (75: the earlier checkpoint is "
            "kept)" % rc)

    # 3: a bad config fails the Job
    b = Pod(os.path.join(wd, "pod-c"), "train-job.yaml", store, job_id,
            {"provider": "none", "keep": "many"}, [], {})
    rc = b.wait_exit(60)
    c.check(rc == 78 and 78 in fail,
            "bad config: exit %s, FailJob on %s" % (rc, fail))


def indexed(c, wd, store):
    job = job_of("train-indexed.yaml")
    n = job["spec"]["completions"]
    job_id = "train-ddp"
    grace = job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    slow = ["--step-sleep", 4.0]

    def joined(pods, run):
        got = []
        for p in pods:
            line = p.err.wait(r"joined run r\d+", 60)[1] or ""
            m = re.search(r"joined run (r\d+)", line)
            got.append(m.group(1) if m else None)
        c.check(got == [run] * len(pods),
                "indexed: the pods agree on run %s through the store" % run,
                repr(got))

    def run(tr0, tr1):
        emus = [sl.EmulatorProc("aws") for _ in range(n)]
        pods = []
        for k, tr in enumerate((tr0, tr1)):
            pods.append(Pod(os.path.join(wd, "idx-%d" % k), "train-indexed.yaml",
                            store, job_id,
                            {"provider": "aws", "metadata-url": emus[k].url,
                             "poll-interval": "500ms"}, tr,
                            {"JOB_COMPLETION_INDEX": str(k)}))
        return pods, emus

    log0 = os.path.join(wd, "idx-0", "trainer.log")
    pods, emus = run(slow, slow + ["--die-with", log0 + ":signal:1.5"])
    c.check(n == 2, "indexed: completions %d" % n)
    t = pods[1].trainer_args
    c.check("--nnodes" in t and t[t.index("--nnodes") + 1] == str(n) and
            t[t.index("--node-rank") + 1] == "1",
            "indexed: the trainer's command gets the node count and index "
            "(%s)" % " ".join(t))
    ok = all(p.wait_event("start", 60) for p in pods)
    c.check(ok, "indexed: both trainers started")
    joined(pods, "r1")
    for k, p in enumerate(pods):
        st = p.events("start")
        env = st[0]["env"] if st else {}
        c.check(env.get("SPOTD_RANK") == str(k) and env.get("SPOTD_NRANKS") == str(n),
                "indexed: pod %d is rank %d of %d from JOB_COMPLETION_INDEX "
                "and SPOTD_NRANKS" % (k, k, n), repr(env))
    before = sl.committed(store_prefix(store, job_id))
    # same step before the notice (they save the same checkpoint name)
    end = time.time() + 30
    while time.time() < end:
        a = [e["step"] for e in pods[0].events("step")]
        b = [e["step"] for e in pods[1].events("step")]
        if a and b and a[-1] == b[-1]:
            break
        time.sleep(0.05)
    emus[0].control("notice", deadline=60)
    rcs = [p.wait_exit(grace) for p in pods]
    c.check(rcs == [75, 75], "indexed: a notice on pod 0 ends both pods "
            "with 75 (ignored by the podFailurePolicy): %s" % rcs)
    new = [x for x in sl.committed(store_prefix(store, job_id)) if x not in before]
    c.check(len(new) == 1, "indexed: one commit for the job %s" % new)
    for e in emus:
        e.stop()

    # the next run: a new pod per index
    pods, emus = run(["--step-sleep", 0.2], ["--step-sleep", 0.2])
    joined(pods, "r2")
    for k, p in enumerate(pods):
        st = p.wait_event("start", 90)
        env = (st or {}).get("env", {})
        rd = env.get("SPOTD_RESUME_DIR", "")
        c.check(new != [] and new[0] in rd and rd.endswith("rank-%d" % k),
                "indexed: the next pod %d restores %s (its rank's files)" %
                (k, new[0] if new else None), repr(env))
    # A run id shared with the run before would drain both at once on its
    # notice: a few fan-out polls (every second at most) must see none.
    steps = [len(p.events("step")) for p in pods]
    end = time.time() + 30
    while time.time() < end and any(
            len(p.events("step")) < n0 + 10 for p, n0 in zip(pods, steps)):
        time.sleep(0.2)
    c.check(all(p.running() for p in pods) and
            all(p.err.matching(r"job-wide notice from") == [] for p in pods),
            "indexed: the next run does not see the previous run's notice")
    for p in pods:
        p.send(signal.SIGKILL)
        p.wait_exit(30)
    for e in emus:
        e.stop()


def torchrun_of(manifest_args, port, log):
    """The manifest's trainer command for this machine: one CPU worker per
    node, the rendezvous on a free loopback port, ddp_trainer.py for
    train_ddp.py; Debian's torchrun (torch 1.13) spells the options with
    '_' only."""
    out, i = [], 0
    while i < len(manifest_args):
        a = manifest_args[i]
        v = manifest_args[i + 1] if i + 1 < len(manifest_args) else None
        if a == "torchrun":
            out.append("/usr/bin/torchrun")
        elif a == "--nproc-per-node":
            out += ["--nproc_per_node", "1"]
            i += 1
        elif a == "--master-addr":
            out += ["--master_addr", "127.0.0.1"]
            i += 1
        elif a == "--master-port":
            out += ["--master_port", str(port)]
            i += 1
        elif a.startswith("--") and v is not None:
            out += [a.replace("-", "_").replace("__", "--", 1), v]
            i += 1
        elif a == "train_ddp.py":
            # Debian's torchrun needs --redirects (its default fails)
            out += ["--redirects", "1", "--tee", "1", "--log_dir",
                    log + ".tlogs", DDP, log, "--report"]
        else:
            out.append(a)
        i += 1
    return out


def ddp_events(log, rank, ev):
    return [e for e in sl.read_jsonl("%s.rank-%d" % (log, rank))
            if e["ev"] == ev]


def drain_torchrun(c, wd, store):
    job = job_of("train-indexed.yaml")
    n = job["spec"]["completions"]
    grace = job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    job_id = "train-ddp-drain"
    logs = [os.path.join(wd, "ddp-%d.log" % i) for i in range(2)]
    conf = {"provider": "none", "poll-interval": "500ms"}

    def run(ignored):  # ignored: the Job's count of ignored failures
        port = sl.free_port()
        pods = []
        for k in range(n):
            down = {"JOB_COMPLETION_INDEX": str(k)}
            pods.append(Pod(os.path.join(wd, "drain-%d-%d" % (ignored, k)),
                            "train-indexed.yaml", store, job_id, conf, [],
                            down, env_over={"SPOTD_TERMINATION_GRACE": "30"},
                            cmd=lambda t: torchrun_of(t, port, logs[ignored])))
        return pods

    def started(log, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            s = [ddp_events(log, r, "start") for r in range(n)]
            if all(s) and all(len(ddp_events(log, r, "step")) >= 3
                              for r in range(n)):
                return [x[-1] for x in s]
            time.sleep(0.2)
        return None

    pods = run(0)
    c.check(started(logs[0]) is not None, "drain: torchrun on both pods, one gloo "
            "worker each, trains")
    before = sl.committed(store_prefix(store, job_id))
    pods[1].send(signal.SIGTERM)  # the node of pod 1 is drained
    rcs = [p.wait_exit(grace) for p in pods]
    c.check(rcs == [75, 75], "drain: SIGTERM on pod 1 only ends both pods "
            "with 75 (the podFailurePolicy ignores it): %s" % rcs,
            pods[0].err.text()[-1500:])
    c.check(pods[0].err.matching(r"job-wide notice from rank 1: sigterm") != [],
            "drain: pod 0 drains on pod 1's published SIGTERM")
    dl = [re.findall(r"(?:drain deadline|interruption notice: sigterm "
                     r"\(terminate\) deadline) (\d{4}-[0-9T:.-]+Z)", p.err.text())
          for p in pods]
    c.check(dl[0] != [] and dl[0] == dl[1],
            "drain: pod 0's deadline is pod 1's: %s" % dl)
    new = [x for x in sl.committed(store_prefix(store, job_id)) if x not in before]
    c.check(len(new) == 1, "drain: one commit for the job %s" % new)
    saved = [[e["step"] for e in ddp_events(logs[0], r, "checkpoint")]
             for r in range(n)]
    c.check(all(len(x) == 1 for x in saved) and saved[0] == saved[1] and
            new == ["step-%06d" % saved[0][0]],
            "drain: both workers saved once, at the same step: %s" % saved)

    # Both pods again: they join the next run through the store.
    pods = run(1)
    st = started(logs[1])
    step = saved[0][0] if saved[0] else None
    c.check(st is not None and [e.get("step") for e in st] == [step] * n,
            "drain: both workers resume from step %s: %s" % (step, st))
    cp = sl.spotctl("history", "%s/%s" % (store, job_id), "--json")
    j = json.loads(cp.stdout) if cp.returncode == 0 else {}
    s = j.get("summary", {})
    runs = j.get("runs", [])
    c.check(s.get("preemptions") == 1 and runs and
            runs[0].get("outcome") == "preempted" and
            runs[0].get("lost_steps") == 0 and s.get("lost_steps") == 0 and
            s.get("crashes") == 0,
            "drain: history shows one preemption, 0 steps lost",
            cp.stdout[:1500] + cp.stderr)
    for p in pods:
        p.send(signal.SIGKILL)
        p.wait_exit(30)


def store_prefix(store, job_id):
    m = re.match(r"s3://[^/]+/(.*)$", store)
    return m.group(1).rstrip("/") + "/" + job_id + "/"


def main():
    sl.daemon_env()
    c = sl.Checks()
    _, bucket = sl.daemon_env()
    prefix = "itest-k8s/%d-%d" % (os.getpid(), int(time.time() * 1000))
    store = "s3://%s/%s" % (bucket, prefix)
    with tempfile.TemporaryDirectory(prefix="spotd-k8s-") as wd:
        try:
            single_node(c, wd, store)
            indexed(c, wd, store)
            if os.path.exists("/usr/bin/torchrun"):
                drain_torchrun(c, wd, store)
        finally:
            sl.kill_started()
            sl.s3_cleanup(prefix + "/")
    c.finish()


if __name__ == "__main__":
    main()
