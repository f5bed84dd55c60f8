#!/usr/bin/python3
"""Two `spotctl push` of the SAME name at once, 20 times with random offsets
(docs/design.md "Push and the commit protocol"): every time exactly one commits, the other says the name
was committed by someone else, the committed checkpoint restores intact
(byte-identical to the winner's folder, every frame verified), the objects
under the name are exactly the winner's (the loser removed its own) and no
multipart upload is left."""
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

ROUNDS = 20

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("race")
rng = random.Random(int(os.environ.get("SPOT_TEST_SEED", "12")))
results = []

try:
    with tempfile.TemporaryDirectory() as tmp:
        srcs = []
        for i in range(2):
            d = os.path.join(tmp, "src%d" % i)
            os.makedirs(os.path.join(d, "opt"))
            # 2 parts of 5 MiB: a multipart upload each, plus small files
            spotlib.write_random(os.path.join(d, "w.bin"), (6 << 20) + i)
            spotlib.write_random(os.path.join(d, "opt", "adam"), 3000 + i)
            with open(os.path.join(d, "who"), "w") as f:
                f.write("src%d\n" % i)
            srcs.append(d)
        for r in range(ROUNDS):
            name = "race-%02d" % r
            offset = rng.uniform(0, 0.4)
            first = rng.randrange(2)
            procs = [None, None]
            procs[first] = spotlib.spotctl_popen(
                "push", srcs[first], url, "--name", name, "--part-size", "5M",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(offset)
            procs[1 - first] = spotlib.spotctl_popen(
                "push", srcs[1 - first], url, "--name", name, "--part-size",
                "5M", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            outs = [p.communicate(timeout=60) for p in procs]
            rcs = [p.returncode for p in procs]
            ok = [i for i in range(2) if rcs[i] == 0]
            lost = [i for i in range(2) if rcs[i] != 0]
            # the loser lost at the commit (a real race) or, when the other
            # had committed before it looked, at its name check
            msg = outs[lost[0]][1] if len(lost) == 1 else ""
            raced = "committed by someone else" in msg
            one = len(ok) == 1 and len(lost) == 1 and \
                (raced or "already committed" in msg)
            c.check(one, "%s (offset %.2f s): exactly one push commits, the "
                    "other says the name is taken" % (name, offset),
                    repr((rcs, [o[1][-300:] for o in outs])))
            if not ok:
                results.append((name, offset, False, False))
                continue
            win = ok[0]
            dst = os.path.join(tmp, "restored-" + name)
            cp = spotlib.spotctl("restore", url, dst, "--name", name)
            same, detail = spotlib.same_tree(srcs[win], dst) \
                if cp.returncode == 0 else (False, cp.stderr)
            c.check(same, "%s: the commit restores intact (src%d)" %
                    (name, win), detail)
            man = json.loads(spotlib.s3_get(
                root + "checkpoints/%s/MANIFEST.json" % name))
            want = sorted([root + "checkpoints/%s/%s" % (name, f["key"])
                           for f in man["files"] if f.get("key")] +
                          [root + "checkpoints/%s/%s" % (name, p["key"])
                           for p in man.get("packs", [])] +
                          [root + "checkpoints/%s/MANIFEST.json" % name])
            keys = spotlib.s3_keys(root + "checkpoints/%s/" % name)
            c.check(keys == want, "%s: only the winner's objects remain" %
                    name, "\n".join(sorted(set(keys) ^ set(want))))
            results.append((name, offset, one and same and keys == want,
                            raced))
        left = spotlib.s3_uploads(root)
        c.check(left == [], "no multipart upload is left", repr(left))
        good = sum(1 for r in results if r[2])
        print("RACE %d/%d rounds: exactly one intact commit (%d lost at the "
              "commit itself, %d at the name check)" %
              (good, ROUNDS, sum(1 for r in results if r[3]),
               sum(1 for r in results if r[2] and not r[3])))
finally:
    spotlib.s3_cleanup(root)
c.finish()
