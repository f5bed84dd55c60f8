#!/usr/bin/python3
"""The job lease (lib/io/lease.c) and LATEST's forward-only update
(lib/io/store/latest.c) against the real S3 server, through `spotctl lease`:

1. two acquirers at once: exactly one holds it, the other waits and takes
   it right after the release (epoch + 1); handoff time measured;
2. kill -9 of a holder: the lease expires and the next taker gets epoch + 1,
   never before expiry + grace;
3. a stale holder: stopped past its TTL it cannot renew (exit 4) nor move
   LATEST, neither directly (--epoch) nor after it resumes; a holder whose
   lease is overwritten behind its back loses it at the next renewal;
4. 20 racing LATEST updates with random offsets: LATEST never moves
   backwards (a reader polls it throughout) and ends at the newest.
"""
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

spotlib.store_env()
c = spotlib.Checks()
url, root = None, None
roots = []
BUCKET = os.environ["SPOT_TEST_S3_BUCKET"]
procs = []


def new_job(name):
    """Each part gets a job of its own."""
    global url, root
    url, root = spotlib.unique_job("lease-" + name)
    roots.append(root)


def start(*args):
    p = spotlib.spotctl_popen("lease", url, *args, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    procs.append(p)
    return p


def fields(out, word):
    """key=value fields of the first output line starting with word."""
    for line in out.splitlines():
        if line.startswith(word + " "):
            return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    return None


def wait_line(p, word, timeout):
    """Reads p's stdout until a line starting with word; returns (fields,
    text so far)."""
    text = ""
    end = time.time() + timeout
    while time.time() < end:
        line = p.stdout.readline()
        if not line:
            break
        text += line
        if line.startswith(word + " "):
            return fields(line, word), text
    return None, text


def latest():
    """(name, order) of LATEST as another client (boto3) sees it."""
    try:
        o = spotlib.s3().get_object(Bucket=BUCKET, Key=root + "LATEST")
    except Exception:  # noqa: BLE001 - absent
        return None, None
    return o["Body"].read().decode(), o.get("Metadata", {}).get("spotd-order")


def order_key(o):
    e, s = o.split(".")
    return (int(e), int(s))


def handoff_round(i):
    """Two acquirers at once. Returns the handoff in ms or None."""
    a = start("--owner", "A%d" % i, "--ttl", "5", "--poll", "0.2", "--hold", "1.5")
    b = start("--owner", "B%d" % i, "--ttl", "5", "--poll", "0.2", "--hold", "1.5")
    oa, ea = a.communicate(timeout=30)
    ob, eb = b.communicate(timeout=30)
    c.check(a.returncode == 0 and b.returncode == 0,
            "round %d: both acquirers end well" % i, oa + ea + ob + eb)
    fa, fb = fields(oa, "acquired"), fields(ob, "acquired")
    ra, rb = fields(oa, "released"), fields(ob, "released")
    if not (fa and fb and ra and rb):
        c.check(False, "round %d: both acquired and released" % i, oa + ob)
        return None
    first, second = (fa, fb) if int(fa["at_ms"]) < int(fb["at_ms"]) else (fb, fa)
    rel_first = ra if first is fa else rb
    waited = fields(ob if second is fb else oa, "waiting")
    c.check(waited is not None and waited["owner"] == first["owner"],
            "round %d: the second waited, naming the holder" % i, oa + ob)
    c.check(int(second["epoch"]) == int(first["epoch"]) + 1,
            "round %d: the second holds epoch + 1" % i,
            "%s then %s" % (first["epoch"], second["epoch"]))
    # the release record's expires_ms is the moment the release was written
    released_at = int(rel_first["expires_ms"])
    got_at = int(second["at_ms"])
    c.check(got_at >= released_at,
            "round %d: no overlap: taken after the release" % i,
            "released %d, acquired %d" % (released_at, got_at))
    return got_at - released_at


def test_handoff():
    new_job('handoff')
    times = [t for t in (handoff_round(i) for i in range(3)) if t is not None]
    if times:
        print("handoff ms (release written -> next holder acquired, poll 0.2 s): "
              "%s, median %d" % (times, statistics.median(times)))
        c.check(max(times) < 1500, "handoff under 1.5 s", repr(times))


def test_kill9():
    new_job('kill9')
    k = start("--owner", "K", "--ttl", "2", "--hold", "60")
    fk, text = wait_line(k, "acquired", 20)
    c.check(fk is not None, "holder K acquires", text)
    if fk is None:
        return
    k.send_signal(signal.SIGKILL)
    k.wait(timeout=10)
    lcp = spotlib.spotctl("lease", url, "--owner", "L", "--grace", "0.5", "--poll", "0.2",
                          "--hold", "0.1", timeout=30)
    fl = fields(lcp.stdout, "acquired")
    c.check(lcp.returncode == 0 and fl is not None, "L takes over after kill -9",
            lcp.stdout + lcp.stderr)
    if fl is None:
        return
    c.check(int(fl["epoch"]) == int(fk["epoch"]) + 1, "L's epoch is K's + 1",
            "%s -> %s" % (fk["epoch"], fl["epoch"]))
    at, due = int(fl["at_ms"]), int(fk["expires_ms"]) + 500
    c.check(at >= due, "not before K's expiry + grace", "%d < %d" % (at, due))
    print("takeover after kill -9: %d ms after expiry + grace" % (at - due))
    c.check(at - due < 2000, "taken within 2 s of expiry + grace", str(at - due))

    # an operator's release: the lease left held by M, released as M only
    m = spotlib.spotctl("lease", url, "--owner", "M", "--ttl", "60", timeout=30)
    c.check(m.returncode == 0 and fields(m.stdout, "acquired") is not None,
            "M acquires and exits, leaving it held", m.stdout + m.stderr)
    z = spotlib.spotctl("lease", url, "--owner", "Z", "--release")
    c.check(z.returncode == 4 and "not held by Z" in z.stderr,
            "another owner cannot release it (exit 4)", z.stdout + z.stderr)
    n = spotlib.spotctl("lease", url, "--owner", "N", "--no-wait")
    c.check(n.returncode == 3 and fields(n.stdout, "busy") is not None,
            "--no-wait refuses at once (exit 3), naming the holder",
            n.stdout + n.stderr)
    r = spotlib.spotctl("lease", url, "--owner", "M", "--release")
    x = spotlib.spotctl("lease", url, "--show")
    fx = fields(x.stdout, "released")
    c.check(r.returncode == 0 and fx is not None and fx["owner"] == "M" and
            fx["epoch"] == fields(m.stdout, "acquired")["epoch"],
            "M's lease released by owner id, epoch kept", r.stderr + x.stdout)


def test_stale():
    new_job('stale')
    s = start("--owner", "S", "--ttl", "2", "--hold", "6", "--set-latest", "ckS",
              "--seq", "100")
    fs, text = wait_line(s, "acquired", 20)
    c.check(fs is not None, "S acquires", text)
    if fs is None:
        return
    s.send_signal(signal.SIGSTOP)  # a stall longer than its TTL
    t = spotlib.spotctl("lease", url, "--owner", "T", "--grace", "0.5", "--poll", "0.2",
                        "--set-latest", "ckT", "--seq", "1", timeout=30)
    ft = fields(t.stdout, "acquired")
    c.check(t.returncode == 0 and ft is not None and
            int(ft["epoch"]) == int(fs["epoch"]) + 1,
            "T takes the stalled lease with epoch + 1 and moves LATEST",
            t.stdout + t.stderr)
    c.check(latest() == ("ckT", "%s.1" % ft["epoch"] if ft else "?"),
            "LATEST names ckT at T's epoch", repr(latest()))
    # S, still stopped: a direct update as holder of its old epoch is fenced
    d = spotlib.spotctl("lease", url, "--owner", "S", "--epoch", fs["epoch"],
                        "--set-latest", "ckS2", "--seq", "999")
    c.check(d.returncode == 4 and "fenced" in d.stderr,
            "the old epoch cannot move LATEST (exit 4)", d.stdout + d.stderr)
    s.send_signal(signal.SIGCONT)
    out, err = s.communicate(timeout=30)
    c.check(s.returncode == 4 and "lost" in text + out,
            "S resumes, finds its lease lost, exits 4", text + out + err)
    c.check("latest name=ckS" not in out, "S never moved LATEST", out)
    c.check(latest()[0] == "ckT", "LATEST still names ckT", repr(latest()))

    # a holder whose lease is overwritten behind its back (a takeover
    # under clock skew): its next renewal fails its If-Match
    r = start("--owner", "R", "--ttl", "3", "--hold", "10")
    fr, text = wait_line(r, "acquired", 20)
    c.check(fr is not None, "R acquires", text)
    if fr is None:
        return
    body = ('{"format":"spotd-lease","version":1,"owner":"X","epoch":%d,'
            '"state":"held","ttl_ms":60000,"expires_ms":%d,"nonce":"x1"}'
            % (int(fr["epoch"]) + 1, int(time.time() * 1000) + 60000))
    spotlib.s3_put(root + "LEASE", body.encode())
    out, err = r.communicate(timeout=20)
    c.check(r.returncode == 4 and "another writer holds it" in err,
            "R's renewal is refused: lost, exit 4", out + err)
    x = spotlib.spotctl("lease", url, "--show")
    c.check(fields(x.stdout, "held") is not None and fields(x.stdout, "held")["owner"] == "X",
            "the lease still names X", x.stdout + x.stderr)


def test_race():
    new_job('race')
    w = spotlib.spotctl("lease", url, "--owner", "W", "--ttl", "120", "--grace", "0",
                        "--timeout", "30", "--poll", "0.2")
    fw = fields(w.stdout, "acquired")
    c.check(w.returncode == 0 and fw is not None, "W acquires for the race",
            w.stdout + w.stderr)
    if fw is None:
        return
    epoch = fw["epoch"]
    seen, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            n, o = latest()
            if o is not None and (not seen or seen[-1] != (n, o)):
                seen.append((n, o))
            time.sleep(0.01)

    th = threading.Thread(target=reader)
    th.start()
    rng = random.Random(os.getpid())
    delays = {k: rng.uniform(0, 1.0) for k in range(1, 21)}
    while sorted(delays.values()).index(delays[20]) < 10:
        delays[20] = rng.uniform(0, 1.0)  # the newest starts in the second half
    seqs = list(delays)
    t0 = time.time()
    running = []
    for k in sorted(seqs, key=lambda k: delays[k]):
        time.sleep(max(0, t0 + delays[k] - time.time()))
        running.append((k, start("--owner", "W", "--epoch", epoch, "--set-latest",
                                 "ck-%02d" % k, "--seq", str(k))))
    results = {}
    for k, p in running:
        out, err = p.communicate(timeout=60)
        results[k] = (p.returncode, out, err)
    time.sleep(0.1)
    stop.set()
    th.join()
    bad = {k: r for k, r in results.items() if r[0] not in (0, 4)}
    c.check(not bad, "every update ends moved (0) or refused as not newer (4)",
            repr(bad))
    moved = sorted(k for k, r in results.items() if r[0] == 0)
    refused = sorted(k for k, r in results.items() if r[0] == 4)
    order = [k for k, _ in running]
    print("race: started in order %s; %d moved LATEST (%s), %d refused; "
          "reader saw %d states, %d compare-and-swap retries"
          % (order, len(moved), moved, len(refused), len(seen),
             sum(int((fields(r[1], "latest") or {}).get("rounds", 1)) - 1
                 for r in results.values())))
    for k in refused:
        f = fields(results[k][1], "refused")
        c.check(f is not None and order_key(f["order"]) >= (int(epoch), k),
                "update %d refused only because LATEST was newer" % k, results[k][1])
    orders = [order_key(o) for _, o in seen]
    c.check(all(a < b for a, b in zip(orders, orders[1:])),
            "LATEST never moved backwards (as polled)", repr(seen))
    c.check(latest() == ("ck-20", "%s.20" % epoch), "LATEST ends at the newest",
            repr(latest()))
    c.check(20 in moved, "the newest update succeeded", repr(moved))


try:
    t0 = time.time()
    only = os.environ.get("LEASE_TEST_ONLY")  # a debugging aid
    for t in (test_handoff, test_kill9, test_stale, test_race):
        if not only or t.__name__ == only:
            t()
    print("elapsed %.1f s" % (time.time() - t0))
finally:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()
    for r in roots:
        spotlib.s3_cleanup(r)

c.finish()
