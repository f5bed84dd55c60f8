"""Multi-node jobs: two spotd processes on one machine play two nodes of
one job (--rank 0/1 --nranks 2, the same --job and --store, their own
checkpoint folders and sockets), each supervising fake_trainer.py.

1. Both trainers are asked to checkpoint (`spotctl checkpoint --wait` on
   each socket): each rank uploads its files under rank-K/ and writes its
   marker ranks/rank-K.json; rank 0 merges the markers into one
   MANIFEST.json (the commit) and LATEST; rank 1's wait returns once that
   commit exists.
2. Both restart: each restores the whole checkpoint and its trainer gets
   SPOTD_RESUME_DIR=CKPT_DIR/NAME/rank-K holding its own files, plus
   SPOTD_RANK and SPOTD_NRANKS.
3. Rank 0 alone (rank 1 never shows up): its push fails after --rank-wait
   and nothing is committed.
4. nranks mismatch: a restart with --nranks 3 is refused with a clear
   line and exit 65 (no damage claimed); --nranks 1 --reshard restores
   every rank's files.
5. A notice on rank 0 only (its own metadata emulator): rank 1 sees the
   job-wide notice within the poll interval + 1 s with the same deadline,
   both checkpoint and commit one checkpoint, the relaunch step runs once
   for the job; rank 1's trainer then dies on the lost peer and its spotd
   still exits 75.
6. Notices on both ranks in the same second: one commit, one relaunch.
7. Rank 1's trainer dies on the lost peer before its spotd saw the
   job-wide notice: it exits 75, not 1.
8. Fan-out latency over more notices (median and max printed).
Step 2 also checks that each rank restored only its own rank-K/ files and
reports the bytes it downloaded (log line and `spotctl status --json`).
Also: a rank not below nranks is refused at start; the job's history
counts each 2-rank run once, its ranks as nodes, the refused start
apart."""
import re
import statistics
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

STEP_SLEEP = 3.0  # both trainers checkpoint in the same step: same name


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def start(wd, store, job, rank, trainer, extra=(), emu=None, **kw):
    if emu is not None:
        kw.update(provider="aws", metadata_url=emu.url)
    return sl.Daemon(os.path.join(wd, "node%d" % rank), store, job,
                     trainer=trainer,
                     args=["--rank", rank, "--nranks", 2] + list(extra),
                     env={"AWS_EC2_METADATA_DISABLED": "true"}, **kw)


LAT = []  # fan-out latencies (s): rank 0's notice -> rank 1 drains on it


def fanout_latency(d0, d1, timeout=10):
    """Seconds from rank 0's notice line to rank 1's job-wide notice."""
    l1 = d1.wait_log(r"job-wide notice from rank 0", timeout)
    t0 = d0.err.time_of(r"interruption notice: aws-spot-terminate")
    t1 = d1.err.time_of(r"job-wide notice from rank 0")
    if l1 is None or t0 is None or t1 is None:
        return None
    LAT.append(t1 - t0)
    return t1 - t0


def deadline_of(d):
    line = d.wait_log(r"interruption notice: \S+ \(terminate\) deadline", 10)
    m = re.search(r"deadline (\S+)", line or "")
    return m.group(1) if m else None


def same_step(d0, d1, timeout=30):
    """Waits until both trainers logged the same step; True then."""
    end = time.time() + timeout
    while time.time() < end:
        a = [e["step"] for e in d0.events("step")]
        b = [e["step"] for e in d1.events("step")]
        if a and b and a[-1] == b[-1]:
            return True
        time.sleep(0.05)
    return False


def checkpoint_wait(d):
    return subprocess.Popen(
        [sl.spotctl_exe(), "checkpoint", "--socket", d.socket, "--wait",
         "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def main():
    sl.daemon_env()
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    c = sl.Checks()
    store, job, prefix = sl.daemon_job("multinode")
    ck = prefix + "checkpoints/"
    trainer = ["--step-sleep", STEP_SLEEP, "--exit-at", 2]
    with sl.cleaned_up(prefix):
        with tempfile.TemporaryDirectory(prefix="spotd-multinode-") as wd:
            # 0: a rank must be below nranks
            cp = sl.run([sl.spotd_exe(), "run", "--job", job, "--store", store,
                         "--provider", "none", "--rank", "2", "--nranks", "2",
                         "--ckpt-dir", os.path.join(wd, "bad"), "--socket",
                         os.path.join(wd, "bad.sock"), "--", "true"],
                        timeout=20)
            c.check(cp.returncode != 0 and "not below nranks" in cp.stderr,
                    "--rank 2 --nranks 2 is refused", cp.stderr)

            # 1: both ranks checkpoint; rank 0 commits the merged manifest
            d0 = start(wd, store, job, 0, trainer)
            d1 = start(wd, store, job, 1, trainer)
            s0 = d0.wait_event("start", 20)
            s1 = d1.wait_event("start", 20)
            c.check(s0 is not None and s1 is not None, "both trainers started")
            w0, w1 = checkpoint_wait(d0), checkpoint_wait(d1)
            out0, err0 = w0.communicate(timeout=90)
            out1, err1 = w1.communicate(timeout=90)
            c.check(w0.returncode == 0, "rank 0: checkpoint --wait committed",
                    out0 + err0)
            c.check(w1.returncode == 0, "rank 1: checkpoint --wait committed "
                    "(after rank 0's commit)", out1 + err1)
            name = "step-000001"
            c.check(d0.wait_exit(60) == 0 and d1.wait_exit(60) == 0,
                    "both spotd exit 0 when their trainers finish")
            c.check(s0 is not None and s0["env"].get("SPOTD_RANK") == "0" and
                    s0["env"].get("SPOTD_NRANKS") == "2" and s1 is not None
                    and s1["env"].get("SPOTD_RANK") == "1",
                    "SPOTD_RANK and SPOTD_NRANKS reach the trainers",
                    repr((s0 or {}).get("env")))
            c.check(sl.committed(prefix) == [name],
                    "one committed checkpoint, %s" % name,
                    repr(sl.committed(prefix)))
            c.check(sl.latest(prefix) == name, "LATEST names it",
                    repr(sl.latest(prefix)))
            keys = sl.s3_keys(ck + name + "/")
            c.check(ck + name + "/ranks/rank-0.json" in keys and
                    ck + name + "/ranks/rank-1.json" in keys,
                    "both rank markers exist", repr(keys))
            try:
                m = json.loads(sl.s3_get(ck + name + "/MANIFEST.json"))
                paths = sorted(f["path"] for f in m["files"])
                fkeys = sorted(f.get("key") or f.get("pack", "")
                               for f in m["files"])
            except Exception as e:  # noqa: BLE001
                paths, fkeys = [repr(e)], []
            want = ["rank-0/data.bin", "rank-0/step", "rank-1/data.bin",
                    "rank-1/step"]
            c.check(paths == want, "MANIFEST.json lists both ranks' files",
                    repr(paths))
            line = d0.wait_log(r"committed checkpoint name=%s files=" % name, 5)
            got = re.search(r"files=(\d+) .*; rank 0 uploaded files=(\d+)",
                            line or "")
            c.check(got is not None and int(got.group(1)) == len(paths) and
                    int(got.group(2)) == len([p for p in paths
                                              if p.startswith("rank-0/")]),
                    "rank 0's commit line counts the manifest's files, then "
                    "its own", line)
            # rank-K/<attempt>/<path>.zst (store.h: per-attempt keys), or
            # a small file's pack rank-K/<attempt>/packs/pack-N.pack
            c.check(len(fkeys) == len(want) and
                    all(k.startswith(p.split("/")[0] + "/attempt-") and
                        (k.endswith("/" + p.split("/", 1)[1] + ".zst") or
                         "/packs/pack-" in k)
                        for k, p in zip(sorted(fkeys), want)) and
                    all(ck + name + "/" + k in keys for k in fkeys),
                    "each file's object is under its rank's folder",
                    repr(fkeys))
            own = {}
            for r, d in ((0, d0), (1, d1)):
                src = os.path.join(d.ckpt_dir, name)
                own[r] = (sha(os.path.join(src, "data.bin")),
                          open(os.path.join(src, "step")).read())

            # 2: both restart and resume from their own rank's folder
            trainer2 = ["--step-sleep", 1.0, "--exit-at", 2]
            r0 = start(wd, store, job, 0, trainer2)
            r1 = start(wd, store, job, 1, trainer2)
            status = {}
            for r, d in ((0, r0), (1, r1)):
                if d.wait_event("start", 30) is not None:
                    status[r] = d.status()
            c.check(r0.wait_exit(60) == 0 and r1.wait_exit(60) == 0,
                    "restart: both spotd exit 0")
            for r, d in ((0, r0), (1, r1)):
                st = d.events("start")
                env = st[0]["env"] if st else {}
                want_dir = os.path.join(d.ckpt_dir, name, "rank-%d" % r)
                c.check(env.get("SPOTD_RESUME_DIR") == want_dir,
                        "restart: rank %d gets SPOTD_RESUME_DIR=%s" % (r, want_dir),
                        repr(env))
                c.check(st and st[0]["step"] == 1,
                        "restart: rank %d resumed at step 1" % r, repr(st))
                got = (sha(os.path.join(want_dir, "data.bin")),
                       open(os.path.join(want_dir, "step")).read())
                c.check(got == own[r],
                        "restart: rank %d's folder holds its own files" % r)
                c.check(sorted(os.listdir(os.path.join(d.ckpt_dir, name)))
                        == ["rank-%d" % r],
                        "restart: rank %d restored only rank-%d/" % (r, r),
                        repr(os.listdir(os.path.join(d.ckpt_dir, name))))
                line = d.wait_log(r"rank %d restored \d+ files" % r, 5)
                m = re.search(r"files: (\d+) bytes downloaded .* of the "
                              r"checkpoint's (\d+)", line or "")
                got_b, all_b = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
                c.check(m is not None and 0 < got_b < all_b,
                        "restart: rank %d downloaded %d of the checkpoint's %d "
                        "bytes" % (r, got_b, all_b), line)
                st = status.get(r) or {}
                rb = (st.get("ranks") or {}).get("restored") or {}
                c.check(rb.get("bytes") == got_b and
                        rb.get("checkpoint_bytes") == all_b,
                        "restart: rank %d's status reports the same bytes" % r,
                        repr(st.get("ranks")))

            # 4: another rank count is refused; --reshard takes everything
            bad = sl.Daemon(os.path.join(wd, "three"), store, job,
                            trainer=trainer2, args=["--rank", 0, "--nranks", 3],
                            env={"AWS_EC2_METADATA_DISABLED": "true"})
            rc = bad.wait_exit(60)
            line = bad.wait_log(r"committed by 2 ranks and this job runs 3", 5)
            c.check(rc == 65 and line is not None and "--reshard" in line,
                    "nranks 3 after a 2-rank commit: refused, exit 65 (%s)" % rc,
                    line)
            c.check(not bad.err.matching(r"damaged|fails verification"),
                    "nranks 3: not called damage", bad.log()[-1000:])
            lst = os.path.join(wd, "reshard.txt")
            rs = sl.Daemon(os.path.join(wd, "reshard"), store, job,
                           cmd=["/bin/sh", "-c",
                                'ls "$SPOTD_RESUME_DIR" > %s' % lst],
                           args=["--nranks", 1, "--reshard"],
                           env={"AWS_EC2_METADATA_DISABLED": "true"})
            c.check(rs.wait_exit(60) == 0, "--nranks 1 --reshard starts")
            c.check(sl.read_text(lst).split() == ["rank-0", "rank-1"],
                    "--reshard: SPOTD_RESUME_DIR holds every rank's folder",
                    sl.read_text(lst))

            # The job's history: a run is both ranks (one run id), the
            # refused nranks-3 start is neither a run nor a crash.
            cp = sl.spotctl("history", "%s/%s" % (store, job), "--json")
            hj = json.loads(cp.stdout) if cp.returncode == 0 else {}
            hs = hj.get("summary", {})
            hruns = [(r.get("outcome"), sorted(n.get("rank") for n in r.get("nodes", [])))
                     for r in hj.get("runs", [])]
            c.check(hs.get("runs") == 3 and hs.get("refused") == 1 and
                    hs.get("crashes") == 0 and hs.get("nodes") == 6,
                    "history: 3 runs (2 of 2 ranks, the reshard), 1 refused start",
                    cp.stdout[:600] + cp.stderr)
            c.check(hruns == [("exited", [0, 1]), ("exited", [0, 1]),
                              ("refused", [0]), ("exited", [-1])],
                    "history: each 2-rank run has both ranks as its nodes",
                    repr(hruns))
            c.check(hs.get("train_s", 0) <= hs.get("wall_s", -1),
                    "history: training within the job's wall time", repr(hs))

            # 3: rank 1 never shows up: rank 0 gives up, nothing committed
            lone = start(wd, store, job, 0,
                         ["--step-sleep", STEP_SLEEP, "--exit-at", 3],
                         extra=["--rank-wait", "2"])
            c.check(lone.wait_event("start", 20) is not None,
                    "alone: rank 0's trainer started")
            t = time.time()
            w = checkpoint_wait(lone)
            out, err = w.communicate(timeout=90)
            c.check(w.returncode != 0, "alone: checkpoint --wait fails",
                    out + err)
            c.check(time.time() - t < 30, "alone: within the rank wait",
                    "%.1f s" % (time.time() - t))
            line = lone.wait_log(r"did not write their part of step-000002",
                                 10)
            c.check(line is not None and "rank(s) 1" in line,
                    "alone: the log says rank 1 did not write its part", line)
            lone.wait_exit(60)
            c.check(sl.committed(prefix) == [name],
                    "alone: nothing more committed", repr(sl.committed(prefix)))
            c.check(sl.latest(prefix) == name, "alone: LATEST unchanged",
                    repr(sl.latest(prefix)))
            keys = sl.s3_keys(ck + "step-000002/")
            c.check(ck + "step-000002/ranks/rank-0.json" in keys and
                    ck + "step-000002/ranks/rank-1.json" not in keys,
                    "alone: only rank 0's marker", repr(keys))
            preemptions(c, wd, store, job, prefix)
    if LAT:
        print("fan-out latency over %d notices: median %.3f s, max %.3f s" %
              (len(LAT), statistics.median(LAT), max(LAT)))
    return c.finish()


def preempt_pair(wd, store, job, run, tr0, tr1, extra=()):
    """Two ranks, each with its own metadata emulator and one shared
    relaunch hook."""
    hook, hook_out = sl.relaunch_hook(wd)
    emus = [sl.EmulatorProc("aws"), sl.EmulatorProc("aws")]
    args = ["--run-id", run, "--relaunch", hook] + list(extra)
    ds = [start(wd, store, job, 0, tr0, args, emu=emus[0]),
          start(wd, store, job, 1, tr1, args, emu=emus[1])]
    return ds, emus, hook_out


def hook_runs(path, run_ckpt):
    return [h for h in sl.read_jsonl(path)
            if h.get("SPOTD_CHECKPOINT") == run_ckpt]


def preemptions(c, wd, store, job, prefix):
    slow = ["--step-sleep", 4.0]
    fast = ["--step-sleep", 0.05]
    # 5: a notice on rank 0 only
    log0 = os.path.join(wd, "node0", "trainer.log")
    before = sl.committed(prefix)
    (d0, d1), emus, hook_out = preempt_pair(
        wd, store, job, "run-a", slow,
        slow + ["--die-with", log0 + ":signal:1.5"])
    ok = d0.wait_event("start", 30) and d1.wait_event("start", 30)
    c.check(ok and same_step(d0, d1), "fan-out: both trainers run in step")
    emus[0].control("notice", deadline=40)
    lat = fanout_latency(d0, d1)
    # Not a timing bound (a shared machine): that rank 1 drains on the
    # job-wide notice at all, not only on its trainer's death, is the point.
    c.check(lat is not None,
            "fan-out: rank 1 drains on rank 0's notice (%.3f s later)" %
            (lat or -1))
    dl0, dl1 = deadline_of(d0), deadline_of(d1)
    c.check(dl0 is not None and dl0 == dl1,
            "fan-out: rank 1 drains with rank 0's deadline %s" % dl0, dl1)
    rc0, rc1 = d0.wait_exit(90), d1.wait_exit(90)
    c.check(rc0 == 75, "fan-out: rank 0 exits 75 (%s)" % rc0)
    c.check(rc1 == 75, "fan-out: rank 1 exits 75 (%s) although its trainer "
            "died on the lost peer" % rc1)
    died = [e for e in d1.events("crash") if e.get("why") == "peer"]
    c.check(len(died) == 1, "fan-out: rank 1's trainer died on the peer",
            repr(d1.events()[-3:]))
    new = [n for n in sl.committed(prefix) if n not in before]
    c.check(len(new) == 1, "fan-out: one new commit %s" % new)
    runs = sl.read_jsonl(hook_out)
    c.check(len(runs) == 1 and new and
            runs[0].get("SPOTD_CHECKPOINT") == new[0],
            "fan-out: the relaunch step ran once for the job", repr(runs))
    skipped = [d for d in (d0, d1)
               if d.err.matching(r"another rank already ran the job's "
                                 r"relaunch step")]
    c.check(len(skipped) == 1, "fan-out: the other rank says it skipped it")
    for e in emus:
        e.stop()

    # 6: notices on both ranks in the same second
    os.unlink(hook_out)
    before = sl.committed(prefix)
    (d0, d1), emus, hook_out = preempt_pair(wd, store, job, "run-b", slow,
                                            slow)
    ok = d0.wait_event("start", 30) and d1.wait_event("start", 30)
    c.check(ok and same_step(d0, d1), "two notices: both trainers in step")
    emus[0].control("notice", deadline=40)
    emus[1].control("notice", deadline=40)
    rc0, rc1 = d0.wait_exit(90), d1.wait_exit(90)
    c.check(rc0 == 75 and rc1 == 75, "two notices: both exit 75 (%s, %s)" %
            (rc0, rc1))
    new = [n for n in sl.committed(prefix) if n not in before]
    c.check(len(new) == 1, "two notices: one new commit %s" % new)
    runs = sl.read_jsonl(hook_out)
    c.check(len(runs) == 1, "two notices: the relaunch step ran once",
            repr(runs))
    for e in emus:
        e.stop()

    # 6b: the trainers agree on the step to save at (as train_ddp.py's
    # all_reduce does): rank 0's request makes rank 1's trainer save the
    # same checkpoint, usually before rank 1 hears of the notice. That save
    # is rank 1's final one: asking again would make every rank save, and
    # commit, a second one. Rank 1's trainer answers no signal of its own,
    # so without that rule rank 1 waits for the deadline.
    os.unlink(hook_out)
    before = sl.committed(prefix)
    (d0, d1), emus, hook_out = preempt_pair(
        wd, store, job, "run-d", fast,
        fast + ["--ignore-signal", "--save-with", log0])
    ok = d0.wait_event("start", 30) and d1.wait_event("start", 30)
    c.check(ok, "agreed save: both trainers started")
    emus[0].control("notice", deadline=30)
    rc0, rc1 = d0.wait_exit(60), d1.wait_exit(60)
    new = [n for n in sl.committed(prefix) if n not in before]
    c.check(rc0 == 75 and rc1 == 75 and len(new) == 1,
            "agreed save: both exit 75 (%s, %s), one new commit %s" %
            (rc0, rc1, new))
    c.check(new and d1.err.matching(
        r"preempted: the final checkpoint %s is committed" % new[0]),
        "agreed save: rank 1's final checkpoint is the one its trainer "
        "saved with rank 0's", "\n".join(
            d1.err.matching(r"final checkpoint|peer's notice|complete")))
    print("agreed save: rank 1 %s" % (
        "took the save it had seen before the notice"
        if d1.err.matching(r"saved after the peer's notice") else
        "heard of the notice before the save completed"))
    for e in emus:
        e.stop()

    # 7: rank 1's trainer dies on the lost peer before its spotd drains
    os.unlink(hook_out)
    (d0, d1), emus, hook_out = preempt_pair(
        wd, store, job, "run-c", fast, fast + ["--die-with", log0 + ":signal"],
        extra=["--rank-wait", 3])
    ok = d0.wait_event("start", 30) and d1.wait_event("start", 30)
    c.check(ok, "peer loss: both trainers started")
    emus[0].control("notice", deadline=40)
    rc0, rc1 = d0.wait_exit(90), d1.wait_exit(90)
    c.check(rc1 == 75, "peer loss: rank 1 exits 75, not 1 (%s)" % rc1)
    path = ("exit check" if d1.err.matching(r"checking for a peer's notice")
            else "poll")
    print("peer loss: rank 1 learnt of the notice by its %s" % path)
    fanout_latency(d0, d1, 1)
    for e in emus:
        e.stop()

    # 8: more fan-out latencies. CI does one more; the closing figure
    # (median and max over 10 notices) comes from SPOTD_TEST_FANOUT_RUNS=8.
    # No timing bound is checked (a shared, noisy machine). Here the
    # trainers never die, so only the store poll can tell rank 1 of the
    # notice: a latency within fanout_latency()'s 10 s shows that it did.
    for i in range(int(os.environ.get("SPOTD_TEST_FANOUT_RUNS", "1"))):
        (d0, d1), emus, _ = preempt_pair(wd, store, job, "lat-%d" % i, fast,
                                         fast, extra=["--rank-wait", 1])
        if d0.wait_event("start", 30) and d1.wait_event("start", 30):
            emus[0].control("notice", deadline=30)
            fanout_latency(d0, d1)
        d0.wait_exit(60)
        d1.wait_exit(60)
        for e in emus:
            e.stop()
    c.check(len(LAT) >= 2,
            "fan-out latency over %d notices: median %.3f s, max %.3f s" %
            (len(LAT), sorted(LAT)[len(LAT) // 2] if LAT else -1,
             max(LAT) if LAT else -1), repr(LAT))


if __name__ == "__main__":
    sys.exit(main())
