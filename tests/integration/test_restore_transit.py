"""A fault in transit is not damage in the store: spotd restores the newest
commit through a loopback proxy (faultproxy.py) that flips one byte of the
first GET of the manifest, of a frame and of a pack, each once, in front of
the real Ceph. Each is fetched again (a log line says which), step-000020
is restored, nothing falls back to step-000010. Damage in the store itself
still falls back (test_restore_fallback)."""
import json
import os
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from test_restore_fallback import make  # noqa: E402  (step, data.bin)


def main():
    endpoint, _ = sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("transit")
    url = store + "/" + job
    with sl.cleaned_up(prefix):
        with tempfile.TemporaryDirectory(prefix="spotd-transit-") as wd:
            for step in (10, 20):
                src = os.path.join(wd, "src", "step-%06d" % step)
                make(src, step)
                # data.bin (300 KB) in an object of its own, step packed
                cp = sl.spotctl("push", src, url, "--pack-threshold", "64K")
                c.check(cp.returncode == 0, "push step %d" % step, cp.stderr)
            c.check(sl.latest(prefix) == "step-000020", "LATEST is step-000020")
            man = json.loads(sl.s3_get(
                prefix + "checkpoints/step-000020/MANIFEST.json"))
            keys = {f["path"]: f.get("key") or f.get("pack")
                    for f in man["files"]}
            packed = [f["path"] for f in man["files"] if f.get("pack")]
            c.check(not any(f.get("pack") for f in man["files"]
                            if f["path"] == "data.bin") and bool(packed),
                    "data.bin is an object of its own, step is in a pack",
                    repr(man["files"]))

            px = FaultProxy(endpoint, seed=3)
            try:
                # the first GET of each: one flipped byte, once
                px.configure(flip=1.0, kinds={"get"}, max_per_request=1,
                             match=["step-000020/MANIFEST.json",
                                    "step-000020/" + keys["data.bin"],
                                    "step-000020/" + keys["step"]])
                d = sl.Daemon(os.path.join(wd, "node"), store, job,
                              trainer=["--step-sleep", 1.0],
                              args=["--endpoint", px.url])
                s = d.wait_event("start", 60)
                flips = px.stats()["faults"]["flip"].get("get", 0)
                c.check(flips == 3, "the proxy flipped a byte of 3 GET bodies",
                        "flips=%s" % flips)
                c.check(s is not None and s["step"] == 20 and
                        s["env"].get("SPOTD_RESUME_DIR", "").endswith(
                            "/step-000020"),
                        "the trainer resumes from step-000020, not an older "
                        "one", repr(s))
                for what in (r"the manifest of checkpoint step-000020",
                             r"data\.bin part 1 of checkpoint step-000020",
                             r"step \(pack .*\) of checkpoint step-000020"):
                    c.check(bool(d.err.matching(
                        what + r" failed verification .*fetching it again")),
                        "the log says %s was fetched again" % what,
                        d.log()[-3000:])
                c.check(not d.err.matching(r"fails verification|trying the "
                                           r"older"),
                        "nothing called damage, no fall back",
                        d.log()[-3000:])
                st = d.status() or {}
                c.check(st.get("restored") == "step-000020",
                        "status --json: restored is step-000020", repr(st))
                d.send(signal.SIGTERM)
                c.check(d.wait_exit(40) == 0, "spotd drains and exits 0")
            finally:
                px.close()
    c.finish()


if __name__ == "__main__":
    main()
