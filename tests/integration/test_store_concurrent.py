#!/usr/bin/python3
"""Two pushes of two names to the same job at the same time: both commit,
LATEST names one of them, both restore exactly."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("concurrent")

try:
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {}
        for i, name in enumerate(("alpha", "beta")):
            d = os.path.join(tmp, name)
            os.makedirs(os.path.join(d, "opt"))
            spotlib.write_gaussian(os.path.join(d, "w.fp32"), (23 << 20) + 4 * i, seed=i)
            spotlib.write_gaussian(os.path.join(d, "opt", "adam.bf16"), 11 << 20, "bfloat16",
                                   seed=10 + i)
            spotlib.write_random(os.path.join(d, "rng"), 4096 + i)
            srcs[name] = d
        procs = {n: spotlib.spotctl_popen("push", d, url, "--part-size", "5M",
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)
                 for n, d in srcs.items()}
        outs = {n: p.communicate(timeout=120) for n, p in procs.items()}
        for n, p in procs.items():
            c.check(p.returncode == 0, "push %s commits" % n, "".join(outs[n]))
        cp = spotlib.spotctl("list", url, "--json")
        lj = json.loads(cp.stdout) if cp.returncode == 0 else {}
        ent = {e["name"]: e for e in lj.get("checkpoints", [])}
        c.check(all(ent.get(n, {}).get("committed") for n in srcs),
                "list shows both committed", cp.stdout + cp.stderr)
        c.check(lj.get("latest") in srcs, "LATEST names one of them", repr(lj.get("latest")))
        for n, d in srcs.items():
            spotlib.check_restore(c, url, d, os.path.join(tmp, "r-" + n),
                                  "%s restores exactly" % n, "--name", n)
        c.check(spotlib.s3_uploads(root) == [], "no multipart upload left over")
finally:
    spotlib.s3_cleanup(root)

c.finish()
