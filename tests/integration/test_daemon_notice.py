"""spotd and an interruption notice from spotd-emulate (AWS, GCP,
Azure): signal, checkpoint, upload, commit, (Azure: ack after the commit),
the relaunch hook with SPOTD_JOB/STORE/CHECKPOINT/REASON/DEADLINE, then
the trainer stopped with SIGTERM and spotd exits 75; the upload after the
notice starts at 32 transfers (a debug line). An AWS rebalance
recommendation triggers an early checkpoint and no stop."""
import datetime
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

REASONS = {"aws": "aws-spot-terminate", "gcp": "gcp-preempted",
           "azure": "azure-preempt"}


def rfc3339(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def line_index(d, pattern):
    return d.err.wait(pattern, 0)[0]


def notice(c, wd, provider):
    tag = provider + ": "
    store, job, prefix = sl.daemon_job("notice-" + provider)
    emu_args = ["--vm-name", "trainer-1"] if provider == "azure" else []
    emu = sl.EmulatorProc(provider, *emu_args)
    hook, hook_out = None, None
    with sl.cleaned_up(prefix, emu.stop):
        os.makedirs(wd)
        hook, hook_out = sl.relaunch_hook(wd)
        d = sl.Daemon(wd, store, job, provider=provider, metadata_url=emu.url,
                      args=["--relaunch", hook, "--log-level", "debug"], grace=5,
                      trainer=["--step-sleep", 0.05])
        c.check(d.wait_event("step", 20) is not None and
                d.wait_log(r"state \S+ -> running", 10) is not None,
                tag + "the trainer runs")
        time.sleep(1.0)  # a few polls without a notice
        c.check(not d.err.matching("interruption notice"),
                tag + "no notice before the emulator publishes one")
        t_notice = time.time()
        emu.control("notice", deadline=20)
        rc = d.wait_exit(45)
        c.check(rc == 75, tag + "spotd exits 75 after the handled notice",
                "rc=%s" % rc)
        n = d.err.time_of(r"interruption notice: " + REASONS[provider])
        c.check(n is not None and n - t_notice < 5,
                tag + "notice %s seen in %.1f s" %
                (REASONS[provider], (n or 0) - t_notice))
        made = d.events("checkpoint")
        c.check(len(made) == 1 and made[0]["why"] == "signal",
                tag + "the trainer checkpointed on the signal: %s" %
                [e["name"] for e in made])
        name = made[0]["name"] if made else "?"
        order = [line_index(d, p) for p in (
            r"interruption notice",
            r"checkpoint requested \(%s\)" % REASONS[provider],
            r"committed checkpoint name=" + name,
            r"relaunch: running",
            r"stopping trainer pid=\d+: SIGTERM",
            r"trainer pid=\d+ (ended by signal|exited)",
            r"state \S+ -> exiting")]
        c.check(None not in order and order == sorted(order),
                tag + "notice, signal, commit, relaunch, SIGTERM, exit in order",
                "line indexes %s" % order)
        c.check(d.err.matching(r"push name=%s parallel 32 \(adaptive" % name),
                tag + "the upload after the notice started at 32 transfers",
                "\n".join(d.err.matching(r" parallel ")))
        c.check(sl.latest(prefix) == name and name in sl.committed(prefix),
                tag + "%s committed and LATEST" % name,
                "LATEST=%r" % sl.latest(prefix))
        runs = sl.read_jsonl(hook_out)
        c.check(len(runs) == 1, tag + "the relaunch hook ran once (%d)" % len(runs))
        if runs:
            h = runs[0]
            c.check(h.get("SPOTD_JOB") == job and
                    h.get("SPOTD_STORE") == "%s/%s" % (store, job) and
                    h.get("SPOTD_CHECKPOINT") == name and
                    h.get("SPOTD_REASON") == REASONS[provider],
                    tag + "hook: SPOTD_JOB, STORE, CHECKPOINT, REASON", repr(h))
            try:
                dl = rfc3339(h.get("SPOTD_DEADLINE", ""))
            except ValueError:
                dl = 0
            c.check(t_notice + 5 < dl < t_notice + 35,
                    tag + "hook: SPOTD_DEADLINE %s is the notice's deadline" %
                    h.get("SPOTD_DEADLINE"), "t_notice=%.1f" % t_notice)
            c.check(not any(k in h for k in ("SPOTD_CKPT_DIR", "SPOTD_SOCKET")),
                    tag + "hook: no trainer variables leak in", repr(h))
            term = d.events("term")
            c.check(len(term) == 1 and h["_t"] <= term[0]["t"],
                    tag + "the trainer got SIGTERM after the hook ran")
        steps = d.events("step")
        c.check(steps and made and steps[-1]["step"] >= made[0]["step"],
                tag + "the trainer kept training until it was stopped")
        if provider == "azure":
            t_ack = emu.out.time_of(r"^ack EventId=")
            t_commit = d.err.time_of(r"committed checkpoint name=" + name)
            c.check(t_ack is not None and t_commit is not None and
                    t_ack >= t_commit,
                    tag + "the scheduled event is acknowledged after the commit",
                    "ack=%r commit=%r" % (t_ack, t_commit))
            acks = emu.state().get("acks", [])
            c.check(len(acks) == 1, tag + "the emulator recorded one ack: %r" %
                    acks)
        else:
            c.check(not emu.out.matching(r"^ack "), tag + "no ack (not Azure)")
        c.check(not os.path.exists(d.socket), tag + "socket removed at exit")


def rebalance(c, wd):
    tag = "rebalance: "
    store, job, prefix = sl.daemon_job("rebalance")
    emu = sl.EmulatorProc("aws")
    with sl.cleaned_up(prefix, emu.stop):
        os.makedirs(wd)
        hook, hook_out = sl.relaunch_hook(wd)
        d = sl.Daemon(wd, store, job, provider="aws", metadata_url=emu.url,
                      args=["--relaunch", hook], trainer=["--step-sleep", 0.05])
        c.check(d.wait_event("step", 20) is not None, tag + "the trainer runs")
        emu.control("rebalance")
        line = d.wait_log(r"committed checkpoint name=", 20)
        c.check(line is not None and
                d.err.matching(r"checkpoint requested \(aws-rebalance\)"),
                tag + "an early checkpoint is requested and committed")
        made = d.events("checkpoint")
        name = made[0]["name"] if made else "?"
        c.check(sl.latest(prefix) == name, tag + "LATEST is %s" % name)
        after = made[0]["step"] + 10 if made else 0
        c.check(d.wait_event("step", 10, lambda e: e["step"] >= after)
                is not None, tag + "training goes on after the checkpoint")
        st = d.status()
        c.check(st is not None and st.get("state") == "running" and
                d.running(), tag + "still running, no stop", repr(st))
        c.check(not d.events("term") and not sl.read_jsonl(hook_out),
                tag + "no SIGTERM to the trainer, no relaunch")
        d.send(signal.SIGTERM)
        rc = d.wait_exit(30)
        c.check(rc == 0, tag + "SIGTERM afterwards: exit 0", "rc=%s" % rc)
        c.check(not sl.read_jsonl(hook_out), tag + "SIGTERM does not relaunch")


def main():
    sl.daemon_env()
    c = sl.Checks()
    only = sys.argv[1:] or ["aws", "gcp", "azure", "rebalance"]
    with tempfile.TemporaryDirectory(prefix="spotd-notice-") as wd:
        for p in only:
            print("--- %s" % p, flush=True)
            if p == "rebalance":
                rebalance(c, os.path.join(wd, p))
            else:
                notice(c, os.path.join(wd, p), p)
    c.finish()


if __name__ == "__main__":
    main()
