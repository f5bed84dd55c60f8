#!/usr/bin/python3
"""Checks the Kubernetes manifests here, docs/kubernetes.md and spotd's
exit codes against values.yaml (the one place their numbers and names come
from), then validates every object against the Kubernetes API schemas with
the npm package kubernetes-models (validate.mjs), after making sure the
validator rejects a broken Job.

Usage: check.py [--node-modules DIR]   (exit 0 ok, 1 a mismatch or an
invalid object, 77 no validator installed: tools/deps.sh test installs it)
"""
import argparse
import copy
import glob
import json
import os
import re
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PINNED = "5.1.0"  # kubernetes-models, installed by tools/deps.sh test

ERRORS = []


def need(cond, what):
    if not cond:
        ERRORS.append(what)


def manifests():
    out = []
    for f in sorted(glob.glob(os.path.join(HERE, "*.yaml"))):
        if os.path.basename(f) == "values.yaml":
            continue
        with open(f) as fh:
            for d in yaml.safe_load_all(fh):
                if d:
                    out.append((os.path.relpath(f, ROOT), d))
    return out


def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}


def check_job(v, f, job, services):
    name = job["metadata"]["name"]
    where = "%s: Job %s" % (f, name)
    spec = job["spec"]
    pod = spec["template"]["spec"]
    need(pod.get("restartPolicy") == "Never",
         where + ": restartPolicy must be Never (podFailurePolicy)")
    need(pod.get("terminationGracePeriodSeconds") == v["grace_s"],
         where + ": terminationGracePeriodSeconds is not grace_s %d" % v["grace_s"])
    rules = spec.get("podFailurePolicy", {}).get("rules", [])
    by = {}
    for r in rules:
        oe = r.get("onExitCodes")
        if oe:
            need(oe.get("containerName") == v["container"],
                 where + ": a rule names another container")
            need(oe.get("operator") == "In", where + ": rule operator not In")
            by.setdefault(r["action"], []).extend(oe["values"])
    need(sorted(by.get("Ignore", [])) == sorted(v["ignore"]),
         where + ": Ignore on exit codes %s, not %s" % (by.get("Ignore"), v["ignore"]))
    need(sorted(by.get("FailJob", [])) == sorted(v["fail_job"]),
         where + ": FailJob on %s, not %s" % (by.get("FailJob"), v["fail_job"]))
    cs = [c for c in pod["containers"] if c["name"] == v["container"]]
    need(len(cs) == 1, where + ": no container %s" % v["container"])
    if not cs:
        return
    c = cs[0]
    env = env_of(c)
    need(c.get("command") == ["spotd"], where + ": spotd is not the entrypoint")
    args = c.get("args", [])
    need(args[:1] == ["run"] and "--" in args, where + ": args are not 'run ... -- CMD'")
    need(env.get(v["env"]["grace"], {}).get("value") == str(v["spotd_grace_s"]),
         where + ": %s is not %d" % (v["env"]["grace"], v["spotd_grace_s"]))
    for opt, val in (("--socket", v["socket"]), ("--metrics-file", v["metrics"])):
        need(opt in args and args[args.index(opt) + 1] == val,
             where + ": %s is not %s" % (opt, val))
    probe = c.get("readinessProbe", {}).get("exec", {}).get("command", [])
    need(probe == ["spotctl", "status", "--socket", v["socket"]],
         where + ": the readiness probe is not spotctl status on the socket")
    if spec.get("completionMode") == "Indexed":
        n = v["ranks"]
        need(spec.get("completions") == n and spec.get("parallelism") == n,
             where + ": completions and parallelism are not ranks %d" % n)
        need(env.get(v["env"]["nranks"], {}).get("value") == str(n),
             where + ": %s is not completions" % v["env"]["nranks"])
        # The store's run join agrees the run; a --run-id built from
        # per-index counts can differ between the pods of one start.
        need("--run-id" not in args,
             where + ": --run-id given: the ranks agree on the run through "
             "the store")
        sub = pod.get("subdomain")
        svc = services.get(sub)
        need(svc is not None and svc["spec"].get("clusterIP") == "None",
             where + ": subdomain %s is not a headless Service" % sub)
        if svc is not None:
            need(svc["spec"].get("selector", {}).get(
                "batch.kubernetes.io/job-name") == name,
                where + ": the Service does not select the Job's pods")


def check_exit_codes(v):
    with open(os.path.join(ROOT, "daemon", "spotd.h")) as f:
        h = f.read()
    for macro, key in (("PREEMPTED", "preempted"), ("NOTHING_SAVED", "nothing_saved"),
                       ("LEASE_LOST", "lease_lost"), ("ERROR", "error"),
                       ("UNAVAILABLE", "unavailable"), ("SOFTWARE", "restarts"),
                       ("IOERR", "io"), ("USAGE", "usage"), ("DATAERR", "data"),
                       ("CONFIG", "config"), ("NO_COMMAND", "no_command")):
        m = re.search(r"#define SPOTD_EXIT_%s (\d+)" % macro, h)
        need(m is not None and int(m.group(1)) == v["exit"][key],
             "daemon/spotd.h: SPOTD_EXIT_%s is not %d" % (macro, v["exit"][key]))
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    for key, what in (("usage", "a bad command line"), ("config", "a bad config"),
                      ("data", "the store's data"), ("error", "any other failure")):
        need("| %d | %s" % (v["exit"][key], what) in readme,
             "README.md: exit %d is not %s" % (v["exit"][key], what))
    for key in ("usage", "data", "config", "no_command"):
        need(v["exit"][key] in v["fail_job"],
             "values: exit %d does not fail the Job" % v["exit"][key])
    need(v["exit"]["preempted"] in v["ignore"], "values: 75 is not ignored")
    need(v["grace_s"] == v["checkpoint_s"] + v["margin_s"],
         "values: grace_s is not checkpoint_s + margin_s")
    need(v["spotd_grace_s"] == v["grace_s"] - v["stop_margin_s"],
         "values: spotd_grace_s is not grace_s - stop_margin_s")


def check_doc(v):
    with open(os.path.join(ROOT, "docs", "kubernetes.md")) as f:
        doc = f.read()
    for s in ("terminationGracePeriodSeconds: %d" % v["grace_s"],
              "%s=%d" % (v["env"]["grace"], v["spotd_grace_s"]),
              "exit %d" % v["exit"]["preempted"],
              "[%s]" % ", ".join(str(x) for x in v["fail_job"]),
              v["env"]["nranks"], v["env"]["index"], v["socket"], v["metrics"],
              "checkpoint_s: %d" % v["checkpoint_s"]):
        need(s in doc, "docs/kubernetes.md does not say '%s'" % s)


def validate(objs, modules):
    """0 when every object is valid and a broken one is refused."""
    script = os.path.join(HERE, "validate.mjs")
    bad = copy.deepcopy([o for o in objs if o[1]["kind"] == "Job"][0])
    bad[1]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "2m"
    bad[1]["spec"]["podFailurePolicy"]["rules"][0]["action"] = "Restart"
    cp = subprocess.run(["node", script, modules], input=json.dumps([bad]),
                        capture_output=True, text=True, timeout=120)
    print("a broken copy, refused as it must be:", cp.stdout, end="")
    need(cp.returncode == 1 and "must be integer" in cp.stdout and
         "allowed values" in cp.stdout,
         "the validator accepted a broken Job (rc %d): %s" % (cp.returncode, cp.stderr))
    cp = subprocess.run(["node", script, modules], input=json.dumps(objs),
                        capture_output=True, text=True, timeout=120)
    print(cp.stdout, end="")
    need(cp.returncode == 0, "invalid objects (rc %d) %s" % (cp.returncode, cp.stderr))
    need(cp.stdout.count("\nok ") + cp.stdout.startswith("ok ") == len(objs),
         "not every object was validated")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--node-modules",
                    default=os.path.join(ROOT, ".build-test", "k8s", "node_modules"))
    a = ap.parse_args()
    with open(os.path.join(HERE, "values.yaml")) as f:
        v = yaml.safe_load(f)
    objs = manifests()
    services = {d["metadata"]["name"]: d for _, d in objs if d["kind"] == "Service"}
    jobs = [(f, d) for f, d in objs if d["kind"] == "Job"]
    need(len(jobs) == 2, "expected a single-node and an Indexed Job")
    for f, d in jobs:
        check_job(v, f, d, services)
    check_exit_codes(v)
    check_doc(v)
    pkg = os.path.join(a.node_modules, "kubernetes-models", "package.json")
    skipped = False
    if not os.path.exists(pkg):
        print("no kubernetes-models in %s (tools/deps.sh test installs it)" %
              a.node_modules)
        skipped = True
    else:
        with open(pkg) as f:
            ver = json.load(f)["version"]
        need(ver == PINNED, "kubernetes-models %s, not the pinned %s" % (ver, PINNED))
        validate([list(o) for o in objs], a.node_modules)
    for e in ERRORS:
        print("FAIL:", e)
    if ERRORS:
        return 1
    print("%d objects consistent with values.yaml%s" %
          (len(objs), "" if skipped else ", valid (kubernetes-models %s)" % PINNED))
    return 77 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
