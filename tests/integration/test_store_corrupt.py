#!/usr/bin/python3
"""Corruption: flip one byte of a stored object (re-uploaded with boto3)
and restore must fail naming the file and the part, exit non-zero, leave
the target folder absent and no temporary folder next to it. Two cases: a
compressed frame (the decoder or the CRC32C catches it) and a raw frame
(it decodes; only the CRC32C catches it)."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("corrupt")
PART = 5 << 20

try:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "ckpt")
        os.makedirs(os.path.join(src, "model"))
        spotlib.write_gaussian(os.path.join(src, "model", "w.fp32"), 3 * PART - 40, seed=5)
        spotlib.write_random(os.path.join(src, "rng.bin"), 2 * PART + 99)
        with open(os.path.join(src, "meta.json"), "w") as f:
            f.write('{"step": 100}\n')
        # one object per file (packs: test_store_pack.py)
        cp = spotlib.spotctl("push", src, url, "--part-size", "5M",
                             "--pack-threshold", "0")
        c.check(cp.returncode == 0, "push succeeds", cp.stdout + cp.stderr)
        man = json.loads(spotlib.s3_get(root + "checkpoints/ckpt/MANIFEST.json"))
        byp = {f["path"]: f for f in man["files"]}

        for rel, frame, why in (("model/w.fp32", 1, "compressed frame"),
                                ("rng.bin", 2, "raw frame")):
            key = root + "checkpoints/ckpt/" + byp[rel]["key"]
            good = spotlib.s3_get(key)
            fr = byp[rel]["frames"][frame]
            # the middle of the frame's zstd block data, away from headers
            pos = fr["comp_off"] + min(fr["comp_len"], fr["raw_len"]) // 2
            bad = bytearray(good)
            bad[pos] ^= 0x20
            spotlib.s3_put(key, bytes(bad))

            dst = os.path.join(tmp, "restored")
            cp = spotlib.spotctl("restore", url, dst)
            err = cp.stderr
            c.check(cp.returncode != 0, "%s: restore fails" % why, cp.stdout + err)
            c.check(("%s part %d" % (rel, frame + 1)) in err,
                    "%s: the message names the file and the part" % why, err)
            c.check(len(err.strip().splitlines()) == 1, "%s: one line on stderr" % why, err)
            c.check(not os.path.exists(dst), "%s: the target does not exist" % why)
            c.check(not spotlib.leftovers_next_to(dst),
                    "%s: no temporary folder left next to it" % why,
                    repr(os.listdir(tmp)))
            spotlib.s3_put(key, good)

        # an existing empty target folder stays as it was on failure too
        dst = os.path.join(tmp, "keep-me")
        os.mkdir(dst)
        key = root + "checkpoints/ckpt/" + byp["meta.json"]["key"]
        good = spotlib.s3_get(key)
        spotlib.s3_put(key, good[:-3])  # truncated
        cp = spotlib.spotctl("restore", url, dst)
        c.check(cp.returncode != 0 and "meta.json part 1" in cp.stderr,
                "truncated object: restore fails naming it", cp.stderr)
        c.check(os.path.isdir(dst) and os.listdir(dst) == [], "the empty target is untouched")
        c.check(not spotlib.leftovers_next_to(dst), "no temporary folder left")
        spotlib.s3_put(key, good)

        # repaired: the restore works again
        spotlib.check_restore(c, url, src, os.path.join(tmp, "ok"),
                              "after repair the restore is exact")
finally:
    spotlib.s3_cleanup(root)

c.finish()
