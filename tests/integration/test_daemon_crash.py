"""A trainer that crashes: spotd finishes the pending upload, does not
relaunch, and exits with the trainer's status (128+signal for a signal)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def crash(c, wd, tag, status, want_rc):
    store, job, prefix = sl.daemon_job("crash")
    with sl.cleaned_up(prefix):
        hook, hook_out = sl.relaunch_hook(os.path.dirname(wd))
        # A checkpoint at step 20, the crash one step (50 ms) later: the
        # upload of 8 MiB is still going when the trainer dies.
        d = sl.Daemon(wd, store, job, args=["--relaunch", hook],
                      trainer=["--every", 20, "--crash-at", 21,
                               "--crash-status", status, "--bytes", 8 << 20,
                               "--step-sleep", 0.05])
        rc = d.wait_exit(60)
        c.check(rc == want_rc, tag + "spotd exits %d" % want_rc, "rc=%s" % rc)
        c.check(len(d.events("crash")) == 1, tag + "the trainer crashed")
        c.check(d.err.matching(r"the trainer failed \(status %d\): not "
                               r"relaunching" % want_rc),
                tag + "the log says the trainer failed, no relaunch")
        i_up = d.err.wait(r"uploading checkpoint step-000020", 0)[0]
        i_dead = d.err.wait(r"trainer pid=\d+ (exited|ended)", 0)[0]
        i_commit = d.err.wait(r"committed checkpoint name=step-000020", 0)[0]
        i_end = d.err.wait(r"state \S+ -> exiting", 0)[0]
        c.check(None not in (i_up, i_dead, i_commit, i_end) and
                i_up < i_dead < i_commit < i_end,
                tag + "the upload pending at the crash was committed before "
                "the exit", "indexes %r" % ([i_up, i_dead, i_commit, i_end],))
        c.check(sl.latest(prefix) == "step-000020",
                tag + "LATEST is step-000020", repr(sl.latest(prefix)))
        c.check(not sl.read_jsonl(hook_out) and
                not d.err.matching(r"relaunch: running"),
                tag + "the relaunch step did not run")


def main():
    sl.daemon_env()
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-crash-") as wd:
        crash(c, os.path.join(wd, "status"), "exit 3: ", "3", 3)
        crash(c, os.path.join(wd, "signal"), "SIGKILL: ", "KILL", 128 + 9)
    c.finish()


if __name__ == "__main__":
    main()
