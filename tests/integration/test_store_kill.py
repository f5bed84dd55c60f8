#!/usr/bin/python3
"""A push killed with SIGKILL mid-way (parts already uploaded) leaves no
committed checkpoint of that name; LATEST still names the previous one;
`spotctl list` shows the name as an uncommitted leftover (or not at all);
restore gets the previous checkpoint; restoring the killed name fails; and
pushing the name again afterwards commits it."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("kill")
b = os.environ["SPOT_TEST_S3_BUCKET"]

try:
    with tempfile.TemporaryDirectory() as tmp:
        first = os.path.join(tmp, "step-1")
        os.makedirs(first)
        spotlib.write_gaussian(os.path.join(first, "w.fp32"), 6 << 20, seed=1)
        cp = spotlib.spotctl("push", first, url)
        c.check(cp.returncode == 0, "first push commits", cp.stdout + cp.stderr)

        second = os.path.join(tmp, "step-2")
        os.makedirs(second)
        spotlib.write_random(os.path.join(second, "big.bin"), 400 << 20)
        p = spotlib.spotctl_popen("push", second, url, "--part-size", "5M",
                                  "--parallel", "1", "--workers", "1",
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        parts = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None:
            ups = [u for u in spotlib.s3_uploads(root) if u[0].endswith("big.bin.zst")]
            parts = max([u[2] for u in ups] + [0])
            if parts >= 2:
                break
            time.sleep(0.05)
        still_running = p.poll() is None
        p.send_signal(signal.SIGKILL)
        p.communicate()
        c.check(still_running and parts >= 2,
                "the push was killed mid-way (%d parts uploaded)" % parts)

        keys = spotlib.s3_keys(root)
        c.check(root + "checkpoints/step-2/MANIFEST.json" not in keys,
                "no manifest: step-2 is not committed", "\n".join(keys))
        c.check(spotlib.s3_get(root + "LATEST").decode().strip() == "step-1",
                "LATEST still names step-1")
        cp = spotlib.spotctl("list", url, "--json")
        try:
            lj = json.loads(cp.stdout)
        except ValueError:
            lj = {}
        ent = {e["name"]: e for e in lj.get("checkpoints", [])}
        c.check(cp.returncode == 0 and ent.get("step-1", {}).get("committed")
                and ent["step-1"]["latest"], "list: step-1 committed and LATEST",
                cp.stdout + cp.stderr)
        c.check("step-2" not in ent or not ent["step-2"]["committed"],
                "list: step-2 absent or uncommitted", cp.stdout)
        cp = spotlib.spotctl("list", url)
        c.check(all("leftover" in ln for ln in cp.stdout.splitlines() if "step-2" in ln),
                "list (text) calls step-2 an uncommitted leftover if it shows it",
                cp.stdout)

        dst = os.path.join(tmp, "restored")
        cp = spotlib.spotctl("restore", url, dst)
        ok, detail = spotlib.same_tree(first, dst)
        c.check(cp.returncode == 0 and ok and "restored step-1" in cp.stdout,
                "restore (LATEST) restores step-1", cp.stdout + cp.stderr + detail)
        dst2 = os.path.join(tmp, "never")
        cp = spotlib.spotctl("restore", url, dst2, "--name", "step-2")
        c.check(cp.returncode != 0 and "step-2" in cp.stderr and not os.path.exists(dst2),
                "restore of the killed name fails and writes nothing", cp.stderr)

        # push it again, smaller: the leftover does not get in the way
        os.unlink(os.path.join(second, "big.bin"))
        spotlib.write_gaussian(os.path.join(second, "w.fp32"), 7 << 20, seed=2)
        cp = spotlib.spotctl("push", second, url)
        c.check(cp.returncode == 0, "pushing step-2 again commits", cp.stdout + cp.stderr)
        spotlib.check_restore(c, url, second, os.path.join(tmp, "again"),
                              "and restores exactly (no stale object mixed in)")
finally:
    spotlib.s3_cleanup(root)

c.finish()
