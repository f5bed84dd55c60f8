#!/usr/bin/python3
"""Bad input to push and restore: each gets one clear line on stderr, a
non-zero exit and no partial commit (no manifest, no LATEST).

  - a missing DIR, and a DIR that is a file;
  - an unreadable file: the tests run as root, who reads anything, so
    spotctl runs as `nobody` (setpriv) on a folder it may enter that holds
    one 0600 root file;
  - symlinks: relative ones inside the folder (a loop, a link to a parent
    folder, a dangling one) stored and restored as links; an absolute one,
    or one leaving the folder, fails the push naming it, unless
    --follow-symlinks stores the file's content;
  - a file that grows while it is pushed (a writer appends during a slow
    --parallel 1 push): detected, the push fails;
  - a name with '/' or '..' (also a '..' base name of DIR);
  - a store URL without a job;
  - restore of a name that does not exist, and of a job without LATEST;
  - a disk that fills during restore: a 5 MiB tmpfs mounted by the test,
    a 12 MiB checkpoint; the temporary folder is removed."""
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("badinput")
bucket = os.environ["SPOT_TEST_S3_BUCKET"]


def nothing_committed(what):
    keys = spotlib.s3_keys(root)
    c.check(not any(k.endswith("MANIFEST.json") or k.endswith("/LATEST") for k in keys),
            "%s: nothing committed" % what, "\n".join(keys))


def one_line(stderr):
    """The message, if stderr is one "spotctl: " line (usage errors may add
    the "Try 'spotctl --help'." hint), else None."""
    lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith("Try 'spotctl")]
    return lines[0] if len(lines) == 1 and lines[0].startswith("spotctl: ") else None


def fails(cp, what, *words):
    err = cp.stderr.strip()
    c.check(cp.returncode != 0, "%s: non-zero exit" % what, cp.stdout + cp.stderr)
    c.check(one_line(err) is not None, "%s: one line on stderr" % what, err)
    c.check(all(w.lower() in err.lower() for w in words),
            "%s: the message says %r" % (what, words), err)


try:
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)

        # missing DIR, DIR a file
        cp = spotlib.spotctl("push", os.path.join(tmp, "nope"), url)
        fails(cp, "missing DIR", "nope", "no such file")
        with open(os.path.join(tmp, "afile"), "w") as f:
            f.write("x")
        cp = spotlib.spotctl("push", os.path.join(tmp, "afile"), url)
        fails(cp, "DIR is a file", "afile", "not a folder")
        nothing_committed("missing DIR")

        # an unreadable file, pushed by nobody
        d = os.path.join(tmp, "unreadable")
        os.makedirs(d)
        with open(os.path.join(d, "ok.txt"), "w") as f:
            f.write("fine\n")
        with open(os.path.join(d, "secret.bin"), "wb") as f:
            f.write(os.urandom(1000))
        os.chmod(os.path.join(d, "secret.bin"), 0o600)
        exe = os.environ.get("SPOTCTL") or spotlib.builddir_path("client", "spotctl")
        cp = spotlib.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup",
                          "--clear-groups", exe, "push", d, url], env={"HOME": "/nonexistent"})
        fails(cp, "unreadable file", "secret.bin", "permission denied")
        nothing_committed("unreadable file")

        # symlinks: never skipped silently. Relative links that
        # stay inside the folder (a loop, a link to the parent folder, a
        # dangling one, an alias of a file) are stored as links and restored
        # as links; an absolute link or one leaving the folder fails the push
        # naming it, nothing committed, unless --follow-symlinks stores the
        # file it points to.
        d = os.path.join(tmp, "links")
        os.makedirs(os.path.join(d, "sub"))
        spotlib.write_random(os.path.join(d, "sub", "data.bin"), 5000)
        os.symlink("loop-b", os.path.join(d, "loop-a"))
        os.symlink("loop-a", os.path.join(d, "loop-b"))
        os.symlink("..", os.path.join(d, "sub", "up"))
        os.symlink("sub/data.bin", os.path.join(d, "alias.bin"))
        os.symlink("../alias.bin", os.path.join(d, "sub", "back.bin"))
        os.symlink("gone.bin", os.path.join(d, "dangling"))
        cp = spotlib.spotctl("push", d, url)
        c.check(cp.returncode == 0, "links inside: the push succeeds", cp.stdout + cp.stderr)
        keys = spotlib.s3_keys(root + "checkpoints/links/")
        c.check(keys == [root + "checkpoints/links/MANIFEST.json",
                         spotlib.manifest_key(root, "links", "sub/data.bin")],
                "links inside: one object, the links are manifest entries",
                "\n".join(keys))
        import json
        m = json.loads(spotlib.s3_get(root + "checkpoints/links/MANIFEST.json"))
        links = {f["path"]: f.get("link") for f in m["files"] if f.get("link")}
        c.check(links == {"loop-a": "loop-b", "loop-b": "loop-a", "sub/up": "..",
                          "alias.bin": "sub/data.bin", "sub/back.bin": "../alias.bin",
                          "dangling": "gone.bin"},
                "links inside: the manifest records each link and its target", repr(links))
        dst = os.path.join(tmp, "links-dst")
        cp = spotlib.spotctl("restore", url, dst, "--name", "links")
        c.check(cp.returncode == 0, "links inside: restore succeeds", cp.stderr)
        got = {}
        for rel in links:
            p = os.path.join(dst, rel)
            got[rel] = os.readlink(p) if os.path.islink(p) else None
        c.check(got == links, "links inside: restored as the same symlinks", repr(got))
        if cp.returncode == 0:
            with open(os.path.join(dst, "alias.bin"), "rb") as f1, \
                    open(os.path.join(d, "sub", "data.bin"), "rb") as f2:
                c.check(f1.read() == f2.read(), "links inside: alias.bin reads the file")
        spotlib.s3_cleanup(root)

        outside = os.path.join(tmp, "outside.bin")
        with open(outside, "wb") as f:
            f.write(b"outside data\n" * 100)
        for label, target in (("absolute", outside), ("leaving", "../outside.bin"),
                              ("up-after-name", "sub/../../outside.bin")):
            d = os.path.join(tmp, "bad-" + label)
            os.makedirs(os.path.join(d, "sub"))
            with open(os.path.join(d, "ok.txt"), "w") as f:
                f.write("ok\n")
            os.symlink(target, os.path.join(d, "evil"))
            cp = spotlib.spotctl("push", d, url)
            fails(cp, "link %s" % label, "evil", "symlink", "nothing committed",
                  "--follow-symlinks")
            nothing_committed("link %s" % label)
        d = os.path.join(tmp, "bad-absolute")
        cp = spotlib.spotctl("push", d, url, "--follow-symlinks")
        c.check(cp.returncode == 0, "--follow-symlinks: the push succeeds", cp.stderr)
        dst = os.path.join(tmp, "follow-dst")
        cp = spotlib.spotctl("restore", url, dst, "--name", "bad-absolute")
        c.check(cp.returncode == 0 and not os.path.islink(os.path.join(dst, "evil")),
                "--follow-symlinks: restored as a regular file", cp.stderr)
        if cp.returncode == 0:
            with open(os.path.join(dst, "evil"), "rb") as f:
                c.check(f.read() == b"outside data\n" * 100,
                        "--follow-symlinks: with the content it pointed to")
        spotlib.s3_cleanup(root)

        # a file that grows while it is pushed
        d = os.path.join(tmp, "growing")
        os.makedirs(d)
        spotlib.write_random(os.path.join(d, "big.bin"), 40 << 20)
        log = os.path.join(d, "train.log")
        with open(log, "w") as f:
            f.write("start\n")
        stop = threading.Event()

        def writer():
            with open(log, "a") as f:
                while not stop.is_set():
                    f.write("step\n")
                    f.flush()
                    stop.wait(0.005)

        t = threading.Thread(target=writer)
        t.start()
        try:
            cp = spotlib.spotctl("push", d, url, "--parallel", "1", "--workers", "1",
                                 "--part-size", "5M")
        finally:
            stop.set()
            t.join()
        fails(cp, "growing file", "train.log", "changed")
        nothing_committed("growing file")
        c.check(spotlib.s3_uploads(root) == [], "growing file: its uploads were aborted")

        # names
        good = os.path.join(tmp, "good")
        os.makedirs(good)
        with open(os.path.join(good, "f"), "w") as f:
            f.write("x")
        for name in ("a/b", "..", "../x", "a..b/.."):
            cp = spotlib.spotctl("push", good, url, "--name", name)
            fails(cp, "name %r" % name, name)
        cp = spotlib.spotctl("push", os.path.join(good, ".."), url)
        fails(cp, "DIR with a '..' base name", "invalid checkpoint name")
        nothing_committed("bad names")

        # names that collide with spotd's own folders: push,
        # restore, list and the manifest parser refuse them alike
        for name in (".spotd-resume", ".spotd-journal", ".x"):
            cp = spotlib.spotctl("push", good, url, "--name", name)
            fails(cp, "push --name %r" % name, name, "invalid checkpoint name")
            cp = spotlib.spotctl("restore", url, os.path.join(tmp, "never"),
                                 "--name", name)
            fails(cp, "restore --name %r" % name, name, "invalid checkpoint name")
        hidden = os.path.join(tmp, ".spotd-journal")
        os.makedirs(hidden)
        cp = spotlib.spotctl("push", hidden, url)
        fails(cp, "push of a folder named .spotd-journal", "invalid checkpoint name")
        nothing_committed("dot names")
        # planted in the store by hand: a commit named .spotd-resume, LATEST
        # pointing at it
        cp = spotlib.spotctl("push", good, url, "--name", "planted")
        c.check(cp.returncode == 0, "push a checkpoint to copy", cp.stderr)
        m = spotlib.s3_get(root + "checkpoints/planted/MANIFEST.json").decode()
        spotlib.s3_put(root + "checkpoints/.spotd-resume/MANIFEST.json",
                       m.replace('"planted"', '".spotd-resume"'))
        pk = spotlib.manifest_key(root, "planted", "f")
        spotlib.s3_put(pk.replace("/planted/", "/.spotd-resume/"), spotlib.s3_get(pk))
        spotlib.s3_put(root + "LATEST", b".spotd-resume\n")
        dst = os.path.join(tmp, "dot-dst")
        cp = spotlib.spotctl("restore", url, dst)
        fails(cp, "restore with LATEST = .spotd-resume", "LATEST", "no valid checkpoint name")
        c.check(not os.path.exists(dst), "LATEST = .spotd-resume: nothing restored")
        cp = spotlib.spotctl("list", url, "--json")
        c.check(cp.returncode == 0 and ".spotd-resume" not in cp.stdout and
                "planted" in cp.stdout,
                "list: a .spotd-resume prefix is not a checkpoint", cp.stdout + cp.stderr)
        spotlib.s3_cleanup(root)

        # URLs without a job
        for u in ("s3://%s" % bucket, "s3://%s/" % bucket, "s3:///job", "http://x/y/z"):
            cp = spotlib.spotctl("push", good, u)
            c.check(cp.returncode != 0 and one_line(cp.stderr) is not None,
                    "URL %r is refused with one line" % u, cp.stderr)
            cp = spotlib.spotctl("restore", u, os.path.join(tmp, "never"))
            c.check(cp.returncode != 0 and not os.path.exists(os.path.join(tmp, "never")),
                    "restore from URL %r is refused" % u, cp.stderr)

        # restore: no LATEST yet, then a missing name
        dst = os.path.join(tmp, "dst")
        cp = spotlib.spotctl("restore", url, dst)
        fails(cp, "restore without LATEST", "no committed checkpoint")
        cp = spotlib.spotctl("push", good, url)
        c.check(cp.returncode == 0, "a good push", cp.stderr)
        cp = spotlib.spotctl("restore", url, dst, "--name", "no-such-name")
        fails(cp, "restore of a missing name", "no-such-name", "does not exist")
        c.check(not os.path.exists(dst) and not spotlib.leftovers_next_to(dst),
                "restore of a missing name writes nothing")

        # a disk too small for the checkpoint: refused before any transfer,
        # with the bytes needed and free
        big = os.path.join(tmp, "big")
        os.makedirs(big)
        spotlib.write_random(os.path.join(big, "a.bin"), 6 << 20)
        spotlib.write_random(os.path.join(big, "b.bin"), 6 << 20)
        cp = spotlib.spotctl("push", big, url, "--part-size", "5M")
        c.check(cp.returncode == 0, "a 12 MiB push", cp.stderr)
        mnt = os.path.join(tmp, "small-disk")
        os.makedirs(mnt)
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", mnt],
                           capture_output=True, text=True)
        if not c.check(m.returncode == 0, "mount a 5 MiB tmpfs", m.stderr):
            c.finish()
        try:
            dst = os.path.join(mnt, "ckpt")
            cp = spotlib.spotctl("restore", url, dst, "--name", "big")
            fails(cp, "disk full", "no space left", "nothing was fetched",
                  "bytes, ", "are free")
            c.check(os.listdir(mnt) == [], "disk full: nothing left on the disk "
                    "(no target, no temporary folder)", repr(os.listdir(mnt)))
        finally:
            subprocess.run(["umount", mnt])
finally:
    spotlib.s3_cleanup(root)

c.finish()
