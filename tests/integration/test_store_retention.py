#!/usr/bin/python3
"""Retention: four pushes with --keep 2 leave exactly the two newest
committed, with all their objects; every object of the older two is gone;
LATEST names the newest; the kept ones restore exactly."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("retention")
names = ["step-%d" % i for i in (100, 200, 300, 400)]

try:
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {}
        keys_of = {}
        for i, n in enumerate(names):
            d = os.path.join(tmp, n)
            os.makedirs(os.path.join(d, "sub"))
            spotlib.write_gaussian(os.path.join(d, "w.fp32"), (11 << 20) + 4 * i, seed=i)
            with open(os.path.join(d, "sub", "state.json"), "w") as f:
                f.write('{"step": %d}\n' % i)
            open(os.path.join(d, "sub", "EMPTY"), "w").close()
            srcs[n] = d
            cp = spotlib.spotctl("push", d, url, "--keep", "2", "--part-size", "5M")
            c.check(cp.returncode == 0, "push %s with --keep 2" % n, cp.stdout + cp.stderr)
            keys_of[n] = spotlib.s3_keys(root + "checkpoints/%s/" % n)
            # the created time has second precision: keep the order unambiguous
            if i < len(names) - 1:
                import time
                time.sleep(1.1)
        c.check(all(len(keys_of[n]) == 3 for n in names),
                "each checkpoint had 2 objects + a manifest when pushed",
                repr({n: len(k) for n, k in keys_of.items()}))
        cp = spotlib.spotctl("list", url, "--json")
        lj = json.loads(cp.stdout) if cp.returncode == 0 else {}
        committed = sorted(e["name"] for e in lj.get("checkpoints", []) if e["committed"])
        c.check(committed == names[2:], "only the 2 newest remain committed",
                cp.stdout + cp.stderr)
        c.check(lj.get("latest") == names[-1], "LATEST names the newest", repr(lj.get("latest")))
        for n in names[2:]:
            c.check(spotlib.s3_keys(root + "checkpoints/%s/" % n) == keys_of[n],
                    "%s keeps all its objects" % n)
        for n in names[:2]:
            left = spotlib.s3_keys(root + "checkpoints/%s/" % n)
            c.check(left == [], "%s: every object is gone" % n, "\n".join(left))
        for n in names[2:]:
            spotlib.check_restore(c, url, srcs[n], os.path.join(tmp, "r-" + n),
                                  "%s restores exactly" % n, "--name", n)
        # --keep 1 on a fifth push deletes down to one
        d = os.path.join(tmp, "step-500")
        os.makedirs(d)
        spotlib.write_gaussian(os.path.join(d, "w.fp32"), 1 << 20, seed=9)
        cp = spotlib.spotctl("push", d, url, "--keep", "1")
        lj = json.loads(spotlib.spotctl("list", url, "--json").stdout)
        c.check(cp.returncode == 0 and
                [e["name"] for e in lj["checkpoints"] if e["committed"]] == ["step-500"],
                "--keep 1 keeps only the checkpoint just pushed", cp.stdout + cp.stderr)
finally:
    spotlib.s3_cleanup(root)

c.finish()
