#!/usr/bin/python3
"""spotctl relaunch --backend aws (README "Relaunch on AWS / GCP") against
`spotd-emulate
--provider aws` (IMDS + the EC2 Query API, SigV4 checked by the emulator
with the same keys as the real Ceph store).

A full cycle: spotd runs the fake trainer on "this instance" (m5.large in
us-east-1a); the emulator publishes a spot notice; spotd checkpoints,
commits to Ceph and runs `spotctl relaunch --backend aws`, which sends one
CreateFleet over m5.large,c5.large x us-east-1a,us-east-1b without the
reclaimed pool; m5.large/us-east-1b has no spot capacity, so exactly one
instance starts in c5.large/us-east-1a, tagged with the job and store. The
emulator then "boots" it (IMDS answers as the new instance) and a second
spotd started with --job-from aws-tag (no --job, no --store) reads its job
from the instance tags, restores the committed checkpoint and resumes.

Then: a doubled relaunch creates nothing (record in the store; and with
--no-record the ClientToken makes EC2 replay the same fleet); exhausted
pools are skipped and remembered; no capacity anywhere is one line, then an
on-demand fallback; throttling is retried; UnauthorizedOperation and a bad
launch template are one line each; botocore parses the emulator's
DescribeInstances/TerminateInstances answers (shapes check).
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

TYPES = "m5.large,c5.large"
TOKEN = "FwoGZXIvYXdzEmulatedSessionToken0123456789"
ZONES = "us-east-1a,us-east-1b"


def ec2_state(emu):
    with urllib.request.urlopen(emu.url + "/__emulate/ec2/state",
                                timeout=10) as r:
        return json.loads(r.read().decode())


def relaunch_cmd(emu, *extra):
    return [sl.spotctl_exe(), "relaunch", "--backend", "aws",
            "--launch-template", "spotd-template", "--instance-types", TYPES,
            "--zones", ZONES, "--ec2-endpoint", emu.url, "--metadata-url",
            emu.url, "--timeout", "30"] + list(extra)


def run_relaunch(emu, env, *extra):
    full = dict(os.environ)
    full.update(env)
    return subprocess.run(relaunch_cmd(emu, *extra), env=full,
                          capture_output=True, text=True, timeout=60)


def error_lines(cp):
    return [l for l in cp.stderr.splitlines() if l.startswith("spotctl: ")]


def one_line(c, cp, what, pattern):
    errs = error_lines(cp)
    c.check(cp.returncode == 1 and len(errs) == 1 and
            re.search(pattern, errs[0]) is not None,
            what + ": exit 1 and one line: %s" % (errs[0] if errs else "-"),
            "rc=%d\n%s" % (cp.returncode, cp.stderr))


def cycle(c, tmp, emu, store, job, prefix):
    """Notice -> commit -> CreateFleet -> boot -> --job-from -> resume."""
    wd1 = os.path.join(tmp, "node1")
    relaunch = " ".join(relaunch_cmd(emu))
    d1 = sl.Daemon(wd1, store, job, provider="aws", metadata_url=emu.url,
                   args=["--relaunch", relaunch], grace=5,
                   poll_interval="200ms", trainer=["--step-sleep", 0.05])
    c.check(d1.wait_event("step", 20) is not None, "node1: the trainer runs")
    time.sleep(0.5)
    t_notice = time.time()
    emu.control("notice", deadline=30)
    rc = d1.wait_exit(60)
    c.check(rc == 75, "node1: spotd exits 75 after the notice", "rc=%s" % rc)
    made = d1.events("checkpoint")
    name = made[-1]["name"] if made else "?"
    c.check(sl.latest(prefix) == name, "node1: %s committed and LATEST" % name)
    st = ec2_state(emu)
    inst = st["instances"]
    fleets = [r for r in st["requests"] if r["action"] == "CreateFleet"]
    c.check(len(inst) == 1, "exactly one new instance (%d)" % len(inst),
            json.dumps(st))
    c.check(len(fleets) == 1 and fleets[0]["signature"] == "ok",
            "one CreateFleet, its SigV4 signature verified by the emulator",
            json.dumps(fleets))
    if len(inst) != 1 or len(fleets) != 1:
        print(d1.log())
        return None
    new = inst[0]
    pools = ["%s/%s" % (o["type"], o["zone"]) for o in fleets[0]["overrides"]]
    c.check("m5.large/us-east-1a" not in pools and len(pools) == 3,
            "the reclaimed pool m5.large/us-east-1a is not asked: %s" % pools)
    c.check((new["type"], new["zone"]) == ("c5.large", "us-east-1a") and
            new["lifecycle"] == "spot",
            "exhausted m5.large/us-east-1b skipped: launched %s/%s (%s)" %
            (new["type"], new["zone"], new["lifecycle"]))
    c.check(new["tags"].get("spotd-job") == job and
            new["tags"].get("spotd-store") == store,
            "the instance is tagged spotd-job=%s spotd-store=%s" % (job, store),
            json.dumps(new["tags"]))
    launched = d1.err.time_of(r"spotctl relaunch .*: launched i-")
    committed = d1.err.time_of(r"committed checkpoint name=" + name)
    rec = json.loads(sl.s3_get(prefix + "relaunch.json").decode())
    c.check(any(f["pool"] == "m5.large/us-east-1b" and
                f["code"] == "InsufficientInstanceCapacity"
                for f in rec["failed"]) and
            any(f["pool"] == "m5.large/us-east-1a" and f["code"] == "reclaimed"
                for f in rec["failed"]) and
            rec["done"] and rec["done"][0]["instance"] == new["id"],
            "relaunch.json records the failed and reclaimed pools and the "
            "relaunch", json.dumps(rec))
    env = {"SPOTD_JOB": job, "SPOTD_STORE": "%s/%s" % (store, job),
           "SPOTD_CHECKPOINT": name, "SPOTD_REASON": "aws-spot-terminate",
           "SPOTD_DEADLINE": ""}
    # A doubled relaunch, from the old node (before the new one boots).
    doubled(c, emu, env, new)

    # The new node boots: IMDS now answers as the new instance.
    emu.control("ec2/boot", instance=new["id"])
    t_boot = time.time()
    wd2 = os.path.join(tmp, "node2")
    os.makedirs(wd2)
    log2 = os.path.join(wd2, "trainer.log")
    argv = [sl.spotd_exe(), "run", "--job-from", "aws-tag", "--provider",
            "aws", "--metadata-url", emu.url, "--poll-interval", "200ms",
            "--ckpt-dir", os.path.join(wd2, "ckpt"), "--socket",
            os.path.join(wd2, "spotd.sock"), "--interval", "0", "--",
            sl.PY3, sl.FAKE_TRAINER, "--log", log2, "--step-sleep", "0.05"]
    p2 = subprocess.Popen(argv, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    sl._STARTED.append(p2)
    err2 = sl.LineLog(p2.stderr, "[spotd2] ")
    sl.LineLog(p2.stdout, None)
    got = err2.wait(r"job-from aws-tag: job=%s store=%s" % (job, store), 20)[1]
    c.check(got is not None, "node2: --job-from aws-tag read the job and "
            "store from the instance tags")
    got = err2.wait(r"restored checkpoint %s into " % name, 30)[1]
    c.check(got is not None, "node2: restored %s from the store" % name)
    start = None
    end = time.time() + 20
    while time.time() < end and start is None:
        ev = sl.trainer_events(log2, "start")
        start = ev[0] if ev else None
        time.sleep(0.1)
    step = made[-1]["step"] if made else -1
    c.check(start is not None and start.get("step") == step and
            start["env"].get("SPOTD_JOB") == job and
            start["env"].get("SPOTD_RESUME_DIR", "").endswith("/" + name),
            "node2: the trainer resumes from %s at step %d" % (name, step),
            repr(start))
    t_resumed = time.time()
    p2.send_signal(signal.SIGTERM)
    try:
        p2.wait(30)
    except subprocess.TimeoutExpired:
        p2.kill()
    print("     cycle: notice -> committed %.2f s, -> instance launched %.2f s,"
          " boot -> trainer resumed %.2f s" %
          ((committed or 0) - t_notice, (launched or 0) - t_notice,
           t_resumed - t_boot), flush=True)
    print("     node1 log:\n" + "\n".join(
        "       " + l for l in d1.log().splitlines()
        if re.search(r"notice|committed|relaunch|exit", l)), flush=True)
    print("     node2 log:\n" + "\n".join(
        "       " + l for l in err2.text().splitlines()
        if re.search(r"job-from|restor|state|trainer", l))[:3000], flush=True)
    return new


def doubled(c, emu, env, new):
    cp = run_relaunch(emu, env)
    c.check(cp.returncode == 0 and "nothing to do" in cp.stderr and
            len(ec2_state(emu)["instances"]) == 1,
            "a doubled relaunch finds the record and creates nothing",
            cp.stderr)
    # Without the record, the ClientToken makes EC2 replay the first fleet.
    cp = run_relaunch(emu, env, "--no-record")
    st = ec2_state(emu)
    replay = [r for r in st["requests"] if r.get("result") == "replayed"]
    c.check(cp.returncode == 0 and cp.stdout.strip() == new["id"] and
            len(st["instances"]) == 1 and len(replay) == 1,
            "--no-record: same ClientToken, EC2 replays fleet %s, still one "
            "instance" % new["id"], cp.stdout + cp.stderr)


def exhausted(c, emu, store, job, prefix):
    env = {"SPOTD_JOB": job, "SPOTD_STORE": "%s/%s" % (store, job),
           "SPOTD_CHECKPOINT": "step-999999", "SPOTD_REASON": "manual",
           "SPOTD_DEADLINE": ""}
    for pool in ("c5.large/us-east-1a", "c5.large/us-east-1b"):
        emu.control("ec2/capacity", pool=pool, available=0)
    n0 = len(ec2_state(emu)["instances"])
    cp = run_relaunch(emu, env)
    one_line(c, cp, "no capacity anywhere", r"relaunch: no capacity in any "
             r"pool")
    st = ec2_state(emu)
    last = [r for r in st["requests"] if r["action"] == "CreateFleet"][-1]
    c.check(len(st["instances"]) == n0 and
            "pool c5.large/us-east-1b: InsufficientInstanceCapacity" in
            cp.stderr, "the pool left is full: nothing launched", cp.stderr)
    asked = ["%s/%s" % (o["type"], o["zone"]) for o in last["overrides"]]
    c.check(asked == ["c5.large/us-east-1b"],
            "neither pools failed lately (record) nor this node's pool "
            "(c5.large/us-east-1a) are asked: %s" % asked)
    cp = run_relaunch(emu, env, "--on-demand-after", "1")
    st = ec2_state(emu)
    od = [i for i in st["instances"] if i["lifecycle"] == "on-demand"]
    c.check(cp.returncode == 0 and len(od) == 1 and
            "trying on-demand" in cp.stderr,
            "--on-demand-after 1: one on-demand instance (%s)" %
            (od[0]["type"] + "/" + od[0]["zone"] if od else "-"), cp.stderr)


def errors(c, emu, store, job):
    env = {"SPOTD_JOB": job, "SPOTD_STORE": "%s/%s" % (store, job),
           "SPOTD_CHECKPOINT": "step-err", "SPOTD_REASON": "manual",
           "SPOTD_DEADLINE": ""}
    emu.control("ec2/fault", deny=1)
    cp = run_relaunch(emu, env, "--no-record")
    one_line(c, cp, "UnauthorizedOperation", r"UnauthorizedOperation.*"
             r"ec2:CreateFleet")
    emu.control("ec2/fault", deny=0)
    cp = subprocess.run(
        [a if a != "spotd-template" else "no-such-template"
         for a in relaunch_cmd(emu, "--no-record")],
        env=dict(os.environ, **env), capture_output=True, text=True,
        timeout=60)
    one_line(c, cp, "bad launch template",
             r"launch template 'no-such-template': "
             r"InvalidLaunchTemplateName.NotFoundException")
    cp = run_relaunch(emu, dict(env, SPOTD_CHECKPOINT="x"), "--no-record",
                      "--ec2-endpoint", "http://127.0.0.1:9", "--timeout", "3")
    one_line(c, cp, "EC2 unreachable", r"did not get through in time")
    for pool in ("c5.large/us-east-1a", "c5.large/us-east-1b"):
        emu.control("ec2/capacity", pool=pool, available=1)
    emu.control("ec2/fault", throttle=2)
    cp = run_relaunch(emu, dict(env, SPOTD_CHECKPOINT="step-throttled"),
                      "--no-record")
    c.check(cp.returncode == 0 and
            cp.stderr.count("RequestLimitExceeded: retrying") == 2,
            "RequestLimitExceeded twice: retried with backoff, then launched",
            cp.stderr)
    secrets = [os.environ.get("AWS_SECRET_ACCESS_KEY", "-")]
    c.check(not any(s in cp.stderr + cp.stdout for s in secrets),
            "no secret in relaunch output")


def subnet_pools(c, emu, store, job):
    """--subnets SUBNET@ZONE: EC2 echoes each failed override with its
    subnet and no zone. The pools that had no capacity are still known by
    type and zone (from the subnet's zone given), so the next attempt does
    not ask them again: one CreateFleet, then "no capacity" without a
    retry of the same pools."""
    env = {"SPOTD_JOB": job, "SPOTD_STORE": "%s/%s" % (store, job),
           "SPOTD_CHECKPOINT": "step-subnets", "SPOTD_REASON": "manual",
           "SPOTD_DEADLINE": ""}
    subnets = {"subnet-0a1a": "us-east-1a", "subnet-0b1b": "us-east-1b"}
    for sid, zone in subnets.items():
        emu.control("ec2/subnet", id=sid, zone=zone)
    pools = ["%s/%s" % (t, z) for t in TYPES.split(",")
             for z in subnets.values()]
    for pool in pools:
        emu.control("ec2/capacity", pool=pool, available=0)
    n0 = len([r for r in ec2_state(emu)["requests"]
              if r["action"] == "CreateFleet"])
    argv = [a for a in relaunch_cmd(emu, "--no-record", "--attempts", "3")
            if a not in ("--zones", ZONES)]
    argv += ["--subnets", ",".join("%s@%s" % kv for kv in subnets.items())]
    cp = subprocess.run(argv, env=dict(os.environ, **env),
                        capture_output=True, text=True, timeout=60)
    st = ec2_state(emu)
    fleets = [r for r in st["requests"] if r["action"] == "CreateFleet"][n0:]
    asked = [["%s/%s" % (o["type"], o["zone"]) for o in f["overrides"]]
             for f in fleets]
    failed = re.findall(r"pool (\S+): InsufficientInstanceCapacity", cp.stderr)
    c.check(len(fleets) == 1 and asked[0] and set(asked[0]) <= set(pools),
            "subnets: the first attempt asks the subnets' pools, the retry "
            "does not ask the pools that just failed: %s" % asked, cp.stderr)
    c.check(failed and sorted(failed) == sorted(asked[0] if asked else []),
            "subnets: the failed pools are named with their zone: %s" % failed,
            cp.stderr)
    one_line(c, cp, "subnets: every pool full", r"relaunch: no capacity in "
             r"any pool")
    for pool in pools:
        emu.control("ec2/capacity", pool=pool, available=1)
    emu.control("ec2/capacity", pool="m5.large/us-east-1b", available=0)


def botocore_shapes(c, emu, job):
    try:
        import boto3
    except ImportError:
        print("     (boto3 missing: shapes not checked)")
        return
    ec2 = boto3.client("ec2", endpoint_url=emu.url, region_name="us-east-1")
    r = ec2.describe_instances(Filters=[{"Name": "tag:spotd-job",
                                         "Values": [job]}])
    insts = [i for res in r["Reservations"] for i in res["Instances"]]
    c.check(len(insts) >= 1 and all(
        {"Key": "spotd-job", "Value": job} in i["Tags"] for i in insts) and
        all(i["State"]["Name"] == "running" for i in insts),
        "botocore parses DescribeInstances (filter tag:spotd-job): %d" %
        len(insts))
    ids = [i["InstanceId"] for i in insts]
    t = ec2.terminate_instances(InstanceIds=ids)
    c.check([x["CurrentState"]["Name"] for x in t["TerminatingInstances"]] ==
            ["shutting-down"] * len(ids),
            "botocore parses TerminateInstances")
    req = [r for r in ec2_state(emu)["requests"]
           if r["action"] == "TerminateInstances"]
    c.check(req and req[-1]["signature"] == "ok",
            "botocore's own SigV4 (service ec2) verifies in the emulator too")


def form_matches_botocore(c, emu, store, job):
    """--dry-run prints the CreateFleet form; botocore's own serializer
    (the EC2 model, ec2 protocol) must give the same parameters for the
    same request."""
    try:
        import botocore.serialize
        import botocore.session
    except ImportError:
        print("     (botocore missing: form not compared)")
        return
    import urllib.parse
    env = {"SPOTD_JOB": job, "SPOTD_STORE": "%s/%s" % (store, job),
           "SPOTD_CHECKPOINT": "step-000001", "SPOTD_REASON": "manual",
           "SPOTD_DEADLINE": ""}
    cp = run_relaunch(emu, env, "--dry-run")
    lines = cp.stdout.splitlines()
    form = lines[1] if len(lines) > 1 and lines[0].startswith("would POST") \
        else ""
    ours = dict(urllib.parse.parse_qsl(form, keep_blank_values=True))
    token = ours.get("ClientToken", "")
    model = botocore.session.get_session().get_service_model("ec2")
    ser = botocore.serialize.create_serializer("ec2")
    pools = [("m5.large", "us-east-1b"), ("c5.large", "us-east-1a"),
             ("c5.large", "us-east-1b")]
    req = ser.serialize_to_request({
        "ClientToken": token, "Type": "instant",
        "TargetCapacitySpecification": {"TotalTargetCapacity": 1,
                                        "DefaultTargetCapacityType": "spot"},
        "SpotOptions": {"AllocationStrategy":
                        "capacity-optimized-prioritized"},
        "LaunchTemplateConfigs": [{
            "LaunchTemplateSpecification": {
                "LaunchTemplateName": "spotd-template",
                "Version": "$Default"},
            "Overrides": [{"InstanceType": t, "AvailabilityZone": z,
                           "Priority": float(i + 1)}
                          for i, (t, z) in enumerate(pools)]}],
        "TagSpecifications": [{"ResourceType": "instance", "Tags": [
            {"Key": "spotd-job", "Value": job},
            {"Key": "spotd-store", "Value": store}]}]},
        model.operation_model("CreateFleet"))
    theirs = {k: str(v) for k, v in req["body"].items()}
    norm = {k: (v[:-2] if k.endswith(".Priority") and v.endswith(".0")
                else v) for k, v in theirs.items()}
    c.check(cp.returncode == 0 and token.startswith("spotd-") and
            ours == norm,
            "the CreateFleet form equals botocore's serialization of the "
            "same request (%d parameters)" % len(ours),
            "ours - botocore: %s\nbotocore - ours: %s\n%s" % (
                sorted(set(ours.items()) - set(norm.items())),
                sorted(set(norm.items()) - set(ours.items())), cp.stderr))


def role_credentials(c, emu, store, job, tmp):
    """No keys in the environment nor files: the instance role from IMDS,
    with its session token, which must ride signed in
    X-Amz-Security-Token (the emulator checks both)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                        "AWS_SESSION_TOKEN", "AWS_EC2_METADATA_DISABLED",
                        "AWS_PROFILE")}
    home = os.path.join(tmp, "empty-home")
    os.makedirs(home, exist_ok=True)
    env.update({"HOME": home, "SPOTD_JOB": job,
                "SPOTD_STORE": "%s/%s" % (store, job),
                "SPOTD_CHECKPOINT": "step-role", "SPOTD_REASON": "manual",
                "SPOTD_DEADLINE": ""})
    cp = subprocess.run(relaunch_cmd(emu, "--no-record"), env=env,
                        capture_output=True, text=True, timeout=60)
    st = ec2_state(emu)
    last = [r for r in st["requests"] if r["action"] == "CreateFleet"][-1]
    c.check(cp.returncode == 0 and last["signature"] == "ok" and
            last["session_token"] is True and last.get("result") == "launched",
            "instance-role credentials (IMDS, session token signed) work",
            cp.stderr)
    c.check(TOKEN not in cp.stderr + cp.stdout,
            "the session token is never printed")


def boot_hook(c, tmp, store, job, prefix):
    """`spotd-emulate --boot-cmd`: the emulator itself boots the instance
    it launched and runs the new node's spotd (--job-from aws-tag), which
    restores LATEST and resumes."""
    name = sl.latest(prefix)
    wd = os.path.join(tmp, "booted")
    os.makedirs(wd)
    cmd = ("exec %s run --job-from aws-tag --provider aws --metadata-url "
           "\"$SPOT_EMULATE_URL\" --poll-interval 200ms --ckpt-dir %s/ckpt "
           "--socket %s/spotd.sock --interval 0 -- %s %s --log %s/trainer.log "
           "--step-sleep 0.05 >%s/out 2>%s/err" %
           (sl.spotd_exe(), wd, wd, sl.PY3, sl.FAKE_TRAINER, wd, wd, wd))
    emu2 = sl.EmulatorProc("aws", "--boot-cmd", cmd, "--boot-after", "0.5")
    try:
        env = {"SPOTD_JOB": job, "SPOTD_STORE": "%s/%s" % (store, job),
               "SPOTD_CHECKPOINT": name or "", "SPOTD_REASON": "boot-hook",
               "SPOTD_DEADLINE": ""}
        cp = run_relaunch(emu2, env, "--no-record")
        iid = cp.stdout.strip()
        booted = emu2.out.wait(r"^booted %s: pid \d+" % re.escape(iid), 10)[1]
        start, end = None, time.time() + 30
        while time.time() < end and start is None:
            ev = sl.trainer_events(os.path.join(wd, "trainer.log"), "start")
            start = ev[0] if ev else None
            time.sleep(0.1)
        c.check(cp.returncode == 0 and booted is not None and
                start is not None and
                start["env"].get("SPOTD_RESUME_DIR", "").endswith("/%s" % name),
                "--boot-cmd: the emulator booted %s and its spotd resumed "
                "from %s" % (iid, name), cp.stderr + repr(start))
    finally:
        emu2.stop()  # SIGTERM to the booted spotd, waited for
    err = sl.read_text(os.path.join(wd, "err")) or ""
    c.check("job-from aws-tag: job=%s store=%s" % (job, store) in err and
            re.search(r"restored checkpoint %s into" % name, err) and
            "exit status" in err,
            "the booted spotd took its job from the tags, restored, and "
            "stopped with the emulator", err[-1500:])


def job_from_missing(c, emu):
    """A node whose metadata has no spotd-job: spotd says so in one line
    and exits 78 (a config it cannot complete) before starting anything."""
    cp = subprocess.run([sl.spotd_exe(), "run", "--job-from", "aws-tag",
                         "--metadata-url", emu.url, "--provider", "none",
                         "--", "true"], capture_output=True, text=True,
                        timeout=30)
    lines = cp.stderr.strip().splitlines()
    c.check(cp.returncode == 78 and len(lines) == 1 and
            "has no tag spotd-job" in lines[0],
            "--job-from aws-tag without the tag: exit 78, one line: %s" %
            (lines[0] if lines else "-"), cp.stderr)


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("relaunch-aws")
    tmp = tempfile.mkdtemp(prefix="spotd-relaunch-aws-")
    os.environ["SPOT_EMULATE_AWS_ACCESS_KEY_ID"] = \
        os.environ.get("AWS_ACCESS_KEY_ID", "")
    os.environ["SPOT_EMULATE_AWS_SECRET_ACCESS_KEY"] = \
        os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    os.environ["SPOT_EMULATE_AWS_SESSION_TOKEN"] = TOKEN
    emu = sl.EmulatorProc("aws")
    try:
        job_from_missing(c, emu)
        emu.control("ec2/capacity", pool="m5.large/us-east-1b", available=0)
        form_matches_botocore(c, emu, store, job)
        cycle(c, tmp, emu, store, job, prefix)
        exhausted(c, emu, store, job, prefix)
        errors(c, emu, store, job)
        subnet_pools(c, emu, store, job)
        role_credentials(c, emu, store, job, tmp)
        boot_hook(c, tmp, store, job, prefix)
        botocore_shapes(c, emu, job)
    finally:
        emu.stop()
        sl.kill_started()
        sl.s3_cleanup(prefix.rsplit("/job/", 1)[0] + "/")
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
