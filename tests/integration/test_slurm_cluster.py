#!/usr/bin/python3
"""A real 3-node Slurm cluster on this machine (tests/slurm.sh --nodes 3):
slurmctld and munged on the host, one slurmd per node in a network and UTS
namespace of its own, a private bridge between them, and a forwarder so the
nodes reach the test S3 server on the host's loopback.

A batch job `sbatch -N3 --ntasks-per-node=1 --requeue` runs `srun` on every
node, each task printing its hostname, its namespace's address and whether
`spotctl lease --show` reaches the store through the forwarder. Checks:
three distinct hostnames and addresses inside the cluster's subnet, the
store reachable from every node; `scontrol requeue` reruns the job on the
three nodes (SLURM_RESTART_COUNT=1); stop leaves no namespace, link,
daemon or file behind. Skips (77) only without Slurm or the S3 server."""
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

BATCH = r'''#!/bin/bash
run=${SLURM_RESTART_COUNT:-0}
echo "batch run=$run host=$(hostname) nodes=$SLURM_JOB_NODELIST"
srun --ntasks-per-node=1 bash -c '
  addr=$(ip -4 -o addr show eth0 | awk "{ print \$4 }")
  if "$SPOTCTL" lease "$FAKE_URL" --show --endpoint "http://$FAKE_FWD" >/dev/null 2>&1
  then s3=ok; else s3=fail; fi
  echo "task run='$run' rank=$SLURM_PROCID host=$(hostname) addr=$addr s3=$s3"
'
if [[ $run == 0 ]]; then
  sleep 60  # the test requeues the job meanwhile
fi
echo "batch end run=$run"
'''


def slurm(*args, timeout=20):
    return spotlib.run(list(args), timeout=timeout)


def net_leftovers(sdir_env):
    """Namespaces and links of this cluster still present."""
    nss = sdir_env.get("SPOT_TEST_SLURM_NETNS", "").split()
    x = sdir_env.get("SPOT_TEST_SLURM_NET", "").split(".")
    listed = slurm("ip", "netns", "list").stdout
    left = [n for n in nss if re.search(r"^%s\b" % re.escape(n), listed, re.M)]
    if len(x) == 4:
        links = slurm("ip", "-o", "link").stdout
        left += re.findall(r"\b(spbr%s|sp%sh\d+)\b" % (x[2], x[2]), links)
    return left


def main():
    endpoint, bucket = spotlib.store_env()
    if os.geteuid() != 0:
        spotlib.skip("needs root for namespaces, munged and slurmd")
    if not all(os.path.exists(p) for p in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd",
                                           "/usr/bin/sbatch", "/usr/sbin/munged")):
        spotlib.skip("slurm-wlm is not installed")
    c = spotlib.Checks()
    spotctl = os.environ.get("SPOTCTL") or spotlib.builddir_path("client", "spotctl")
    url, root = spotlib.unique_job("slurm-cluster")
    target = re.sub(r"^https?://", "", endpoint).rstrip("/")
    sdir = tempfile.mkdtemp(prefix="spotd-slurm3-")
    work = tempfile.mkdtemp(prefix="spotd-slurm3-work-")
    os.chmod(work, 0o755)
    env_vals = {}
    started = False
    t0 = time.time()
    try:
        cp = spotlib.run(["bash", spotlib.srcdir_path("tests", "slurm.sh"), "start", sdir,
                          "--nodes", "3", "--forward", target], timeout=120,
                         env={"SLURM_TEST_KILLWAIT": "2"})
        started = True
        if not c.check(cp.returncode == 0, "tests/slurm.sh starts 3 nodes", cp.stderr[-3000:]):
            c.finish()
        print(cp.stderr.strip())
        for line in spotlib.read_text(os.path.join(sdir, "env")).splitlines():
            k, _, v = line.partition("=")
            env_vals[k] = v
            os.environ[k] = v
        net = ipaddress.ip_network(env_vals["SPOT_TEST_SLURM_NET"])
        cp = slurm("sinfo", "-h", "-N", "-o", "%N %t")
        c.check(sorted(cp.stdout.split()) == sorted(
            ["node1", "node2", "node3", "idle", "idle", "idle"]),
            "sinfo: node1..node3 idle", cp.stdout)

        out = os.path.join(work, "job.out")
        with open(os.path.join(work, "batch.sh"), "w") as f:
            f.write(BATCH)
        cp = spotlib.run(["sbatch", "--parsable", "-N3", "--ntasks-per-node=1", "--requeue",
                          "--open-mode=append", "-o", out, "-J", "spotd-cluster",
                          os.path.join(work, "batch.sh")], timeout=30,
                         env={"SPOTCTL": spotctl, "FAKE_URL": url,
                              "FAKE_FWD": env_vals["SPOT_TEST_SLURM_FORWARD"]})
        if not c.check(cp.returncode == 0, "sbatch -N3 accepts the job", cp.stderr):
            c.finish()
        jobid = cp.stdout.strip().split(";")[0]

        def tasks(run, timeout):
            end = time.time() + timeout
            got = []
            while time.time() < end:
                got = re.findall(r"^task run=%d rank=(\d) host=(\S+) addr=(\S+) s3=(\S+)$"
                                 % run, spotlib.read_text(out), re.M)
                if len(got) >= 3:
                    break
                time.sleep(0.2)
            return got

        def check_run(run, got):
            hosts = sorted(h for _, h, _, _ in got)
            c.check(hosts == ["node1", "node2", "node3"],
                    "run %d: srun ran on 3 distinct hostnames" % run, repr(got))
            addrs = {a.split("/")[0] for _, _, a, _ in got}
            c.check(len(addrs) == 3 and all(ipaddress.ip_address(a) in net for a in addrs),
                    "run %d: 3 distinct addresses inside %s" % (run, net), repr(addrs))
            c.check(all(s == "ok" for _, _, _, s in got),
                    "run %d: every node reaches the S3 store through the forwarder" % run,
                    repr(got))

        t_sub = time.time()
        got0 = tasks(0, 40)
        print("run 0 tasks after %.1f s: %r" % (time.time() - t_sub, got0))
        check_run(0, got0)
        cp = slurm("scontrol", "requeue", jobid)
        c.check(cp.returncode == 0, "scontrol requeue", cp.stderr)
        t_rq = time.time()
        got1 = tasks(1, 60)
        print("run 1 tasks %.1f s after the requeue: %r" % (time.time() - t_rq, got1))
        check_run(1, got1)
        end = time.time() + 20
        while time.time() < end and "batch end run=1" not in spotlib.read_text(out):
            time.sleep(0.2)
        text = spotlib.read_text(out)
        starts = re.findall(r"^batch run=(\d) host=(\S+)", text, re.M)
        c.check([r for r, _ in starts] == ["0", "1"],
                "the batch script ran twice (requeued once)", text[-2000:])
        c.check("batch end run=1" in text, "run 1 ended", text[-2000:])
    finally:
        if started:
            cp = spotlib.run(["bash", spotlib.srcdir_path("tests", "slurm.sh"), "stop", sdir],
                             timeout=90)
            c.check(cp.returncode == 0, "tests/slurm.sh stop", cp.stderr[-2000:])
            left = net_leftovers(env_vals)
            c.check(not left, "no namespace, bridge or veth left", repr(left))
            c.check(os.listdir(sdir) == [], "the cluster's folder is empty",
                    repr(os.listdir(sdir)))
            ps = slurm("ps", "-eo", "pid,args").stdout
            c.check(sdir not in ps, "no daemon of the cluster left",
                    "\n".join(x for x in ps.splitlines() if sdir in x))
        shutil.rmtree(sdir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        spotlib.s3_cleanup(root)
        print("elapsed %.1f s" % (time.time() - t0))
    c.finish()


if __name__ == "__main__":
    main()
