#!/usr/bin/python3
"""Small files packed (README "Store layout"), against the real S3 server:

1. a folder of thousands of small files and a few big ones round-trips
   (bytes, modes, mtimes to the nanosecond); the small files live in a
   few pack objects (a pack spanning several multipart parts), the big
   ones keep an object each, readable with plain `zstd -d`;
2. a byte flipped inside a pack, then a pack cut short: restore refuses
   with a line naming the pack, the target is left as it was;
3. --pack-threshold 0 pushes the old layout (one object per file, no
   "packs" in the manifest), which restores as before;
4. list counts the packed files, and retention deletes packs with the
   rest of an old checkpoint."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("pack")
PART = 5 << 20
NSMALL = 2400


def make_tree(src, nsmall, big=True):
    """nsmall small files (text and random, 1 B .. 9 KiB, nested, various
    modes and nanosecond mtimes), an empty file, a link; big files."""
    import random
    rnd = random.Random(15)
    os.makedirs(src)
    for i in range(nsmall):
        d = os.path.join(src, "shard-%02d" % (i % 7), "sub" if i % 3 else "")
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "f%05d.%s" % (i, "json" if i % 2 else "bin"))
        size = 1 + rnd.randrange(9 * 1024)
        with open(p, "wb") as f:
            if i % 2:
                f.write((b'{"step": %d, "lr": 0.0003}\n' % i) * (size // 27 + 1))
                f.truncate(size)
            else:
                f.write(os.urandom(size))
        os.chmod(p, (0o600, 0o644, 0o755, 0o640)[i % 4])
        t = 1700000000123456789 + i * 1000003
        os.utime(p, ns=(t, t))
    open(os.path.join(src, "EMPTY"), "w").close()
    os.symlink("shard-00/f00000.bin", os.path.join(src, "link.bin"))
    if big:
        spotlib.write_gaussian(os.path.join(src, "model.fp32"), 2 * PART + 77, seed=3)
        spotlib.write_random(os.path.join(src, "rng.bin"), PART + 5)
        # just over the default threshold: an object of its own
        spotlib.write_random(os.path.join(src, "opt.bin"), (1 << 20) + 1)


def mtimes(root_dir):
    out = {}
    for d, _, files in os.walk(root_dir):
        for n in files:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root_dir)] = os.lstat(p).st_mtime_ns
    return out


def manifest(name):
    return json.loads(spotlib.s3_get(root + "checkpoints/%s/MANIFEST.json" % name))


def restore_fails(what, dst, *want):
    cp = spotlib.spotctl("restore", url, dst, "--name", "c1")
    err = cp.stderr
    c.check(cp.returncode != 0, "%s: restore fails" % what, cp.stdout + err)
    c.check(all(w in err for w in want), "%s: the message says %r" % (what, want), err)
    c.check(len(err.strip().splitlines()) == 1, "%s: one line on stderr" % what, err)
    c.check(not spotlib.leftovers_next_to(dst),
            "%s: no temporary folder left next to the target" % what)


try:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "c1")
        make_tree(src, NSMALL)

        # ---- 1. round trip
        cp = spotlib.spotctl("push", src, url, "--part-size", "5M")
        c.check(cp.returncode == 0, "push succeeds", cp.stdout + cp.stderr)
        c.check(("pushed c1: %d files" % (NSMALL + 5)) in cp.stdout,
                "the summary counts files, not packs", cp.stdout)
        m = manifest("c1")
        byp = {f["path"]: f for f in m["files"]}
        packs = {p["key"]: p["stored"] for p in m.get("packs", [])}
        small = [f for f in m["files"] if 0 < f["size"] < (1 << 20) and "link" not in f]
        c.check(len(small) == NSMALL and all("pack" in f and "key" not in f for f in small),
                "every small file is packed", repr(small[:2]))
        c.check(all(f["pack"] in packs for f in small), "their packs are listed")
        c.check(all("key" in byp[p] and "pack" not in byp[p]
                    for p in ("model.fp32", "rng.bin", "opt.bin")),
                "big files keep an object each")
        c.check("key" not in byp["EMPTY"] and "pack" not in byp["EMPTY"],
                "an empty file has no object")
        keys = spotlib.s3_keys(root + "checkpoints/c1/")
        pack_keys = [k for k in keys if k.endswith(".pack")]
        c.check(len(keys) == 1 + 3 + len(packs) and len(packs) <= 2,
                "a few objects: manifest, 3 big files, %d pack(s) for %d files"
                % (len(packs), NSMALL), "\n".join(keys))
        c.check(sorted(root + "checkpoints/c1/" + k for k in packs) == pack_keys,
                "the pack objects are the manifest's")
        b = os.environ["SPOT_TEST_S3_BUCKET"]
        heads = {k: spotlib.s3().head_object(Bucket=b, Key=k) for k in pack_keys}
        c.check(all(h["ContentLength"] == packs[k[len(root + "checkpoints/c1/"):]]
                    for k, h in heads.items()),
                "each pack's size is the manifest's \"stored\"")
        c.check(any(h["ETag"].strip('"').endswith(tuple("-%d" % n for n in range(2, 9)))
                    for h in heads.values()),
                "a pack spans several multipart parts",
                repr([h["ETag"] for h in heads.values()]))
        # a pack is a zstd stream of its files' bytes, in manifest order
        if shutil.which("zstd"):
            k = pack_keys[0]
            rel = k[len(root + "checkpoints/c1/"):]
            members = sorted((f for f in small if f["pack"] == rel),
                             key=lambda f: f["frames"][0]["comp_off"])
            want = b"".join(open(os.path.join(src, f["path"]), "rb").read()
                            for f in members)
            got = subprocess.run(["zstd", "-dc"], input=spotlib.s3_get(k),
                                 stdout=subprocess.PIPE).stdout
            c.check(got == want, "zstd -dc of a pack gives its files' bytes")
            obj = spotlib.s3_get(root + "checkpoints/c1/" + byp["opt.bin"]["key"])
            got = subprocess.run(["zstd", "-dc"], input=obj, stdout=subprocess.PIPE).stdout
            c.check(got == open(os.path.join(src, "opt.bin"), "rb").read(),
                    "a big file is still a plain zstd object")

        dst = os.path.join(tmp, "out")
        spotlib.check_restore(c, url, src, dst, "restore gives the same tree")
        mt_src, mt_dst = mtimes(src), mtimes(dst)
        c.check(mt_src == mt_dst, "mtimes restored to the nanosecond",
                repr(sorted(set(mt_src.items()) ^ set(mt_dst.items()))[:4]))
        c.check(os.readlink(os.path.join(dst, "link.bin")) == "shard-00/f00000.bin",
                "the link is restored")

        # ---- 2. corruption inside a pack
        pk = min(pack_keys)
        rel = pk[len(root + "checkpoints/c1/"):]
        good = spotlib.s3_get(pk)
        victim = next(f for f in small if f["pack"] == rel and f["path"].endswith(".bin")
                      and f["frames"][0]["comp_len"] > 64)
        fr = victim["frames"][0]
        bad = bytearray(good)
        bad[fr["comp_off"] + fr["comp_len"] // 2] ^= 0x10
        spotlib.s3_put(pk, bytes(bad))
        dst = os.path.join(tmp, "bad1")
        restore_fails("a flipped byte", dst, victim["path"], rel, "corrupt")
        c.check(not os.path.exists(dst), "a flipped byte: the target does not exist")

        # cut short: an existing empty target folder stays as it was
        spotlib.s3_put(pk, good[:len(good) // 2])
        dst = os.path.join(tmp, "bad2")
        os.mkdir(dst)
        restore_fails("a short pack", dst, rel, "shorter than the manifest says")
        c.check(os.path.isdir(dst) and os.listdir(dst) == [],
                "a short pack: the empty target is untouched")
        spotlib.s3_put(pk, good)
        spotlib.check_restore(c, url, src, os.path.join(tmp, "ok"),
                              "after repair the restore is exact")

        # ---- 3. the old layout: one object per file
        old = os.path.join(tmp, "c2")
        make_tree(old, 40, big=False)
        cp = spotlib.spotctl("push", old, url, "--pack-threshold", "0")
        c.check(cp.returncode == 0, "push --pack-threshold 0 succeeds", cp.stderr)
        m2 = manifest("c2")
        c.check("packs" not in m2 and
                all("key" in f for f in m2["files"] if f["size"] > 0),
                "--pack-threshold 0: no packs, a key per non-empty file")
        keys = spotlib.s3_keys(root + "checkpoints/c2/")
        c.check(len(keys) == 1 + 40 and not any(k.endswith(".pack") for k in keys),
                "--pack-threshold 0: one object per file", "\n".join(keys[:5]))
        dst = os.path.join(tmp, "out2")
        cp = spotlib.check_restore(c, url, old, dst, "the old layout restores",
                                   "--name", "c2")
        c.check(mtimes(old) == mtimes(dst), "the old layout: mtimes restored")

        # ---- 4. list and retention
        cp = spotlib.spotctl("list", url, "--json")
        try:
            ents = {e["name"]: e for e in json.loads(cp.stdout)["checkpoints"]}
        except (ValueError, KeyError) as e:
            ents = {}
            print(repr(e), cp.stdout)
        c.check(ents.get("c1", {}).get("files") == NSMALL + 5,
                "list counts the packed checkpoint's files", cp.stdout[:400])
        cp = spotlib.spotctl("push", old, url, "--name", "c3", "--keep", "1")
        c.check(cp.returncode == 0, "a push with --keep 1", cp.stderr)
        c.check(spotlib.s3_keys(root + "checkpoints/c1/") == [],
                "retention deletes an old checkpoint's packs too",
                "\n".join(spotlib.s3_keys(root + "checkpoints/c1/")[:5]))
        c.check(spotlib.s3_uploads(root) == [], "no multipart upload left open")
finally:
    spotlib.s3_cleanup(root)

c.finish()
