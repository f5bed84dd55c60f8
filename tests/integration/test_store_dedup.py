#!/usr/bin/python3
"""push --dedup (lib/io/store/store_dedup.c): one checkpoint file in which
trainable tensors (11 % of the bytes) sit between frozen ones, as in a
LoRA state dict saved with torch.save. Every checkpoint after the first
stores at most 0.2x the bytes of the first (the manifest's stored bytes
and the objects' sizes in the store), its manifest references the first
one's object; --keep 2 retires the first, whose referenced object stays
(RETIRED marks it) while the newest restores byte-identical; once no
kept checkpoint references it, a later push's retention deletes it. An
object that is gone from the store is never referenced again."""
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("dedup")
bucket = os.environ["SPOT_TEST_S3_BUCKET"]

FROZEN = 16 << 20  # a frozen weight, e.g. 2048 x 2048 fp32
TRAIN = 1 << 20  # lora_A and lora_B, rank 128 each
LAYERS = 2


def lora_file(path, step, frozen_seed=0):
    """The same frozen bytes every step, new trainable ones, at offsets
    that are not multiples of the frame (a zip entry's header first)."""
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04" + bytes(123))
        for layer in range(LAYERS):
            f.write(random.Random(frozen_seed * 100 + layer).randbytes(FROZEN))
            f.write(bytes(37))
            for ab in range(2):
                f.write(random.Random(1000 * step + 10 * layer + ab).randbytes(TRAIN))


def objects(name):
    """{key: size} of checkpoint name's objects, the manifest left out."""
    pages = spotlib.s3().get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=root + "checkpoints/%s/" % name)
    return {o["Key"]: o["Size"] for p in pages for o in p.get("Contents", [])
            if not o["Key"].endswith("/MANIFEST.json")}


def manifest(name):
    return json.loads(spotlib.s3_get(root + "checkpoints/%s/MANIFEST.json" % name))


try:
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {}
        stored = {}
        for step in (1, 2, 3):
            n = "step-%d" % step
            d = srcs[n] = os.path.join(tmp, n)
            os.makedirs(d)
            lora_file(os.path.join(d, "model.pt"), step)
            with open(os.path.join(d, "config.json"), "w") as f:
                f.write('{"step": %d}\n' % step)
            open(os.path.join(d, "EMPTY"), "w").close()
            cp = spotlib.spotctl("push", d, url, "--dedup", "--keep", "2")
            c.check(cp.returncode == 0, "push %s --dedup" % n, cp.stdout + cp.stderr)
            if step < 3:
                m = manifest(n)
                stored[n] = (m["totals"]["stored_bytes"], sum(objects(n).values()))
                c.check(m["version"] == 2 and all(
                    "sha256" in fr for f in m["files"] if f["path"] == "model.pt"
                    for fr in f["frames"]), "%s: version 2, every frame hashed" % n)
            else:
                m = manifest(n)
                stored[n] = (m["totals"]["stored_bytes"], sum(objects(n).values()))
        whole = os.path.getsize(os.path.join(srcs["step-1"], "model.pt"))
        c.check(stored["step-1"][0] >= whole, "the first checkpoint stores it whole",
                repr(stored))
        for n in ("step-2", "step-3"):
            c.check(stored[n][0] <= 0.2 * stored["step-1"][0] and
                    stored[n][1] <= 0.2 * stored["step-1"][1],
                    "%s adds <= 0.2x the bytes of the first" % n, repr(stored))
        m3 = manifest("step-3")
        refs = m3.get("refs", [])
        c.check([r["name"] for r in refs] == ["step-1"],
                "step-3 references step-1's object (not step-2's copy)", repr(refs))
        c.check(m3["totals"]["ref_bytes"] + m3["totals"]["stored_bytes"] >= whole,
                "ref_bytes + stored cover the file", repr(m3["totals"]))
        # --keep 2: step-1's manifest is gone, its referenced object stays
        left = objects("step-1")
        ref_key = root + "checkpoints/step-1/" + refs[0]["key"] if refs else ""
        c.check(ref_key in left and root + "checkpoints/step-1/RETIRED" in left,
                "retired step-1 keeps the referenced object and RETIRED",
                "\n".join(left))
        cp = spotlib.spotctl("list", url, "--json")
        lj = json.loads(cp.stdout) if cp.returncode == 0 else {}
        committed = sorted(e["name"] for e in lj.get("checkpoints", []) if e["committed"])
        c.check(committed == ["step-2", "step-3"], "step-1 is no longer committed",
                cp.stdout + cp.stderr)
        spotlib.check_restore(c, url, srcs["step-3"], os.path.join(tmp, "r3"),
                              "the newest restores byte-identical after step-1 retired")
        spotlib.check_restore(c, url, srcs["step-2"], os.path.join(tmp, "r2"),
                              "step-2 restores byte-identical", "--name", "step-2")
        # two checkpoints that share nothing with step-1: once they are the
        # kept ones, step-1's objects and RETIRED are collected
        for step in (4, 5):
            n = "step-%d" % step
            d = os.path.join(tmp, n)
            os.makedirs(d)
            with open(os.path.join(d, "model.pt"), "wb") as f:
                f.write(random.Random(step).randbytes(3 << 20))
            cp = spotlib.spotctl("push", d, url, "--dedup", "--keep", "2")
            c.check(cp.returncode == 0, "push %s --dedup" % n, cp.stdout + cp.stderr)
        for n in ("step-1", "step-2", "step-3"):
            left = spotlib.s3_keys(root + "checkpoints/%s/" % n)
            c.check(left == [], "%s: collected once no kept checkpoint references it" % n,
                    "\n".join(left))
        # a referenced object that is gone is not referenced again: the
        # next checkpoint uploads those frames (one warning line)
        d = os.path.join(tmp, "step-5")
        gone = [k for k in objects("step-5") if k.endswith(".zst")]
        for k in gone:
            spotlib.s3().delete_object(Bucket=bucket, Key=k)
        cp = spotlib.spotctl("push", d, url, "--dedup", "-n", "step-6")
        c.check(cp.returncode == 0 and len(gone) == 1 and
                "cannot be referenced" in cp.stderr and
                manifest("step-6")["totals"]["stored_bytes"] >= 3 << 20,
                "a missing object is not referenced, its frames are sent",
                cp.stdout + cp.stderr)
        spotlib.check_restore(c, url, d, os.path.join(tmp, "r6"),
                              "and that checkpoint restores")
finally:
    spotlib.s3_cleanup(root)

# spotd with dedup = true (--dedup): a trainer that saves the LoRA-like
# file three times; each commit after the first stores <= 0.2x of it,
# and the newest restores byte-identical.
DAEMON_TRAINER = r"""
import os, random, sys, time
ck = os.environ["SPOTD_CKPT_DIR"]
for step in (1, 2, 3):
    d = os.path.join(ck, "step-%06d" % step)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "model.pt"), "wb") as f:
        f.write(b"PK\x03\x04" + bytes(123))
        for layer in range(2):
            f.write(random.Random(layer).randbytes(8 << 20))
            f.write(bytes(37))
            for ab in range(2):
                f.write(random.Random(1000 * step + 10 * layer + ab)
                        .randbytes(512 << 10))
    with open(os.path.join(d, "SPOTD_COMPLETE"), "w") as f:
        f.write("step=%d\n" % step)
    time.sleep(3)
"""

store, job, prefix = spotlib.daemon_job("dedupd")
try:
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "trainer.py")
        with open(script, "w") as f:
            f.write(DAEMON_TRAINER)
        d = spotlib.Daemon(os.path.join(tmp, "node"), store, job,
                           cmd=[spotlib.PY3, script], args=["--dedup"])
        rc = d.wait_exit(120)
        names = spotlib.committed(prefix)
        c.check(rc == 0 and names == ["step-000001", "step-000002",
                                      "step-000003"] and
                spotlib.latest(prefix) == "step-000003",
                "spotd --dedup: three commits, LATEST step-000003",
                "rc=%s %r\n%s" % (rc, names, d.err.text()[-3000:]))
        got = {}
        for n in names:
            m = json.loads(spotlib.s3_get(prefix + "checkpoints/%s/"
                                          "MANIFEST.json" % n))
            got[n] = m["totals"]["stored_bytes"]
        c.check(len(got) == 3 and all(
            got[n] <= 0.2 * got["step-000001"]
            for n in ("step-000002", "step-000003")),
            "spotd --dedup: each commit after the first stores <= 0.2x of "
            "the first", repr(got))
        expect = os.path.join(tmp, "expect")
        os.makedirs(expect)
        src = os.path.join(d.ckpt_dir, "step-000003")
        for fn in os.listdir(src):
            if fn != "SPOTD_COMPLETE":
                with open(os.path.join(src, fn), "rb") as a, \
                        open(os.path.join(expect, fn), "wb") as b:
                    b.write(a.read())
        spotlib.check_restore(c, store + "/" + job, expect,
                              os.path.join(tmp, "r"),
                              "spotd --dedup: the newest restores "
                              "byte-identical")
finally:
    spotlib.s3_cleanup(prefix)
c.finish()
