"""spotd and an interruption notice from spotd-emulate (AWS, GCP,
Azure): signal, checkpoint, upload, commit, (Azure: ack after the commit),
the relaunch hook with SPOTD_JOB/STORE/CHECKPOINT/REASON/DEADLINE, then
the trainer stopped with SIGTERM and spotd exits 75; the upload after the
notice starts at 32 transfers (a debug line). The trainer reads
spotd.deadline() when asked: the notice's termination time less what
spotd keeps. Before the final upload, the fit line says what it sends
(no rate measured yet: nothing was committed before the notice). An AWS
rebalance recommendation triggers an early checkpoint and no stop; a
SIGTERM after it takes a final checkpoint whose fit line is checked
against the rate of the commit before it."""
import datetime
import os
import re
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


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
         "TiB": 1 << 40}
SIZE = r"([\d.]+) (B|KiB|MiB|GiB|TiB)"
FIT = (r"final checkpoint (\S+): (\d+) files?, " + SIZE + r" to send"
       r"(?: \(of " + SIZE + r", the rest uploaded while written\))?(?: at " + SIZE + r"/s measured, about ([\d.]+) s;"
       r" ([\d.]+) s left: (fits|will not fit)|; no upload rate measured "
       r"yet .*the ([\d.]+) s left is unknown)")


def size_of(num, unit):
    """(bytes, its rounding error) of a size as spotd prints it."""
    return float(num) * UNITS[unit], (0.5 if unit == "B" else 0.05) * UNITS[unit]


def fit_line(c, tag, d, name, files, nbytes, rate=None):
    """Checks the final checkpoint's fit line of name: logged before its
    commit, its files and bytes the trainer's, and with a rate measured
    (rate: the bounds, in bytes/s, of the commit before's rate, from its
    committed line) the
    time is bytes / rate and the verdict its comparison with the time
    left. Returns the parsed line's fields, or None."""
    i, line = d.err.wait(FIT.replace(r"(\S+)", re.escape(name)), 0)
    commit = line_index(d, r"committed checkpoint name=" + name)
    plain = line_index(d, r"uploading checkpoint %s$" % name)
    c.check(line is not None and commit is not None and i < commit and
            (plain is None or i < plain),
            tag + "the fit line of %s comes before its upload (or, followed "
            "while written, before its commit)" % name,
            "%r at %s, commit at %s, upload at %s" % (line, i, commit, plain))
    if line is None:
        return None
    m = re.search(FIT, line)
    sent, err = size_of(m.group(3), m.group(4))
    whole = size_of(m.group(5), m.group(6)) if m.group(5) else (sent, err)
    # followed while written: what is left to send, of the whole folder
    c.check(int(m.group(2)) == files and abs(whole[0] - nbytes) <= whole[1]
            and sent <= whole[0] + err,
            tag + "it sends the trainer's %d files, %d bytes" % (files, nbytes),
            line)
    if rate is None:
        c.check(m.group(12) is not None and float(m.group(12)) > 0,
                tag + "no rate measured yet, and the time left is said", line)
        return m
    c.check(m.group(7) is not None, tag + "a measured rate is said", line)
    if m.group(7) is None:
        return m
    nbytes = sent  # the estimate is for what is left to send
    r, rerr = size_of(m.group(7), m.group(8))
    est, left = float(m.group(9)), float(m.group(10))
    c.check(rate[0] - rerr <= r <= rate[1] + rerr,
            tag + "the rate is the last commit's (%.0f..%.0f B/s)" % rate, line)
    c.check(abs(est - nbytes / r) <= 0.05 + (nbytes + err) / (r - rerr) - nbytes / r,
            tag + "about %.1f s = its bytes / the rate" % est, line)
    c.check(m.group(11) == ("fits" if est <= left else "will not fit") or
            abs(est - left) < 0.1,
            tag + "the verdict '%s' compares %.1f s with %.1f s left"
            % (m.group(11), est, left), line)
    return m


def deadline_seen(c, tag, d, ev, notice_at):
    """The deadline the trainer read (spotd.deadline(), event ev) against
    the notice's termination time notice_at (unix s): the instant of
    spotd's "trainer's deadline" line, which is the termination time less
    the time it says it keeps to stop the trainer and for the upload."""
    rx = (r"the trainer's deadline: its checkpoint complete by (\S+) "
          r"\(in [-\d.]+ s\): the deadline less ([\d.]+) s to stop the "
          r"trainer and ([\d.]+) s for the upload")
    line = d.err.matching(rx)
    dl = ev.get("deadline") if ev else None
    c.check(dl is not None and line, tag + "the trainer read a deadline "
            "(%r) and spotd said it" % dl, repr(line))
    if dl is None or not line:
        return
    m = re.search(rx, line[0])
    said, stop, kept = (rfc3339(m.group(1)), float(m.group(2)),
                        float(m.group(3)))
    lo, hi = ev["dl_t0"] + dl, ev["dl_t1"] + dl  # the instant it read
    c.check(said - 0.01 <= hi and lo < said + 1.0,  # said: whole seconds
            tag + "spotd.deadline() is the instant spotd logged "
            "(%.3f..%.3f vs %s)" % (lo, hi, m.group(1)))
    # stop and kept are said to 0.1 s, the termination time to the second
    # below (GCP's and a SIGTERM's have milliseconds)
    want = notice_at - stop - kept
    c.check(stop > 0 and lo - 0.11 <= want + 1.0 and want <= hi + 0.11,
            tag + "it is the termination time less %.1f s to stop the "
            "trainer and %.1f s for the upload (%.3f..%.3f vs %.3f)"
            % (stop, kept, lo, hi, want))


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
                      trainer=["--step-sleep", 0.05, "--read-deadline"])
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
        fit_line(c, tag, d, name, 2,
                 (64 << 10) + len("%d\n" % made[0]["step"]) if made else 0)
        say = d.err.matching(r"interruption notice: .* deadline (\S+) id=")
        notice_at = rfc3339(re.search(r"deadline (\S+) id=", say[0]).group(1)) \
            if say else 0
        deadline_seen(c, tag, d, made[0] if made else None, notice_at)
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
        # the final checkpoint of the SIGTERM, against the first commit's rate
        made = d.events("checkpoint")
        rx = (r"committed checkpoint name=%s .*raw=(\d+) .* in ([\d.]+) s "
              r"\(\d+ retries(?:; ([\d.]+) s of it waiting for the save)?\)"
              % name)
        first = d.err.matching(rx)
        c.check(len(made) == 2 and first, tag + "SIGTERM: a final checkpoint "
                "after the first commit", repr(made))
        if len(made) == 2 and first:
            m = re.search(rx, first[0])
            # the rate: raw bytes over the push's time less its wait for
            # the trainer, each said to 0.1 s
            raw = int(m.group(1))
            busy = float(m.group(2)) - float(m.group(3) or 0)
            fit_line(c, tag, d, made[1]["name"], 2,
                     (64 << 10) + len("%d\n" % made[1]["step"]),
                     rate=(raw / (busy + 0.1),
                           raw / (busy - 0.1) if busy > 0.1 else 1e30))
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
