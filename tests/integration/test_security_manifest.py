#!/usr/bin/python3
"""Malicious manifests cannot make restore write outside its folder.

A legitimate checkpoint is pushed, then variants of its MANIFEST.json are
committed under new names with tests/s3check.py (the objects copied
along): a path with `..`, an absolute path, a key with `../` (reading
another checkpoint's object), a path that is also the folder of another
file, a huge size, frames that do not tile the file, a path through a
symlink planted as an earlier "file", duplicate paths. `spotctl restore`
of each must fail with one clear line, create nothing at the target, leave
no temporary folder next to it and write nothing outside it (a canary
folder beside the target stays empty)."""
import copy
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

sl.store_env()
c = sl.Checks()
url, root = sl.unique_job("evilmanifest")
bucket = os.environ["SPOT_TEST_S3_BUCKET"]


def put_variant(name, m, copy_from="good"):
    """Commits manifest m as checkpoint name, with the good one's objects."""
    m = copy.deepcopy(m)
    m["name"] = name
    for k in sl.s3_keys(root + "checkpoints/%s/" % copy_from):
        if not k.endswith("MANIFEST.json"):
            rel = k[len(root + "checkpoints/%s/" % copy_from):]
            sl.s3().copy_object(Bucket=bucket, Key=root + "checkpoints/%s/%s" % (name, rel),
                                CopySource={"Bucket": bucket, "Key": k})
            if rel == "b.bin.zst":  # a second object for path-only conflicts
                sl.s3().copy_object(Bucket=bucket,
                                    Key=root + "checkpoints/%s/other.zst" % name,
                                    CopySource={"Bucket": bucket, "Key": k})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(m, f)
        path = f.name
    cp = sl.run([sl.PY3, sl.srcdir_path("tests", "s3check.py"), "put", bucket,
                 root + "checkpoints/%s/MANIFEST.json" % name, path], timeout=60)
    os.unlink(path)
    return cp.returncode == 0


try:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(os.path.join(src, "sub"))
        with open(os.path.join(src, "sub", "a.txt"), "w") as f:
            f.write("hello\n")
        sl.write_random(os.path.join(src, "b.bin"), 100000)
        cp = sl.spotctl("push", src, url, "--name", "good")
        c.check(cp.returncode == 0, "push the legitimate checkpoint", cp.stderr)
        good = json.loads(sl.s3_get(root + "checkpoints/good/MANIFEST.json"))
        fb = next(f for f in good["files"] if f["path"] == "b.bin")
        fa = next(f for f in good["files"] if f["path"] == "sub/a.txt")

        def variant(fn):
            m = copy.deepcopy(good)
            fn(m)
            return m

        def with_file(m, f):
            m["files"].append(f)
            m["totals"]["files"] += 1
            m["totals"]["raw_bytes"] += f["size"]
            m["totals"]["stored_bytes"] += sum(fr["comp_len"] for fr in f["frames"])

        cases = {
            "dotdot": variant(lambda m: m["files"][0].update(path="../escaped.bin")),
            "dotdot-inner": variant(lambda m: m["files"][0].update(path="sub/../../escaped.bin")),
            "absolute": variant(lambda m: m["files"][0].update(path=os.path.join(tmp, "abs.bin"))),
            "key-dotdot": variant(lambda m: m["files"][0].update(
                key="../good/b.bin.zst")),
            "key-absolute": variant(lambda m: m["files"][0].update(key="/etc/passwd")),
            "file-is-folder": variant(lambda m: with_file(m, dict(copy.deepcopy(fb),
                                                                  path="b.bin/inner", key="other.zst"))),
            "folder-is-file": variant(lambda m: with_file(m, dict(copy.deepcopy(fb),
                                                                  path="sub", key="other.zst"))),
            "duplicate": variant(lambda m: with_file(m, dict(copy.deepcopy(fa),
                                                             key="other.zst"))),
            "huge-size": variant(lambda m: m["files"][0].update(size=1 << 60)),
            "frames-gap": variant(lambda m: m["files"][0]["frames"][0].update(raw_off=1)),
            "frames-short": variant(lambda m: m["files"][0]["frames"][0].update(
                raw_len=m["files"][0]["frames"][0]["raw_len"] - 1)),
            "frames-overlap": variant(lambda m: m["files"][0]["frames"].append(
                dict(m["files"][0]["frames"][0]))),
            "symlink-name": variant(lambda m: m["files"][0].update(mode=0o120777)),
        }
        for name, m in cases.items():
            ok = put_variant(name, m)
            c.check(ok, "%s: manifest committed with s3check.py" % name)
            parent = os.path.join(tmp, "r-" + name)
            os.makedirs(parent)
            os.makedirs(os.path.join(parent, "canary"))
            target = os.path.join(parent, "canary", "target")
            os.rmdir(os.path.join(parent, "canary"))
            os.makedirs(os.path.join(parent, "canary"))
            cp = sl.spotctl("restore", url, target, "--name", name, timeout=60)
            lines = [ln for ln in cp.stderr.strip().splitlines() if ln.strip()]
            c.check(cp.returncode != 0, "%s: restore refuses" % name, cp.stdout + cp.stderr)
            c.check(len(lines) >= 1 and lines[-1].startswith("spotctl: ") and
                    any(w in lines[-1].lower() for w in
                        ("manifest", "path", "key", "frame", "size", "invalid", "corrupt")),
                    "%s: a clear message: %s" % (name, lines[-1] if lines else ""), cp.stderr)
            c.check(not os.path.exists(target), "%s: nothing at the target" % name)
            left = os.listdir(os.path.join(parent, "canary"))
            c.check(left == [], "%s: nothing left next to the target" % name, repr(left))
            outside = [p for p in ("escaped.bin", "abs.bin") if
                       os.path.exists(os.path.join(parent, p)) or
                       os.path.exists(os.path.join(tmp, p))]
            c.check(not outside, "%s: nothing written outside" % name, repr(outside))
        # Mode bits: setuid/setgid/sticky never restored, no
        # group/other write beyond the umask. A pushed 4755 file, and a
        # hand-made manifest asking for 06777 and 01777.
        old_umask = os.umask(0o022)
        try:
            msrc = os.path.join(tmp, "msrc")
            os.makedirs(msrc)
            suid = os.path.join(msrc, "tool")
            with open(suid, "w") as f:
                f.write("#!/bin/sh\necho hi\n")
            os.chmod(suid, 0o4755)
            c.check(os.stat(suid).st_mode & 0o7777 == 0o4755, "the source file is 4755")
            cp = sl.spotctl("push", msrc, url, "--name", "suid")
            c.check(cp.returncode == 0, "push a 4755 file", cp.stderr)
            sm = json.loads(sl.s3_get(root + "checkpoints/suid/MANIFEST.json"))
            c.check(sm["files"][0]["mode"] == 0o4755, "the manifest records 4755",
                    repr(sm["files"][0]))
            dst = os.path.join(tmp, "r-suid")
            cp = sl.spotctl("restore", url, dst, "--name", "suid")
            c.check(cp.returncode == 0, "restore the 4755 file", cp.stderr)
            got = os.stat(os.path.join(dst, "tool")).st_mode & 0o7777 if \
                cp.returncode == 0 else None
            c.check(got == 0o755, "restored without setuid: %s" % oct(got or 0))

            def modes(m):
                m["files"][0]["mode"] = 0o6777
                m["files"][1]["mode"] = 0o1777
            evil = variant(modes)
            c.check(put_variant("modes", evil), "modes: manifest committed")
            dst = os.path.join(tmp, "r-modes")
            cp = sl.spotctl("restore", url, dst, "--name", "modes")
            c.check(cp.returncode == 0, "modes: restore of 06777/01777 succeeds "
                    "with the bits dropped", cp.stderr)
            for f in evil["files"][:2]:
                p = os.path.join(dst, f["path"])
                got = os.stat(p).st_mode & 0o7777 if os.path.exists(p) else None
                c.check(got == 0o755, "modes: %s asked %s, restored %s" %
                        (f["path"], oct(f["mode"]), oct(got or 0)))
        finally:
            os.umask(old_umask)
        # the legitimate one still restores (the test's own control)
        sl.check_restore(c, url, src, os.path.join(tmp, "ok"),
                         "control: the legitimate manifest restores identical",
                         "--name", "good")
finally:
    sl.s3_cleanup(root)
c.finish()
