"""A corrupted newest commit: spotd says so loudly,
restores the newest checkpoint that verifies, starts the trainer from it,
and `spotctl status --json` shows a warning naming the bad checkpoint and
"restored" naming the one restored. With every commit damaged it exits 65
(the store's data cannot be used) instead of starting from scratch. A
checkpoint of another rank count (--nranks) is not damage: exit 65 with a
line saying both counts, nothing older tried."""
import json
import os
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def make(d, step):
    os.makedirs(d)
    with open(os.path.join(d, "step"), "w") as f:
        f.write("%d\n" % step)
    sl.write_random(os.path.join(d, "data.bin"), 300000 + step)


def corrupt(prefix, name, rel):
    man = json.loads(sl.s3_get(prefix + "checkpoints/%s/MANIFEST.json" % name))
    key = [f.get("key") or f["pack"] for f in man["files"] if f["path"] == rel][0]
    obj = bytearray(sl.s3_get(prefix + "checkpoints/%s/%s" % (name, key)))
    obj[len(obj) // 2] ^= 0x5a
    sl.s3_put(prefix + "checkpoints/%s/%s" % (name, key), bytes(obj))


def main():
    sl.daemon_env()
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("fallback")
    url = store + "/" + job
    with sl.cleaned_up(prefix):
        with tempfile.TemporaryDirectory(prefix="spotd-fallback-") as wd:
            for step in (10, 20):
                src = os.path.join(wd, "src", "step-%06d" % step)
                make(src, step)
                cp = sl.spotctl("push", src, url)
                c.check(cp.returncode == 0, "push step %d" % step, cp.stderr)
            c.check(sl.latest(prefix) == "step-000020", "LATEST is step-000020")
            corrupt(prefix, "step-000020", "data.bin")

            # steps of 1 s: the final checkpoint at SIGTERM must not reach
            # step 20, whose damaged commit holds that name
            d = sl.Daemon(os.path.join(wd, "node"), store, job,
                          trainer=["--step-sleep", 1.0])
            s = d.wait_event("start", 30)
            c.check(s is not None and s["step"] == 10 and
                    s["env"].get("SPOTD_RESUME_DIR", "").endswith(
                        "/step-000010"),
                    "the trainer resumes from step-000010, the newest that "
                    "verifies", repr(s))
            loud = d.err.matching(r"step-000020 fails verification")
            c.check(any("<3>" in l or "error" in l.lower() or "fails" in l
                        for l in loud) and bool(loud),
                    "spotd says loudly that step-000020 fails verification",
                    d.log()[-1500:])
            st = d.status() or {}
            c.check(st.get("restored") == "step-000010",
                    "status --json: restored is step-000010", repr(st))
            c.check(any("step-000020" in w and "verification" in w
                        for w in st.get("warnings", [])),
                    "status --json: a warning names step-000020",
                    repr(st.get("warnings")))
            d.send(signal.SIGTERM)
            c.check(d.wait_exit(40) == 0, "spotd drains and exits 0")

            # another rank count is no damage: its own line and exit 65
            d3 = sl.Daemon(os.path.join(wd, "node3"), store, job,
                           trainer=["--step-sleep", 0.05],
                           args=["--nranks", "2", "--rank", "0"])
            rc = d3.wait_exit(60)
            c.check(rc == 65 and d3.events("start") == [],
                    "--nranks 2 against a 1-rank checkpoint: exit 65, no "
                    "trainer", "rc=%s" % rc)
            c.check(bool(d3.err.matching(r"committed by 1 ranks and this job "
                                         r"runs 2 \(--nranks\)")),
                    "the line gives the checkpoint's rank count and --nranks",
                    d3.log()[-1500:])
            c.check(not d3.err.matching(r"damaged|verif|trying the older"),
                    "a rank count is not called damage, nothing older tried",
                    d3.log()[-1500:])

            # every commit damaged: no silent fresh start
            store2, job2, prefix2 = store, job + "-bad", \
                prefix[:-len("job/")] + job + "-bad/"
            src = os.path.join(wd, "src2", "step-000005")
            make(src, 5)
            cp = sl.spotctl("push", src, store2 + "/" + job2)
            c.check(cp.returncode == 0, "push step 5 (second job)")
            corrupt(prefix2, "step-000005", "data.bin")
            d2 = sl.Daemon(os.path.join(wd, "node2"), store2, job2,
                           trainer=["--step-sleep", 0.05])
            rc = d2.wait_exit(40)
            c.check(rc == 65 and d2.events("start") == [],
                    "all commits damaged: exit 65, no trainer", "rc=%s" % rc)
            c.check(bool(d2.err.matching(r"no committed checkpoint .* verifies")),
                    "it says no committed checkpoint verifies",
                    d2.log()[-1000:])
            sl.s3_cleanup(prefix2)
    c.finish()


if __name__ == "__main__":
    main()
