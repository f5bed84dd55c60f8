"""A node that lost its lease writes nothing more, against the real Ceph:
no MANIFEST.json (which would take the name and count toward retention),
and LATEST does not move.

spotd is stopped (SIGSTOP, the fault point "before-commit:stop",
SPOTD_FAULT, compiled into test builds only) just before it commits its
first checkpoint, and another owner takes its lease meanwhile (the lease
object is rewritten, as a taker whose clock ran ahead would). After
SIGCONT, spotd reads the lease before the manifest, finds it taken, and
commits nothing: no manifest of that checkpoint, no LATEST.
"""
import json
import os
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("leaselostcommit")
    url = "%s/%s" % (store, job)
    with sl.cleaned_up(prefix):
        with tempfile.TemporaryDirectory(prefix="spotd-lostcommit-") as wd:
            d = sl.Daemon(os.path.join(wd, "a"), store, job,
                          trainer=["--every", 10, "--step-sleep", 0.05],
                          args=["--lease-ttl", 300],
                          env={"SPOTD_FAULT": "before-commit:stop"})
            line = d.wait_log(r"fault point before-commit: stopping", 120)
            c.check(line is not None, "spotd stops just before its commit",
                    d.log()[-1500:])
            # Another node takes the lease while this one is stopped (as a
            # node whose clock ran ahead would): its lease object now names
            # another owner at the next epoch. The TTL is long, so only the
            # read before the manifest can notice.
            doc = json.loads(sl.s3_get(prefix + "LEASE"))
            doc["owner"] = "other-node"
            doc["epoch"] = doc["epoch"] + 1
            doc["nonce"] = "0123456789abcdef"
            sl.s3_put(prefix + "LEASE", json.dumps(doc).encode())
            cp = sl.spotctl("lease", url, "--show")
            c.check("owner=other-node" in cp.stdout,
                    "another owner holds the lease", cp.stdout + cp.stderr)
            os.kill(d.pid, signal.SIGCONT)
            refused = d.wait_log(r"not committing step-\d+: writer .* is "
                                 r"fenced", 60)
            c.check(refused is not None, "the read of the lease before the "
                    "manifest refuses the commit", d.log()[-2000:])
            manifests = [k for k in sl.s3_keys(prefix)
                         if k.endswith("/MANIFEST.json")]
            c.check(not manifests, "no manifest was written after the lease "
                    "was lost", repr(manifests))
            c.check(sl.latest(prefix) is None, "LATEST was not written",
                    repr(sl.latest(prefix)))
            d.p.terminate()
            d.wait_exit(60)
            for ev in d.events("start"):
                try:
                    os.killpg(ev["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    c.finish()


if __name__ == "__main__":
    main()
