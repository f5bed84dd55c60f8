"""Shared by the framework tests (test_fw_*.py): the real frameworks
(transformers, Lightning, torch's DCP) under `spotd run`, preempted by a
spot notice of the node's metadata emulator, the checkpoint committed to
the Ceph that tools/test starts, resumed on a fresh node from the store,
and compared step by step with the same run uninterrupted.

The frameworks: when $SPOTD_TEST_PYTHONUSERBASE is set (tools/test sets
it when it was given the frameworks archive), /usr/bin/python3 imports
them from that user site, and a framework that does not import there is
a failure. Unset, a test runs when /usr/bin/python3 imports the framework
anyway and skips (77) with the reason otherwise.

The trainers print, every rank after every optimizer step,

    step G rank R <the batch's sample ids, its loss, ...>

and at the end `final rank R <hash of the weights>`; run() compares those
lines."""
import os
import re
import shutil
import subprocess
import tempfile
import time

import spotlib as sl

PY3 = sl.PY3
USERBASE_VAR = "SPOTD_TEST_PYTHONUSERBASE"
RAN_VAR = "SPOTD_TEST_FRAMEWORKS_RAN"  # tools/test: ran once already


def skip_if_ran():
    """Skips when tools/test ran the framework tests already (in its gcc
    run: they test Python code, the ASan run adds nothing)."""
    if os.environ.get(RAN_VAR):
        sl.skip("the framework tests ran once already, in the gcc run")
STEP_RE = re.compile(r"^(?:\[\d+\]:)?step (\d+) rank (\d+) (.*)$")
FINAL_RE = re.compile(r"^(?:\[\d+\]:)?final rank (\d+) (\S+)$")


def fw_env(modules, what):
    """The environment the trainers run in (the frameworks' user site
    when given, offline Hugging Face, no GPU, this source's spotd), after
    checking that /usr/bin/python3 imports modules there: skips without
    them, unless the user site was given (then it fails)."""
    skip_if_ran()
    env = dict(os.environ, PYTHONPATH=sl.srcdir_path("python"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
               TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1")
    for k in ("SPOTD_SOCKET", "SPOTD_RESUME_DIR", "SPOTD_REQUEST_FILE",
              "SPOTD_CKPT_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE",
              "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    given = os.environ.get(USERBASE_VAR)
    if given:
        env["PYTHONUSERBASE"] = given
    code = "\n".join("import " + m for m in modules)
    cp = subprocess.run([PY3, "-c", code], capture_output=True, text=True,
                        env=env, timeout=300)
    if cp.returncode != 0:
        why = "%s: %s does not import %s (%s)" % (
            what, PY3, ", ".join(modules),
            (cp.stderr.strip().splitlines() or ["?"])[-1])
        if given:
            print("FAIL %s with %s=%s" % (why, USERBASE_VAR, given))
            raise SystemExit(1)
        sl.skip(why + "; tools/test runs it with the frameworks archive")
    return env


def parse(lines):
    """({(step, rank): rest}, {rank: final hash}) of trainer output."""
    steps, final = {}, {}
    for line in lines:
        m = STEP_RE.match(line)
        if m:
            steps[(int(m.group(1)), int(m.group(2)))] = m.group(3)
            continue
        m = FINAL_RE.match(line)
        if m:
            final[int(m.group(1))] = m.group(2)
    return steps, final


def reference(cmd, env, tmp, timeout=300):
    """The run uninterrupted, without spotd, started now: a Popen whose
    output collect() reads."""
    e = dict(env, SPOTD_CKPT_DIR=os.path.join(tmp, "reference-ckpt"))
    out = open(os.path.join(tmp, "reference.out"), "w+")
    p = subprocess.Popen(cmd, env=e, stdout=out, stderr=subprocess.STDOUT,
                         text=True)
    p.out, p.timeout = out, timeout
    return p


def collect(p):
    """(rc, lines) of a reference()."""
    try:
        rc = p.wait(p.timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    p.out.seek(0)
    lines = p.out.read().splitlines()
    p.out.close()
    return rc, lines


class Node:
    """One machine: a fresh folder, its own metadata emulator, `spotd run`
    of cmd against the test's store."""

    def __init__(self, tmp, name, store, job, cmd, env, spotd_args=()):
        self.name = name
        self.wd = os.path.join(tmp, name)
        os.makedirs(self.wd)
        self.emu = sl.EmulatorProc("aws")
        self.d = sl.Daemon(self.wd, store, job, cmd=cmd,
                           args=["--grace", "10"] + list(spotd_args),
                           provider="aws", metadata_url=self.emu.url,
                           poll_interval="200ms", env=env, echo=False)
        self.ckpt_dir = self.d.ckpt_dir

    def lines(self):
        return [line for _, line in list(self.d.out.lines)]

    def wait_step(self, n, timeout):
        end = time.time() + timeout
        while time.time() < end and self.d.running():
            for line in self.lines():
                m = STEP_RE.match(line)
                if m and int(m.group(1)) >= n:
                    return True
            time.sleep(0.1)
        return False

    def stop(self):
        self.emu.stop()
        if self.d.running():
            self.d.send(15)
            self.d.wait_exit(30)

    def dump(self, n=60):
        err = self.d.err.text().splitlines()
        out = self.lines()
        return ("--- %s: spotd\n%s\n--- %s: trainer (last %d lines)\n%s" %
                (self.name, "\n".join(err[-n:]), self.name, n,
                 "\n".join(out[-n:])))


def step_of(name):
    """The training step in a checkpoint folder's name (step-000012,
    checkpoint-12), or None."""
    m = re.search(r"(\d+)$", name or "")
    return int(m.group(1)) if m else None


def run(c, what, cmd, env, steps, ranks, notice_at, resume_cmd=None,
        folder_check=None, step_timeout=240, ref_cmd=None,
        node0_check=None):
    """The whole check for one trainer: the uninterrupted reference run
    and, beside it, node 0 under spotd, a notice once step notice_at is
    printed (exit 75 with its checkpoint committed), node 1 on a fresh
    folder restoring it from the store and running to the end (exit 0).
    Checks every (step, rank) line after the checkpoint and the final
    weights of every rank against the reference. folder_check(c, path)
    looks at the committed folder, node0_check(c, name, lines) at node
    0's trainer lines once it is committed. resume_cmd: node 1's command,
    ref_cmd the reference's (default: resume_cmd, else cmd). Returns node
    1's trainer lines."""
    store, job, prefix = sl.daemon_job(
        "fw-" + re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-"))
    tmp = tempfile.mkdtemp(prefix="spotd-fw-")
    nodes = []
    t0 = time.monotonic()
    ref = None
    try:
        ref = reference(ref_cmd or resume_cmd or cmd, env, tmp)
        return _run(c, what, cmd, env, steps, ranks, notice_at, resume_cmd,
                    folder_check, step_timeout, store, job, prefix, tmp,
                    nodes, ref, node0_check)
    finally:
        # Only this run's processes: another run may go on beside it.
        for n in nodes:
            n.stop()
        sl.s3_cleanup(prefix)
        if ref is not None and ref.poll() is None:
            ref.kill()
            ref.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        print("     %s: %.1f s in all" % (what, time.monotonic() - t0),
              flush=True)


def _run(c, what, cmd, env, steps, ranks, notice_at, resume_cmd,
         folder_check, step_timeout, store, job, prefix, tmp, nodes, ref,
         node0_check=None):
    n0 = Node(tmp, "node0", store, job, cmd, env)
    nodes.append(n0)
    if not c.check(n0.wait_step(notice_at, step_timeout),
                   "%s: node 0 reached step %d" % (what, notice_at),
                   n0.dump()):
        return None
    n0.emu.control("notice", deadline=120)
    rc = n0.d.wait_exit(180)
    name = sl.latest(prefix)
    saved = step_of(name)
    if not c.check(rc == 75 and saved is not None and saved >= notice_at,
                   "%s: the notice after step %d: node 0 checkpointed, "
                   "committed %s and exited 75" % (what, notice_at, name),
                   "rc=%s LATEST=%r\n%s" % (rc, name, n0.dump())):
        return None
    if folder_check:
        folder_check(c, os.path.join(n0.ckpt_dir, name))
    if node0_check:
        node0_check(c, name, n0.lines())
    shutil.rmtree(n0.ckpt_dir)  # a new machine: nothing local survives
    n1 = Node(tmp, "node1", store, job, resume_cmd or cmd, env)
    nodes.append(n1)
    rc1 = n1.d.wait_exit(step_timeout + 120)
    c.check(rc1 == 0 and n1.d.err.matching(r"restored checkpoint %s into "
                                           % re.escape(name)),
            "%s: node 1 restored %s from the store and ran to the end" %
            (what, name), "rc=%s\n%s" % (rc1, n1.dump()))
    rrc, rlines = collect(ref)
    rsteps, rfinal = parse(rlines)
    if not c.check(rrc == 0 and len(rsteps) == steps * ranks and
                   len(rfinal) == ranks,
                   "%s: the uninterrupted run: %d steps x %d rank(s)" %
                   (what, steps, ranks), "rc=%s\n%s" % (rrc, "\n".join(
                       rlines[-60:]))):
        return None
    s0, _ = parse(n0.lines())
    s1, f1 = parse(n1.lines())
    before = {k: v for k, v in s0.items() if k[0] <= saved}
    c.check(before and all(rsteps.get(k) == v for k, v in before.items()),
            "%s: node 0's steps 1..%d equal the uninterrupted run's" %
            (what, saved), _diff(before, rsteps))
    want = {k: v for k, v in rsteps.items() if k[0] > saved}
    c.check(s1 == want,
            "%s: node 1 resumed at step %d and every later step (batch, "
            "loss, every rank) equals the uninterrupted run's" %
            (what, saved + 1), _diff(s1, want))
    c.check(f1 == rfinal and len(f1) == ranks,
            "%s: the final weights of every rank equal the uninterrupted "
            "run's" % what, "%r vs %r" % (f1, rfinal))
    print("     %s: notice after step %d, checkpoint %s, %d step(s) resumed"
          % (what, notice_at, name, steps - saved), flush=True)
    return n1.lines()


def _diff(got, want):
    keys = sorted(set(got) | set(want))
    bad = [k for k in keys if got.get(k) != want.get(k)]
    return "\n".join("step %d rank %d: got %r, want %r" %
                     (k[0], k[1], got.get(k), want.get(k)) for k in bad[:8])
