#!/usr/bin/python3
"""Round trip of a checkpoint through the real S3 server: push a folder
with empty files, nested folders, a file of exactly one part, a multi-part
fp32 tensor, bf16 data, random bytes and text; list it; restore it and
compare bytes and modes. Independently (boto3, the zstd CLI): the manifest
records a CRC32C per frame and the right filter per file, and an
unfiltered object is a plain zstd stream."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("roundtrip")
PART = 5 << 20  # the smallest part S3 allows: small files, several parts


def crc32c(data):
    """Bitwise CRC32C (Castagnoli), independent of lib/crc32c.c."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


files = {
    # path: (maker, size, mode)
    "empty": ("empty", 0, 0o644),
    "nested/a/b/also-empty": ("empty", 0, 0o600),
    "nested/a/b/c/notes.txt": ("text", 1234, 0o640),
    "one-part.fp32": ("fp32", PART, 0o644),
    "model/weights.fp32": ("fp32", 3 * PART + 4 * 1000 + 4, 0o644),
    "model/weights.bf16": ("bf16", 2 * PART + 6, 0o600),
    "random.bin": ("random", PART + 12345, 0o755),
    "log.txt": ("text", 2 * PART + 300007, 0o644),
}

try:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "step-100")
        for rel, (kind, size, mode) in files.items():
            p = os.path.join(src, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            if kind == "empty":
                open(p, "wb").close()
            elif kind == "fp32":
                spotlib.write_gaussian(p, size, "float32", seed=len(rel))
            elif kind == "bf16":
                spotlib.write_gaussian(p, size, "bfloat16", seed=3)
            elif kind == "random":
                spotlib.write_random(p, size)
            else:
                line = b"step %d loss 2.%04d lr 3e-4 tokens/s 51234\n"
                text = b"".join(line % (i, i * 7919 % 10000) for i in range(size // 30 + 1))
                with open(p, "wb") as f:
                    f.write(text[:size])
            os.chmod(p, mode)
        raw_total = sum(s for _, s, _ in files.values())

        # the layout of one object per file (packs: test_store_pack.py)
        cp = spotlib.spotctl("push", src, url, "--part-size", "5M", "--parallel", "3",
                             "--pack-threshold", "0")
        c.check(cp.returncode == 0, "push succeeds", cp.stdout + cp.stderr)
        c.check("pushed step-100: 8 files" in cp.stdout,
                "push prints one summary line naming the checkpoint", cp.stdout)

        # LATEST and the manifest, read by boto3
        latest = spotlib.s3_get(root + "LATEST").decode().strip()
        c.check(latest == "step-100", "LATEST names the checkpoint", latest)
        man = json.loads(spotlib.s3_get(root + "checkpoints/step-100/MANIFEST.json"))
        byp = {f["path"]: f for f in man["files"]}
        c.check(sorted(byp) == sorted(files), "manifest lists every file", repr(sorted(byp)))
        want_filter = {"fp32": "bytegroup4", "bf16": "bytegroup2", "random": "none",
                       "text": "none", "empty": "none"}
        for rel, (kind, size, mode) in files.items():
            f = byp.get(rel, {})
            c.check(f.get("size") == size and f.get("mode") == mode,
                    "%s: size and mode in the manifest" % rel, repr(f)[:300])
            c.check(f.get("filter") == want_filter[kind],
                    "%s: filter %s" % (rel, want_filter[kind]), repr(f.get("filter")))
            frames = f.get("frames", [])
            nparts = (size + PART - 1) // PART
            c.check(len(frames) == nparts, "%s: %d frame(s)" % (rel, nparts), repr(frames)[:300])
            c.check(all(isinstance(fr.get("crc32c"), int) for fr in frames),
                    "%s: a crc32c per frame" % rel)
            c.check(all(fr["raw_off"] == i * PART for i, fr in enumerate(frames)),
                    "%s: frames tile the file in part-size steps" % rel)
        small = byp.get("nested/a/b/c/notes.txt")
        with open(os.path.join(src, "nested/a/b/c/notes.txt"), "rb") as f:
            c.check(small is not None and small["frames"][0]["crc32c"] == crc32c(f.read()),
                    "crc32c of a frame matches an independent CRC32C of the raw bytes")
        c.check("key" not in byp.get("empty", {}), "an empty file has no object")

        # objects: one per non-empty file; single PUT vs multipart
        keys = spotlib.s3_keys(root + "checkpoints/step-100/")
        want_keys = sorted([root + "checkpoints/step-100/" + byp[r]["key"]
                            for r, (_, s, _) in files.items() if s > 0] +
                           [root + "checkpoints/step-100/MANIFEST.json"])
        c.check(keys == want_keys, "one object per non-empty file + the manifest",
                "\n".join(keys))
        b = os.environ["SPOT_TEST_S3_BUCKET"]
        etag1 = spotlib.s3().head_object(
            Bucket=b, Key=spotlib.manifest_key(root, "step-100", "one-part.fp32"))["ETag"]
        etagn = spotlib.s3().head_object(
            Bucket=b, Key=spotlib.manifest_key(root, "step-100", "model/weights.fp32"))["ETag"]
        c.check("-" not in etag1, "a one-part file is a single PUT", etag1)
        c.check(etagn.strip('"').endswith("-4"), "a 4-part file is a 4-part multipart upload",
                etagn)
        stored = 0
        for k in keys:
            if not k.endswith("MANIFEST.json"):
                stored += spotlib.s3().head_object(Bucket=b, Key=k)["ContentLength"]
        c.check(stored == man["totals"]["stored_bytes"],
                "manifest's stored_bytes equals the objects' sizes",
                "%d vs %r" % (stored, man["totals"]))

        # independent zstd -d of unfiltered objects (compressed text, raw random)
        for rel in ("log.txt", "random.bin"):
            obj = spotlib.s3_get(spotlib.manifest_key(root, "step-100", rel))
            z = subprocess.run(["zstd", "-d", "-c", "-q"], input=obj, capture_output=True)
            with open(os.path.join(src, rel), "rb") as f:
                want = f.read()
            c.check(z.returncode == 0 and z.stdout == want,
                    "zstd -d of the %s object reproduces the file" % rel,
                    z.stderr.decode()[:300])
        for rel in ("log.txt", "model/weights.bf16"):
            fr = byp[rel]["frames"]
            c.check(all(x["comp_len"] >= PART for x in fr[:-1]),
                    "%s: every stored part but the last is >= 5 MiB (S3's minimum)" % rel,
                    repr([x["comp_len"] for x in fr]))
        txt = byp["log.txt"]
        c.check(txt["frames"][-1]["comp_len"] < txt["frames"][-1]["raw_len"] * 3 // 4,
                "text is compressed (its last, unpadded frame)", repr(txt["frames"][-1]))

        # list: the row, the LATEST mark, raw and stored bytes
        cp = spotlib.spotctl("list", url)
        row = [ln for ln in cp.stdout.splitlines() if "step-100" in ln and "LATEST" not in ln]
        c.check(cp.returncode == 0 and len(row) == 1 and row[0].startswith("*")
                and " 8 " in row[0], "list shows the row marked LATEST with 8 files",
                cp.stdout + cp.stderr)
        cp = spotlib.spotctl("list", url, "--json")
        try:
            lj = json.loads(cp.stdout)
        except ValueError:
            lj = {}
        ent = [e for e in lj.get("checkpoints", []) if e.get("name") == "step-100"]
        c.check(lj.get("latest") == "step-100" and len(ent) == 1 and ent[0]["latest"]
                and ent[0]["committed"] and ent[0]["files"] == 8
                and ent[0]["raw_bytes"] == raw_total
                and ent[0]["stored_bytes"] == stored,
                "list --json: committed, LATEST, 8 files, raw and stored bytes",
                cp.stdout + cp.stderr)

        # restore (LATEST) and by name; bytes and modes
        dst = os.path.join(tmp, "restored")
        cp = spotlib.spotctl("restore", url, dst)
        c.check(cp.returncode == 0, "restore of LATEST succeeds", cp.stdout + cp.stderr)
        # spotctl writes whole blocks with O_DIRECT (--page-cache: through
        # the cache); looked at before anything reads the files
        dst3 = os.path.join(tmp, "cached")
        cp3 = spotlib.spotctl("restore", url, dst3, "--page-cache")
        c.check(cp3.returncode == 0, "restore --page-cache succeeds", cp3.stdout + cp3.stderr)
        if spotlib.direct_io_cache_free(tmp):
            rel = "model/weights.fp32"
            direct = spotlib.cached_pages(os.path.join(dst, rel), PART)
            cached = spotlib.cached_pages(os.path.join(dst3, rel), PART)
            c.check(direct == 0, "restore: the first part of %s is not in the page cache "
                    "(written with O_DIRECT)" % rel, "%r pages cached" % direct)
            c.check(cached is not None and cached > 0,
                    "restore --page-cache: it is in the page cache", "%r pages" % cached)
        else:
            print("note: %s does not take O_DIRECT apart from its page cache: the "
                  "page-cache checks are skipped" % tmp)
        ok, detail = spotlib.same_tree(src, dst3)
        c.check(ok, "restore --page-cache: the folder equals the source", detail)
        ok, detail = spotlib.same_tree(src, dst)
        c.check(ok, "restored folder equals the source (bytes, modes, folders)", detail)
        c.check(os.stat(os.path.join(dst, "random.bin")).st_mtime_ns ==
                os.stat(os.path.join(src, "random.bin")).st_mtime_ns, "mtime kept")
        dst2 = os.path.join(tmp, "by-name")
        os.mkdir(dst2)  # an empty folder is fine too
        cp = spotlib.spotctl("restore", url, dst2, "--name", "step-100", "--parallel", "1",
                             "--workers", "1")
        ok, detail = spotlib.same_tree(src, dst2)
        c.check(cp.returncode == 0 and ok, "restore by name into an empty folder",
                cp.stdout + cp.stderr + detail)
        c.check(not spotlib.leftovers_next_to(dst) and not spotlib.leftovers_next_to(dst2),
                "no temporary folder left")

        # restore into a non-empty folder is refused and leaves it alone
        cp = spotlib.spotctl("restore", url, src)
        c.check(cp.returncode != 0 and "already exists" in cp.stderr,
                "restore into a non-empty folder is refused", cp.stderr)
        # a committed name is never overwritten
        cp = spotlib.spotctl("push", src, url)
        c.check(cp.returncode != 0 and "already committed" in cp.stderr,
                "pushing a committed name again is refused", cp.stderr)
        man2 = spotlib.s3_get(root + "checkpoints/step-100/MANIFEST.json")
        c.check(json.loads(man2) == man, "the committed manifest is unchanged")
finally:
    spotlib.s3_cleanup(root)

c.finish()
