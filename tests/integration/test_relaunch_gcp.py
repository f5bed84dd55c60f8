#!/usr/bin/python3
"""spotctl relaunch --backend gcp (README "Relaunch on AWS / GCP") against
`spotd-emulate
--provider gcp` (metadata server + the compute v1 API; bearer tokens the
metadata server issued are required), the store on the real Ceph.

A full cycle: spotd runs the fake trainer on "this VM" (us-central1-a);
the emulator publishes a preemption; spotd checkpoints, commits to Ceph and
runs `spotctl relaunch --backend gcp` with the zones us-central1-a,b,c:
a is the reclaimed zone (skipped), b stocks out (the zone operation ends
with ZONE_RESOURCE_POOL_EXHAUSTED), so exactly one SPOT VM starts in c from
the template, its metadata holding the template's items plus spotd-job and
spotd-store. The emulator "boots" it and a second spotd with --job-from
gcp-metadata (no --job, no --store) restores the checkpoint and resumes.

Then: a doubled relaunch creates nothing (record; and with --no-record the
requestId replays the operation, the name exists); every zone stocked out,
permission denied, a missing template, an unreachable API are one line
each; rate limiting is retried; the token never shows in the output.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

ZONES = "us-central1-a,us-central1-b,us-central1-c"


def gce_state(emu):
    with urllib.request.urlopen(emu.url + "/__emulate/gce/state",
                                timeout=10) as r:
        return json.loads(r.read().decode())


def relaunch_cmd(emu, *extra):
    return [sl.spotctl_exe(), "relaunch", "--backend", "gcp",
            "--instance-template", "spotd-template", "--zones", ZONES,
            "--compute-endpoint", emu.url, "--metadata-url", emu.url,
            "--timeout", "30"] + list(extra)


def run_relaunch(emu, env, *extra):
    full = dict(os.environ)
    full.update(env)
    return subprocess.run(relaunch_cmd(emu, *extra), env=full,
                          capture_output=True, text=True, timeout=60)


def one_line(c, cp, what, pattern):
    errs = [l for l in cp.stderr.splitlines() if l.startswith("spotctl: ")]
    c.check(cp.returncode == 1 and len(errs) == 1 and
            re.search(pattern, errs[0]) is not None,
            what + ": exit 1 and one line: %s" % (errs[0] if errs else "-"),
            "rc=%d\n%s" % (cp.returncode, cp.stderr))


def cycle(c, tmp, emu, store, job, prefix):
    wd1 = os.path.join(tmp, "node1")
    d1 = sl.Daemon(wd1, store, job, provider="gcp", metadata_url=emu.url,
                   args=["--relaunch", " ".join(relaunch_cmd(emu))], grace=5,
                   poll_interval="200ms", trainer=["--step-sleep", 0.05])
    c.check(d1.wait_event("step", 20) is not None, "node1: the trainer runs")
    time.sleep(0.5)
    t_notice = time.time()
    emu.control("notice", deadline=30)
    rc = d1.wait_exit(60)
    c.check(rc == 75, "node1: spotd exits 75 after the preemption",
            "rc=%s\n%s" % (rc, d1.log()))
    made = d1.events("checkpoint")
    name = made[-1]["name"] if made else "?"
    c.check(sl.latest(prefix) == name, "node1: %s committed and LATEST" % name)
    st = gce_state(emu)
    inst = st["instances"]
    inserts = [r for r in st["requests"] if r["method"] == "POST"]
    c.check(len(inst) == 1, "exactly one new VM (%d)" % len(inst),
            json.dumps(st)[:2000])
    c.check([r["zone"] for r in inserts] == ["us-central1-b", "us-central1-c"]
            and [r["result"] for r in inserts] == ["no-capacity", "launched"],
            "reclaimed us-central1-a skipped, b stocked out (operation "
            "error), c launched",
            json.dumps(inserts)[:2000])
    if len(inst) != 1:
        print(d1.log())
        return
    new = inst[0]
    keys = [i["key"] for i in inserts[-1]["metadata"]]
    c.check(new["provisioning"] == "SPOT" and
            new["metadata"].get("spotd-job") == job and
            new["metadata"].get("spotd-store") == store and
            "startup-script" in keys,
            "the VM is SPOT, its metadata has the template's items and "
            "spotd-job/spotd-store", json.dumps(new))
    launched = d1.err.time_of(r"spotctl relaunch .*: launched spotd-")
    committed = d1.err.time_of(r"committed checkpoint name=" + name)
    env = {"SPOTD_JOB": job, "SPOTD_STORE": "%s/%s" % (store, job),
           "SPOTD_CHECKPOINT": name, "SPOTD_REASON": "gcp-preempted",
           "SPOTD_DEADLINE": ""}
    cp = run_relaunch(emu, env)
    c.check(cp.returncode == 0 and "nothing to do" in cp.stderr and
            len(gce_state(emu)["instances"]) == 1,
            "a doubled relaunch finds the record and creates nothing",
            cp.stderr)
    cp = run_relaunch(emu, env, "--no-record")
    st = gce_state(emu)
    results = [r.get("result") for r in st["requests"] if r["method"] == "POST"]
    c.check(cp.returncode == 0 and len(st["instances"]) == 1 and
            results[-2:] == ["replayed", "replayed"],
            "--no-record: the same requestIds replay the operations: still "
            "one VM", cp.stderr + repr(results))

    emu.control("gce/boot", instance=new["name"])
    t_boot = time.time()
    wd2 = os.path.join(tmp, "node2")
    os.makedirs(wd2)
    log2 = os.path.join(wd2, "trainer.log")
    argv = [sl.spotd_exe(), "run", "--job-from", "gcp-metadata", "--provider",
            "gcp", "--metadata-url", emu.url, "--poll-interval", "200ms",
            "--ckpt-dir", os.path.join(wd2, "ckpt"), "--socket",
            os.path.join(wd2, "spotd.sock"), "--interval", "0", "--",
            sl.PY3, sl.FAKE_TRAINER, "--log", log2, "--step-sleep", "0.05"]
    p2 = subprocess.Popen(argv, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    sl._STARTED.append(p2)
    err2 = sl.LineLog(p2.stderr, "[spotd2] ")
    sl.LineLog(p2.stdout, None)
    got = err2.wait(r"job-from gcp-metadata: job=%s store=%s" % (job, store),
                    20)[1]
    c.check(got is not None, "node2: --job-from gcp-metadata read the job "
            "and store from the instance metadata")
    got = err2.wait(r"restored checkpoint %s into " % name, 30)[1]
    c.check(got is not None, "node2: restored %s from the store" % name)
    start, end = None, time.time() + 20
    while time.time() < end and start is None:
        ev = sl.trainer_events(log2, "start")
        start = ev[0] if ev else None
        time.sleep(0.1)
    step = made[-1]["step"] if made else -1
    c.check(start is not None and start.get("step") == step and
            start["env"].get("SPOTD_RESUME_DIR", "").endswith("/" + name),
            "node2: the trainer resumes from %s at step %d" % (name, step),
            repr(start))
    t_resumed = time.time()
    p2.send_signal(signal.SIGTERM)
    try:
        p2.wait(30)
    except subprocess.TimeoutExpired:
        p2.kill()
    print("     cycle: notice -> committed %.2f s, -> VM launched %.2f s, "
          "boot -> trainer resumed %.2f s" %
          ((committed or 0) - t_notice, (launched or 0) - t_notice,
           t_resumed - t_boot), flush=True)
    print("     node1 log:\n" + "\n".join(
        "       " + l for l in d1.log().splitlines()
        if re.search(r"notice|committed|relaunch|exit", l)), flush=True)
    print("     node2 log:\n" + "\n".join(
        "       " + l for l in err2.text().splitlines()
        if re.search(r"job-from|restor|state|trainer", l)), flush=True)


def errors(c, emu, store, job):
    env = {"SPOTD_JOB": job, "SPOTD_STORE": "%s/%s" % (store, job),
           "SPOTD_CHECKPOINT": "step-err", "SPOTD_REASON": "manual",
           "SPOTD_DEADLINE": ""}
    emu.control("gce/capacity", zone="us-central1-c", available=0)
    cp = run_relaunch(emu, env)
    one_line(c, cp, "no zone left (this VM's, stocked out lately)",
             r"no capacity in any zone")
    c.check("zone us-central1-b skipped (stocked out lately)" in cp.stderr,
            "the zone that stocked out in the cycle is skipped (record)",
            cp.stderr)
    emu.control("gce/capacity", zone="us-central1-c", available=1)
    emu.control("gce/fault", deny=1)
    cp = run_relaunch(emu, dict(env, SPOTD_CHECKPOINT="d"), "--no-record")
    one_line(c, cp, "permission denied", r"GCE refused: HTTP 403 forbidden")
    emu.control("gce/fault", deny=0)
    cp = subprocess.run(
        [a if a != "spotd-template" else "no-such-template"
         for a in relaunch_cmd(emu, "--no-record")],
        env=dict(os.environ, **env), capture_output=True, text=True,
        timeout=60)
    one_line(c, cp, "missing template",
             r"instance template 'no-such-template': HTTP 404 notFound")
    cp = run_relaunch(emu, dict(env, SPOTD_CHECKPOINT="u"), "--no-record",
                      "--compute-endpoint", "http://127.0.0.1:9",
                      "--timeout", "3")
    one_line(c, cp, "API unreachable", r"GCE did not answer in time")
    emu.control("gce/fault", throttle=2)
    cp = run_relaunch(emu, dict(env, SPOTD_CHECKPOINT="t"), "--no-record")
    c.check(cp.returncode == 0 and
            cp.stderr.count("HTTP 429 rateLimitExceeded: retrying") == 2,
            "429 rateLimitExceeded twice: retried with backoff, then "
            "launched", cp.stderr)
    # every token the emulator issues starts so
    c.check("ya29.emulated-" not in cp.stderr + cp.stdout,
            "no OAuth token in the output")


def job_from_missing(c, emu):
    """A node whose metadata has no spotd-job: spotd says so in one line
    and exits 78 (a config it cannot complete) before starting anything."""
    cp = subprocess.run([sl.spotd_exe(), "run", "--job-from", "gcp-metadata",
                         "--metadata-url", emu.url, "--provider", "none",
                         "--", "true"], capture_output=True, text=True,
                        timeout=30)
    lines = cp.stderr.strip().splitlines()
    c.check(cp.returncode == 78 and len(lines) == 1 and
            "has no metadata attribute spotd-job" in lines[0],
            "--job-from gcp-metadata without the tag: exit 78, one line: %s" %
            (lines[0] if lines else "-"), cp.stderr)


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("relaunch-gcp")
    tmp = tempfile.mkdtemp(prefix="spotd-relaunch-gcp-")
    emu = sl.EmulatorProc("gcp", "--region", "us-central1")
    try:
        job_from_missing(c, emu)
        emu.control("gce/capacity", zone="us-central1-b", available=0)
        cycle(c, tmp, emu, store, job, prefix)
        errors(c, emu, store, job)
    finally:
        emu.stop()
        sl.kill_started()
        sl.s3_cleanup(prefix.rsplit("/job/", 1)[0] + "/")
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
