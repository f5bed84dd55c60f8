#!/usr/bin/python3
"""thread_cpu.py - CPU-s per GiB of every thread of `spotctl push` and of
spotd's upload, by thread name, against bench/s3_mem. Not a test: it
reports, it asserts nothing.

   bench/thread_cpu.py [--build DIR]... [--gib 1] [--runs 3] [--cores 16]
                       [--what push,spotd] [--out FILE]

Each --build DIR[:IO_THREADS] (default: build; IO_THREADS overrides
SPOT_IO_THREADS for that build, to compare defaults) is measured in turn, run after run
(alternating: the builds share the machine's load alike). Per run: a fresh
bench/s3_mem (of the first build) with its arena touched, then

  push   spotctl push of the data folder (fp32: weights, Adam m and v, a
         third each, numpy N(0, 0.02), N(0, 1e-3), its square);
  spotd  spotd run with a trainer that hard-links the same folder as
         step-000001 under SPOTD_CKPT_DIR and writes SPOTD_COMPLETE; spotd
         uploads and commits it (sampled until its log says so, then
         stopped). The figures are the upload's: the trainer waits until
         spotd has started it and idled 0.3 s, a sample is taken, and
         only then makes the folder; every thread's CPU is counted from
         that sample (--spotd-whole: from spotd's start, its lease and
         the trainer's launch included, as before 2026-12-07).

The thread counts are a node of --cores cores' defaults, forced with the
test knobs: SPOT_STORE_WORKERS = the cores (workers_default() in
lib/io/store/store.c), SPOT_IO_THREADS = io_threads_default() of
lib/io/s3.c for that many cores. Every 20 ms the script reads each
thread's time on the CPU (/proc/PID/task/TID/schedstat, in ns; utime +
stime of its stat file, 10 ms ticks, where there is no schedstat) of
spotctl or spotd and every process they started; a thread's figure is
its last reading. Threads are named by role
(docs/design.md, "Threads and the loop"); the main thread keeps the
program's name and runs its loop. For spotctl the total is exact (wait4's
rusage); "unsampled" is what ended between two readings.

Prints, per build: CPU-s/GiB of each thread name (median over the runs),
the busiest thread and the total; writes a markdown table to --out.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
HZ = os.sysconf("SC_CLK_TCK")


def io_threads_for(cores):
    """lib/io/s3.c io_threads_default() on a machine of `cores` cores."""
    if cores <= 4:
        return 1
    return min(cores // 2, 8)


def descendants(root):
    """root and every process below it (by /proc/PID/stat's ppid)."""
    kids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p, "rb") as f:
                st = f.read()
        except OSError:
            continue
        rest = st[st.rfind(b")") + 2:].split()
        kids.setdefault(int(rest[1]), []).append(int(p))
    out, pending = [], [root]
    while pending:
        p = pending.pop()
        out.append(p)
        pending.extend(kids.get(p, []))
    return out


def thread_cpu(pid, tid, rest):
    """A thread's CPU seconds: schedstat's time on the CPU, in ns (the
    stat file's utime + stime count 10 ms ticks, too coarse for threads
    that use tens of ms), else those ticks."""
    try:
        with open("/proc/%d/task/%s/schedstat" % (pid, tid), "rb") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        # fields 14 and 15 (utime, stime); rest[0] is field 3
        return (int(rest[11]) + int(rest[12])) / HZ


def sample(root, seen, comm_of):
    """Reads every thread's CPU seconds into seen[(pid, tid)]."""
    for pid in descendants(root):
        try:
            tids = os.listdir("/proc/%d/task" % pid)
        except OSError:
            continue
        for t in tids:
            try:
                with open("/proc/%d/task/%s/stat" % (pid, t), "rb") as f:
                    st = f.read()
            except OSError:
                continue
            lp, rp = st.find(b"("), st.rfind(b")")
            comm = st[lp + 1:rp].decode(errors="replace")
            rest = st[rp + 2:].split()
            cpu = thread_cpu(pid, t, rest)
            key = (pid, int(t))
            if cpu >= seen.get(key, 0):
                seen[key] = cpu
            comm_of[key] = comm


def by_name(seen, comm_of, root):
    """{thread: CPU seconds}, a thread by its name; threads of other
    processes than root are prefixed with their process's name, and
    threads that share a name (a build without names, libcurl's resolver
    threads) get #2, #3... in the order of their ids, so every thread is
    its own row."""
    out = {}
    for key in sorted(seen):
        pid, tid = key
        name = comm_of[key]
        if pid != root:
            name = "[%s] %s" % (comm_of.get((pid, pid), "?"), name)
        if name in out:
            k = 2
            while "%s#%d" % (name, k) in out:
                k += 1
            name = "%s#%d" % (name, k)
        out[name] = seen[key]
    return out


def start_s3_mem(build, work, gib):
    port = os.path.join(work, "port")
    if os.path.exists(port):
        os.unlink(port)
    p = subprocess.Popen([os.path.join(build, "bench", "s3_mem"), "--arena",
                          "%dG" % (gib + 1)], stdout=open(port, "w"),
                         stderr=open(os.path.join(work, "s3_mem.log"), "w"))
    for _ in range(1200):
        if os.path.getsize(port) > 0:
            break
        time.sleep(0.1)
    else:
        raise SystemExit("s3_mem did not start")
    return p, "http://127.0.0.1:%s" % open(port).read().strip()


def run_sampled(argv, env, until=None, timeout=600, start=None):
    """Runs argv, sampling its tree every 20 ms. until(): stop sampling
    and kill the tree when it returns true. start(): called after each
    sample until it returns true; that sample is the baseline, subtracted
    from every thread (the wall counts from it too). Returns (by-name
    seconds, wall, exact total or None)."""
    seen, comm_of = {}, {}
    base = None
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                         stderr=open(env["TC_ERR"], "w"),
                         start_new_session=True)
    exact = None
    while True:
        sample(p.pid, seen, comm_of)
        if start is not None and base is None and start():
            base = dict(seen)
            t0 = time.monotonic()
        wpid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if wpid == p.pid:
            exact = ru.ru_utime + ru.ru_stime
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit("%s failed; see %s" % (argv[0], env["TC_ERR"]))
            break
        if until is not None and until():
            sample(p.pid, seen, comm_of)
            os.killpg(p.pid, signal.SIGKILL)
            os.wait4(p.pid, 0)
            break
        if time.monotonic() - t0 > timeout:
            os.killpg(p.pid, signal.SIGKILL)
            raise SystemExit("%s timed out" % argv[0])
        time.sleep(0.02)
    wall = time.monotonic() - t0
    if base is not None:
        seen = {k: v - base.get(k, 0) for k, v in seen.items()}
    return by_name(seen, comm_of, p.pid), wall, exact


def gen_data(root, gib):
    import numpy as np
    os.makedirs(root, exist_ok=True)
    n = (gib << 30) // 4 // 3
    rng = np.random.default_rng(1)
    for name, scale in (("model.bin", 0.02), ("adam_m.bin", 1e-3)):
        a = rng.standard_normal(n, dtype=np.float32) * np.float32(scale)
        a.tofile(os.path.join(root, name))
        if name == "adam_m.bin":
            (a * a).tofile(os.path.join(root, "adam_v.bin"))
    return sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="append")
    ap.add_argument("--gib", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cores", type=int, default=16)
    ap.add_argument("--what", default="push,spotd")
    ap.add_argument("--io-threads", type=int,
                    help="SPOT_IO_THREADS (default: the --cores default)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(),
                                                   "spotd-thread-cpu"))
    ap.add_argument("--out")
    ap.add_argument("--spotd-whole", action="store_true",
                    help="spotd: count from its start (its start, lease "
                    "and trainer launch too), not from the checkpoint's "
                    "appearance")
    a = ap.parse_args()
    builds = a.build or [os.path.join(SRC, "build")]
    bio = {b: (int(b.rsplit(":", 1)[1]) if ":" in b else None) for b in builds}
    whats = a.what.split(",")
    os.makedirs(a.work, exist_ok=True)
    data = os.path.join(a.work, "data")
    size = gen_data(data, a.gib)
    gib = size / float(1 << 30)
    io = a.io_threads or io_threads_for(a.cores)
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench",
               AWS_SECRET_ACCESS_KEY="bench-secret", AWS_REGION="us-east-1",
               AWS_EC2_METADATA_DISABLED="true",
               SPOT_STORE_WORKERS=str(a.cores), SPOT_IO_THREADS=str(io))
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        env.pop(k, None)
    print("thread_cpu: %.2f GiB fp32, %d cores' defaults: SPOT_STORE_WORKERS=%d "
          "SPOT_IO_THREADS=%d, load %s" % (gib, a.cores, a.cores, io,
                                             open("/proc/loadavg").read().split()[:3]),
          file=sys.stderr)
    res = {}  # (build, what) -> [ {name: cpu}, ... ]
    walls = {}
    for r in range(a.runs):
        for b in builds:
            bdir = b.rsplit(":", 1)[0]
            # one server per build and run, its arena for both uploads
            srv, url = start_s3_mem(builds[0].rsplit(":", 1)[0], a.work,
                                    a.gib * len(whats))
            for what in whats:
                e = dict(env, AWS_ENDPOINT_URL=url,
                         TC_ERR=os.path.join(a.work, "%s.err" % what))
                if bio[b] is not None:
                    e["SPOT_IO_THREADS"] = str(bio[b])
                try:
                    if what == "push":
                        cpu, wall, exact = run_sampled(
                            [os.path.join(bdir, "client", "spotctl"), "push", data,
                             "s3://bench/tc/push-%d" % r, "-q"], e)
                        cpu["(unsampled)"] = max(0.0, exact - sum(cpu.values()))
                    else:
                        cpu, wall = run_spotd(bdir, a.work, data, e, r,
                                              whole=a.spotd_whole)
                except BaseException:
                    srv.kill()
                    raise
                res.setdefault((b, what), []).append(cpu)
                walls.setdefault((b, what), []).append(wall)
                busiest = max((v, k) for k, v in cpu.items() if k != "(unsampled)")
                print("run %d %s %s: %.2f s, total %.3f CPU-s/GiB, busiest %s %.3f"
                      % (r + 1, what, b, wall, sum(cpu.values()) / gib,
                         busiest[1], busiest[0] / gib), file=sys.stderr)
            srv.kill()
            srv.wait()
    lines = report(res, walls, gib, builds, whats, a, io)
    print("\n".join(lines))
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n".join(lines) + "\n")


def run_spotd(build, work, data, env, r, whole=False):
    wd = os.path.join(work, "spotd-%d" % r)
    subprocess.run(["rm", "-rf", wd], check=True)
    os.makedirs(os.path.join(wd, "ckpt"))
    step = os.path.join(wd, "ckpt", "step-000001")
    go = os.path.join(wd, "go")
    trainer = ("cp -al '%s' '%s' && : > '%s/SPOTD_COMPLETE' && exec sleep 600"
               % (data, step, step))
    if not whole:
        # the checkpoint appears once the baseline is taken (start below)
        trainer = ("while [ ! -e '%s' ]; do sleep 0.02; done; %s"
                   % (go, trainer))
    log = os.path.join(wd, "spotd.err")
    env = dict(env, TC_ERR=log)
    argv = [os.path.join(build, "daemon", "spotd"), "run", "--job", "tc-%d" % r,
            "--store", "s3://bench/tc/spotd-%d" % r,
            "--ckpt-dir", os.path.join(wd, "ckpt"),
            "--socket", os.path.join(wd, "spotd.sock"), "--provider", "none",
            "--interval", "0", "--restore=false", "--", "sh", "-c", trainer]

    def committed():
        try:
            with open(log, "rb") as f:
                return b"committed" in f.read()
        except OSError:
            return False
    started = []

    def start():
        """spotd has started the trainer and idled 0.3 s: the baseline,
        then the checkpoint."""
        if not started:
            try:
                with open(log, "rb") as f:
                    if b"trainer pid=" not in f.read():
                        return False
            except OSError:
                return False
            started.append(time.monotonic())
        if time.monotonic() - started[0] < 0.3:
            return False
        open(go, "w").close()
        return True
    cpu, wall, _ = run_sampled(argv, env, until=committed,
                               start=None if whole else start)
    cpu = {k: v for k, v in cpu.items()
           if not k.startswith(("[sh]", "[cp]", "[sleep]"))}
    return cpu, wall


def report(res, walls, gib, builds, whats, a, io):
    out = ["", "### %s, %d runs, %d cores' defaults (SPOT_STORE_WORKERS=%d, "
           "SPOT_IO_THREADS=%d), %.2f GiB fp32" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                  a.runs, a.cores, a.cores, io, gib), ""]
    for what in whats:
        names = sorted({n for b in builds for c in res[(b, what)] for n in c})
        out.append("| %s: thread | %s |" % (what, " | ".join(b if len(builds) > 1 else "CPU-s/GiB" for b in builds)))
        out.append("|---|%s" % ("---|" * len(builds)))
        med = {}
        for b in builds:
            med[b] = {n: statistics.median(c.get(n, 0.0) for c in res[(b, what)]) / gib
                      for n in names}
        for n in sorted(names, key=lambda n: -max(med[b][n] for b in builds)):
            if max(med[b][n] for b in builds) < 0.0005:
                continue
            out.append("| %s | %s |" % (n, " | ".join("%.3f" % med[b][n] for b in builds)))
        for label, f in (("**busiest thread**", lambda c: max(v for k, v in c.items() if k != "(unsampled)")),
                         ("**total**", lambda c: sum(c.values()))):
            out.append("| %s | %s |" % (label, " | ".join(
                "%.3f (%s)" % (statistics.median(f(c) / gib for c in res[(b, what)]),
                               ", ".join("%.3f" % (f(c) / gib) for c in res[(b, what)]))
                for b in builds)))
        out.append("| wall s | %s |" % " | ".join(
            "%.2f (%s)" % (statistics.median(walls[(b, what)]),
                           ", ".join("%.2f" % w for w in walls[(b, what)])) for b in builds))
        out.append("")
    return out


if __name__ == "__main__":
    main()
