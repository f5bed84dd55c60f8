#!/usr/bin/python3
"""Job history against the real S3 server: a realistic sequence of events
(two runs on two nodes, one preemption after a short notice whose final
checkpoint did not commit, a gap without a node, a restore) goes through
the real writer (lib/io/store/history_store.c, via spotctl history-event); boto3
reads the objects back independently; `spotctl history` shows the counts
and the lost work this test computes itself; --json matches; --plot draws
a PNG and an SVG with one bar per run. A 2-node job (two ranks per run
sharing a run id, a lease wait, a start refused in between) counts 2 runs,
not 4, no crash for the refusal, training as a share of the job's wall
time; its plot has a lane per rank, the lease wait in its own colour and
no restore where there was none. Also: invalid events are refused before
anything is written, a dead endpoint is a reported failure, and --keep
prunes to the newest events."""
import json
import os
import re
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

RUN_RGB = (47, 111, 189)  # SPOTCTL_PLOT_RUN_* in client/spotctl.h
LEASE_RGB = (250, 205, 80)  # SPOTCTL_PLOT_LEASE_RGB
RESTORE_RGB = (157, 187, 224)  # SPOTCTL_PLOT_RESTORE_RGB
REFUSED_RGB = (150, 150, 150)  # SPOTCTL_PLOT_REFUSED_RGB
BAR_MIN_H = 20            # run bars are 22 px high, legend swatches 12

spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("history")
bucket = os.environ["SPOT_TEST_S3_BUCKET"]

# A timeline in seconds from t0 (two hours ago), as a real job's would be.
t0 = (int(time.time()) - 7200) * 1000


def at(s):
    return t0 + int(s * 1000)


A, B = "node-a-4242-0f3c", "node-b-777-a1b2"
events = [
    {"type": "run_start", "t": 0, "owner": A, "host": "ip-10-0-0-5",
     "instance_id": "i-0a1", "instance_type": "g5.xlarge", "zone": "us-east-1a"},
    {"type": "lease", "t": 1, "owner": A, "action": "acquired", "epoch": 1},
    {"type": "checkpoint", "t": 600, "owner": A, "checkpoint": "step-600",
     "reason": "periodic", "save_s": 4.25, "upload_s": 11.5, "step": 596,
     "raw_bytes": 707000000, "stored_bytes": 580000000, "committed": True},
    {"type": "checkpoint", "t": 1200, "owner": A, "checkpoint": "step-1200",
     "reason": "periodic", "save_s": 3.75, "upload_s": 10.25, "step": 1186,
     "raw_bytes": 707000000, "stored_bytes": 580000000, "committed": True},
    {"type": "notice", "t": 1633.5, "owner": A, "kind": "aws-spot-terminate",
     "deadline_ms": at(1753.5), "step": 1620},
    {"type": "checkpoint", "t": 1700, "owner": A, "checkpoint": "step-1620",
     "reason": "notice", "save_s": 4.0, "upload_s": 60.0, "step": 1620,
     "committed": False},
    {"type": "run_end", "t": 1710, "owner": A, "outcome": "preempted",
     "committed": False, "exit_signal": 15},
    {"type": "relaunch", "t": 1711, "owner": A, "backend": "exec",
     "result": "ok", "reason": "aws-spot-terminate"},
    {"type": "run_start", "t": 1950, "owner": B, "host": "ip-10-0-1-9",
     "instance_type": "g5.xlarge", "zone": "us-east-1b", "restart_count": 1},
    {"type": "restore", "t": 1988, "owner": B, "checkpoint": "step-1200",
     "seconds": 36.5, "step": 1186, "raw_bytes": 707000000,
     "stored_bytes": 580000000},
    {"type": "checkpoint", "t": 2588, "owner": B, "checkpoint": "step-1786",
     "reason": "periodic", "save_s": 4.5, "upload_s": 12.0, "step": 1786,
     "committed": True},
    {"type": "run_end", "t": 3000, "owner": B, "outcome": "exited",
     "exit_code": 0},
]
seq = {}
lines = []
for e in events:
    ev = {k: v for k, v in e.items() if k != "t"}
    ev.update({"v": 1, "time_ms": at(e["t"]), "seq": seq.get(e["owner"], 0)})
    seq[e["owner"]] = ev["seq"] + 1
    lines.append(json.dumps(ev))

# What this test expects, computed here from the timeline, not by spotd:
# the newest commit before the notice held the state of when its save
# began; the notice is when training stopped counting.
capture = 1200 - 3.75 - 10.25
expect_lost = 1633.5 - capture
expect_lost_steps = 1620 - 1186
expect_gap = 1988 - 1710
expect_train = (1710 - 0) + (3000 - 1988)
expect_node = 1710 + (3000 - 1950)


def ctl(*args, input=None, env=None, timeout=120):
    return spotlib.run([spotlib.spotctl_exe()] + [str(a) for a in args],
                       input=input, env=env, timeout=timeout)


def fmt_dur(s):
    s = int(s)
    return "%dm%02ds" % (s // 60, s % 60) if s < 3600 else "%dh%02dm" % (s // 3600, s % 3600 // 60)


def run_boxes_png(path):
    """Connected blocks of exactly RUN_RGB at least BAR_MIN_H high."""
    from PIL import Image
    im = Image.open(path).convert("RGB")
    w, h = im.size
    px = im.load()
    seen = set()
    boxes = []
    for y in range(h):
        for x in range(w):
            if (x, y) in seen or px[x, y] != RUN_RGB:
                continue
            stack, xs, ys = [(x, y)], [], []
            seen.add((x, y))
            while stack:
                cx, cy = stack.pop()
                xs.append(cx)
                ys.append(cy)
                for nx, ny in ((cx + 1, cy), (cx - 1, cy), (cx, cy + 1), (cx, cy - 1)):
                    if 0 <= nx < w and 0 <= ny < h and (nx, ny) not in seen \
                            and px[nx, ny] == RUN_RGB:
                        seen.add((nx, ny))
                        stack.append((nx, ny))
            boxes.append((min(xs), min(ys), max(xs), max(ys)))
    return [b for b in boxes if b[3] - b[1] + 1 >= BAR_MIN_H], im.size


def pixels(path, rgb):
    from PIL import Image
    return sum(1 for p in Image.open(path).convert("RGB").getdata() if p == rgb)


def to_lines(evs):
    """history-event lines: times from t0 in seconds, seq per owner."""
    seq, out = {}, []
    for e in evs:
        ev = {k: v for k, v in e.items() if k != "t"}
        ev.update({"v": 1, "time_ms": at(e["t"]), "seq": seq.get(e["owner"], 0)})
        seq[e["owner"]] = ev["seq"] + 1
        out.append(json.dumps(ev))
    return out


# A 2-node job: run slurm-9.0 (ranks 0 and 1 on gpu-a and gpu-b; rank 0
# waits 30 s for the lease), a start on another node refused because the
# lease is held, then run slurm-9.1 on two other hosts restores and
# finishes.
R0, R1, R2, R3, RX = "a-r0-1", "b-r1-2", "c-r0-3", "d-r1-4", "x-5"
multi = []
for owner, host, run, rank in ((R0, "gpu-a", "slurm-9.0", 0),
                               (R1, "gpu-b", "slurm-9.0", 1)):
    multi.append({"type": "run_start", "t": rank, "owner": owner, "host": host,
                  "run": run, "rank": rank, "nranks": 2})
multi += [
    {"type": "lease", "t": 2, "owner": R0, "action": "waiting"},
    {"type": "lease", "t": 32, "owner": R0, "action": "held", "epoch": 1},
]
for owner in (R0, R1):
    multi += [
        {"type": "checkpoint", "t": 600, "owner": owner, "checkpoint": "step-590",
         "reason": "periodic", "save_s": 2.0, "upload_s": 8.0, "step": 590,
         "committed": True},
        {"type": "notice", "t": 900, "owner": owner, "kind": "aws-spot-terminate",
         "step": 880},
        {"type": "run_end", "t": 910, "owner": owner, "outcome": "preempted"},
    ]
multi += [
    {"type": "run_start", "t": 905, "owner": RX, "host": "gpu-x"},
    {"type": "lease", "t": 906, "owner": RX, "action": "failed"},
    {"type": "run_end", "t": 907, "owner": RX, "outcome": "refused",
     "reason": "lease-held"},
]
for owner, host, rank in ((R2, "gpu-c", 0), (R3, "gpu-d", 1)):
    multi += [
        {"type": "run_start", "t": 1000 + rank, "owner": owner, "host": host,
         "run": "slurm-9.1", "rank": rank, "nranks": 2},
        {"type": "restore", "t": 1040 + rank, "owner": owner,
         "checkpoint": "step-590", "seconds": 30.0},
        {"type": "run_end", "t": 2000, "owner": owner, "outcome": "exited",
         "exit_code": 0},
    ]
multi.sort(key=lambda e: e["t"])
# Computed here: rank 0 trained from the lease (32 s), the job's second
# run from its last rank's restore (1041 s); one preemption lost the
# steps and time since the state of the commit at 600 s (590 s, step 590).
m_train = (910 - 32) + (2000 - 1041)
m_lost = 900 - (600 - 2.0 - 8.0)
m_lost_steps = 880 - 590
m_gap = 1041 - 910


def run_boxes_svg(path):
    """Filled paths of RUN_RGB (cairo writes rgb(..%)) at least BAR_MIN_H
    high, from their coordinates."""
    want = tuple(round(v / 255 * 100, 3) for v in RUN_RGB)
    boxes = []
    for el in ET.parse(path).getroot().iter():
        if not el.tag.endswith("path"):
            continue
        m = re.search(r"fill:rgb\(([\d.]+)%,([\d.]+)%,([\d.]+)%\)", el.get("style", ""))
        if not m or tuple(round(float(v), 3) for v in m.groups()) != want:
            continue
        nums = [float(v) for v in re.findall(r"-?[\d.]+", el.get("d", ""))]
        ys = nums[1::2]
        if ys and max(ys) - min(ys) >= BAR_MIN_H:
            boxes.append((min(nums[0::2]), min(ys), max(nums[0::2]), max(ys)))
    return boxes


try:
    with tempfile.TemporaryDirectory() as tmp:
        # Write through the real writer; boto3 reads the objects back.
        cp = ctl("history-event", url, "-", input="\n".join(lines) + "\n")
        c.check(cp.returncode == 0, "history-event writes 12 events", cp.stdout + cp.stderr)
        keys = spotlib.s3_keys(root + "history/")
        c.check(len(keys) == len(events), "one object per event", repr(keys))
        pat = re.compile(re.escape(root) + r"history/\d{13}-[A-Za-z0-9._-]+-\d{6}\.json$")
        c.check(all(pat.match(k) for k in keys), "keys are history/<time>-<owner>-<seq>.json",
                repr(keys[:3]))
        got = [json.loads(spotlib.s3_get(k)) for k in keys]
        c.check(sorted((g["time_ms"], g["owner"], g["seq"]) for g in got) ==
                sorted((json.loads(l)["time_ms"], json.loads(l)["owner"], json.loads(l)["seq"])
                       for l in lines),
                "boto3 reads back every event's header")
        notice = [g for g in got if g["type"] == "notice"]
        c.check(len(notice) == 1 and notice[0]["kind"] == "aws-spot-terminate" and
                notice[0]["deadline_ms"] == at(1753.5), "the notice's fields are stored",
                repr(notice))

        # A job with no history (a mistyped name): one line, exit 1.
        cp = ctl("history", url + "-no-such-job")
        c.check(cp.returncode == 1 and cp.stdout == "" and
                len(cp.stderr.splitlines()) == 1 and
                "has no history in the store" in cp.stderr,
                "a job with no history fails with one line",
                repr((cp.returncode, cp.stdout, cp.stderr)))

        # The table.
        cp = ctl("history", url, "--price-spot", "0.40", "--price-on-demand", "1.21")
        out = cp.stdout
        c.check(cp.returncode == 0, "spotctl history succeeds", out + cp.stderr)
        c.check("2 runs, 1 preemption, 0 crashes" in out, "counts in the headline", out)
        rows = [l for l in out.splitlines() if re.match(r"^\d+\s", l)]
        c.check(len(rows) == 2 and "preempted" in rows[0] and "exited" in rows[1],
                "one row per run with its outcome", "\n".join(rows))
        c.check(len(rows) == 2 and fmt_dur(expect_lost) in rows[0] and
                "(%d st)" % expect_lost_steps in rows[0],
                "run 1 lost %s (%d steps), as measured here" % (fmt_dur(expect_lost),
                                                               expect_lost_steps),
                rows[0] if rows else out)
        c.check(len(rows) == 2 and rows[1].rstrip().endswith(fmt_dur(expect_gap)),
                "run 2's resume gap is %s" % fmt_dur(expect_gap), rows[1] if rows else out)
        c.check(re.search(r"work lost\s+%s \(%d steps\)" % (fmt_dur(expect_lost),
                                                          expect_lost_steps), out) is not None,
                "summary's work lost", out)
        c.check("ip-10-0-0-5" in out and "ip-10-0-1-9" in out, "nodes named by host", out)

        # --json for scripts: the same figures, exactly.
        cp = ctl("history", url, "--json", "--price-spot", "0.40",
                             "--price-on-demand", "1.21")
        j = json.loads(cp.stdout) if cp.returncode == 0 else {}
        s = j.get("summary", {})
        c.check(s.get("runs") == 2 and s.get("preemptions") == 1 and s.get("crashes") == 0,
                "--json counts", cp.stdout[:400] + cp.stderr)
        c.check(abs(s.get("lost_s", -1) - expect_lost) < 1e-6 and
                s.get("lost_steps") == expect_lost_steps,
                "--json lost work %.1f s / %d steps" % (expect_lost, expect_lost_steps),
                repr(s))
        c.check(abs(s.get("gap_s", -1) - expect_gap) < 1e-6, "--json resume gap", repr(s))
        c.check(abs(s.get("train_s", -1) - expect_train) < 1e-6 and
                abs(s.get("wall_s", -1) - 3000) < 1e-6, "--json wall and training time",
                repr(s))
        c.check(s.get("checkpoints") == 4 and s.get("commits") == 3 and
                s.get("failed_checkpoints") == 1 and s.get("relaunches") == 1 and
                s.get("notices") == 1 and s.get("lease_changes") == 1,
                "--json checkpoint, notice, relaunch, lease counts", repr(s))
        cost = s.get("cost", {})
        c.check(abs(cost.get("spot", -1) - expect_node / 3600 * 0.40) < 1e-9 and
                abs(cost.get("on_demand", -1) -
                    (expect_train - expect_lost) / 3600 * 1.21) < 1e-9,
                "--json cost against on-demand", repr(cost))
        runs = j.get("runs", [])
        c.check([r.get("outcome") for r in runs] == ["preempted", "exited"] and
                runs[1].get("restored") == "step-1200" and
                runs[0].get("notice_kind") == "aws-spot-terminate",
                "--json runs", repr(runs)[:600])
        c.check(len(j.get("events", [])) == len(events), "--json carries the events")

        # The pictures.
        png = os.path.join(tmp, "timeline.png")
        cp = ctl("history", url, "--plot", png)
        c.check(cp.returncode == 0 and os.path.exists(png), "--plot writes a PNG",
                cp.stdout[-300:] + cp.stderr)
        if os.path.exists(png):
            with open(png, "rb") as f:
                head = f.read(24)
            c.check(head[:8] == b"\x89PNG\r\n\x1a\n", "PNG signature")
            w = int.from_bytes(head[16:20], "big")
            h = int.from_bytes(head[20:24], "big")
            c.check(w == 1000 and 150 <= h <= 400, "PNG size %dx%d" % (w, h))
            boxes, size = run_boxes_png(png)
            c.check(len(boxes) == 2, "one bar per run in the PNG", repr(boxes))
            if len(boxes) == 2:
                (a0, ay0, a1, _), (b0, by0, b1, _) = sorted(boxes)
                c.check(a1 < b0 and ay0 != by0,
                        "the bars are on two lanes, run 1 before run 2", repr(boxes))
                # Widths follow training times (1710 s vs 1012 s).
                ratio = (a1 - a0) / max(1, b1 - b0)
                c.check(abs(ratio - 1710 / 1012) < 0.05, "bar widths follow training time",
                        "%.3f" % ratio)
        svg = os.path.join(tmp, "timeline.svg")
        cp = ctl("history", url, "--plot", svg)
        c.check(cp.returncode == 0 and os.path.exists(svg), "--plot writes an SVG",
                cp.stderr)
        if os.path.exists(svg):
            boxes = run_boxes_svg(svg)
            c.check(len(boxes) == 2, "one bar per run in the SVG", repr(boxes))

        # A 2-node job with a refused start and a lease wait.
        multi_url, multi_root = spotlib.unique_job("history-multi")
        cp = ctl("history-event", multi_url, "-", input="\n".join(to_lines(multi)) + "\n")
        c.check(cp.returncode == 0, "history-event writes the 2-node job", cp.stderr)
        cp = ctl("history", multi_url, "--json")
        j = json.loads(cp.stdout) if cp.returncode == 0 else {}
        s = j.get("summary", {})
        c.check(s.get("runs") == 2 and s.get("preemptions") == 1 and
                s.get("crashes") == 0 and s.get("refused") == 1 and s.get("nodes") == 5,
                "2-node job: 2 runs (not 4), 1 preemption, 0 crashes, 1 refused start",
                cp.stdout[:600] + cp.stderr)
        c.check(abs(s.get("train_s", -1) - m_train) < 1e-6 and
                abs(s.get("wall_s", -1) - 2000) < 1e-6,
                "2-node job: training %d s of the job's 2000 s (not the ranks' sum)"
                % m_train, repr(s))
        c.check(abs(s.get("lost_s", -1) - m_lost) < 1e-6 and
                s.get("lost_steps") == m_lost_steps,
                "2-node job: one preemption's loss, %d steps" % m_lost_steps, repr(s))
        c.check(abs(s.get("lease_wait_s", -1) - 30) < 1e-6 and
                abs(s.get("gap_s", -1) - m_gap) < 1e-6,
                "2-node job: 30 s lease wait, %d s gap (the refusal is no run)" % m_gap,
                repr(s))
        runs = j.get("runs", [])
        c.check([(r.get("run_id"), r.get("outcome"), len(r.get("nodes", [])))
                 for r in runs] ==
                [("slurm-9.0", "preempted", 2), ("", "refused", 1),
                 ("slurm-9.1", "exited", 2)] and runs[1].get("refused") == "lease-held",
                "2-node job: the runs with their ranks, the refusal with its reason",
                repr(runs)[:800])
        cp = ctl("history", multi_url)
        out = cp.stdout
        pct = re.search(r"time training\s+\S+ \((\d+)% of wall time\)", out)
        c.check(cp.returncode == 0 and
                "2 runs, 1 preemption, 0 crashes, 1 refused start" in out and
                pct is not None and int(pct.group(1)) == round(100 * m_train / 2000),
                "2-node table: headline and %d%% of wall time" % round(100 * m_train / 2000),
                out + cp.stderr)
        rows = [l for l in out.splitlines() if re.match(r"^\d+\s", l)]
        c.check(len(rows) == 3 and "2 nodes" in rows[0] and "refused" in rows[1],
                "2-node table: one row per run", "\n".join(rows))
        png = os.path.join(tmp, "multi.png")
        cp = ctl("history", multi_url, "--plot", png)
        c.check(cp.returncode == 0 and os.path.exists(png), "2-node --plot", cp.stderr)
        if os.path.exists(png):
            boxes, _ = run_boxes_png(png)
            lanes = sorted(set(b[1] for b in boxes))
            c.check(len(boxes) == 4 and len(lanes) == 2,
                    "2-node plot: 4 bars on 2 lanes (one per rank, not per host)",
                    repr(boxes))
            lease_px = pixels(png, LEASE_RGB)
            restore_px = pixels(png, RESTORE_RGB)
            # 30 s of 2000 s over 820 px, 22 px high; restores: 2 x 30 s.
            c.check(lease_px >= 10 * 22, "2-node plot: the lease wait in its own colour",
                    "%d px" % lease_px)
            c.check(restore_px < 3 * 13 * 22 + 12 * 12,
                    "2-node plot: no restore drawn for the lease wait (%d px)" % restore_px)
            c.check(pixels(png, REFUSED_RGB) > 12 * 12, "2-node plot: the refused start")

        # Bad input: nothing is written.
        bad_url, bad_root = spotlib.unique_job("history-bad")
        bad = lines[0] + "\n" + lines[1].replace('"epoch": 1', '"epoch": "1"') + "\n"
        cp = ctl("history-event", bad_url, "-", input=bad)
        c.check(cp.returncode == 2 and "epoch" in cp.stderr and ":2:" in cp.stderr,
                "an invalid event is refused with its line", cp.stderr)
        c.check(spotlib.s3_keys(bad_root) == [], "nothing written for an invalid input")
        cp = ctl("history", bad_url, "--plot", os.path.join(tmp, "x.pdf"))
        c.check(cp.returncode == 2 and "png" in cp.stderr.lower(), "--plot wants .png or .svg",
                cp.stderr)

        # A failed write is a reported failure (a warning in spotd).
        cp = ctl("history-event", url, "-", input=lines[0] + "\n",
                             env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, timeout=60)
        c.check(cp.returncode == 1 and "0 of 1 events written" in cp.stderr and
                "warning" in cp.stderr, "a dead endpoint: a warning and exit 1", cp.stderr)

        # Pruning keeps the newest.
        prune_url, prune_root = spotlib.unique_job("history-prune")
        many = [json.dumps({"v": 1, "type": "lease", "time_ms": t0 + i * 1000,
                            "owner": "p", "seq": i, "action": "renewed", "epoch": 1})
                for i in range(70)]
        cp = ctl("history-event", prune_url, "-", "--keep", "10",
                             input="\n".join(many) + "\n")
        c.check(cp.returncode == 0, "70 events with --keep 10", cp.stderr)
        left = spotlib.s3_keys(prune_root + "history/")
        c.check(len(left) == 10 and left[0].endswith("-p-000060.json") and
                left[-1].endswith("-p-000069.json"), "pruned to the 10 newest",
                repr(left[:2]) + " ... %d keys" % len(left))
        for r in (bad_root, prune_root, multi_root):
            spotlib.s3_cleanup(r)
finally:
    spotlib.s3_cleanup(root)

c.finish()
