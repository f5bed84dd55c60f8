#!/usr/bin/python3
"""spotd's metrics in the Prometheus text format, read back by a real
parser (Debian's python3-prometheus-client): a random sequence of updates
goes through the registry (lib/core/metrics.c, via metrics_tool); the
parsed families have conventional names, types, help, and values equal to
what this test computed from the same updates; every sample carries the
job and rank labels, and a labelled counter has no unlabelled 0 sample; histograms are cumulative
with +Inf, _sum and _count; awkward label values survive escaping; the
file written for node_exporter's textfile collector is the same text,
replaced atomically (no temporary file left)."""
import math
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("FAIL: python3-prometheus-client is not installed (tools/deps.sh test)")
    sys.exit(1)

c = spotlib.Checks()
tool = spotlib.builddir_path("tests", "integration", "metrics_tool")
rnd = random.Random(17)

SAVE_B = [0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300]
UPLOAD_B = [1, 2, 5, 10, 20, 30, 60, 120, 300, 600]
reasons = ["periodic", "notice", "manual"]
kinds = ["aws-spot-terminate", "aws-rebalance", "gcp-preempted"]

# spotd labels every sample with its job and rank.
COMMON = (("job", "llm-7b"), ("rank", "3"))
updates = ["common - " + " ".join("%s=%s" % kv for kv in COMMON)]
# Families whose every sample has labels of its own: no unlabelled sample.
LABELLED = {"spotd_checkpoints_total", "spotd_uploaded_bytes_total",
            "spotd_notices_total", "spotd_relaunches_total"}
counters = {}   # (family, labels tuple) -> value
gauges = {}
hists = {"spotd_checkpoint_save_seconds": [], "spotd_checkpoint_upload_seconds": []}


def add(fam, v, **labels):
    key = (fam, tuple(sorted(labels.items())))
    counters[key] = counters.get(key, 0) + v
    updates.append("add %s %r %s" % (fam, v, " ".join("%s=%s" % kv for kv in labels.items())))


for i in range(200):
    what = rnd.randrange(6)
    if what == 0:
        reason = rnd.choice(reasons)
        outcome = rnd.choice(["committed", "failed"])
        add("spotd_checkpoints_total", 1, reason=reason, outcome=outcome)
        save = round(rnd.uniform(0.1, 400), 3)
        up = round(rnd.uniform(0.5, 700), 3)
        hists["spotd_checkpoint_save_seconds"].append(save)
        hists["spotd_checkpoint_upload_seconds"].append(up)
        updates.append("observe spotd_checkpoint_save_seconds %r" % save)
        updates.append("observe spotd_checkpoint_upload_seconds %r" % up)
        if outcome == "committed":
            raw = rnd.randrange(1, 1 << 40)
            add("spotd_uploaded_bytes_total", raw, kind="raw")
            add("spotd_uploaded_bytes_total", raw // 2, kind="stored")
            ts = 1764748800 + i
            gauges[("spotd_last_commit_timestamp_seconds", ())] = ts
            updates.append("set spotd_last_commit_timestamp_seconds %d" % ts)
    elif what == 1:
        add("spotd_notices_total", 1, kind=rnd.choice(kinds))
    elif what == 2:
        add("spotd_metadata_poll_errors_total", 1)
    elif what == 3:
        add("spotd_relaunches_total", 1, outcome=rnd.choice(["ok", "failed"]))
    elif what == 4:
        v = round(rnd.uniform(0, 5000), 2)
        gauges[("spotd_work_at_risk_seconds", ())] = v
        updates.append("set spotd_work_at_risk_seconds %r" % v)
    else:
        add("spotd_trainer_restarts_total", 1)
# Escaping: a label value with a quote and a backslash (the tool reads
# one update per line, so the newline escape is left to the unit test).
add("spotd_checkpoints_total", 1, reason='we"ird\\reason', outcome="failed")
gauges[("spotd_restore_duration_seconds", ())] = 36.5
updates.append("set spotd_restore_duration_seconds 36.5")

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "spotd.prom")
    with open(path, "w") as f:
        f.write("old content\n")
    cp = spotlib.run([tool, path], input="\n".join(updates) + "\n")
    c.check(cp.returncode == 0, "metrics_tool applies %d updates" % len(updates), cp.stderr)
    text = cp.stdout
    with open(path) as f:
        c.check(f.read() == text, "the metrics file holds the same text")
    c.check(sorted(os.listdir(tmp)) == ["spotd.prom"], "no temporary file left",
            repr(os.listdir(tmp)))
    c.check(oct(os.stat(path).st_mode & 0o777) == "0o644", "metrics file mode 0644")

    try:
        fams = {f.name: f for f in text_string_to_metric_families(text)}
    except Exception as e:  # noqa: BLE001
        fams = {}
        c.check(False, "the real parser reads the output", repr(e) + "\n" + text[:2000])

    # prometheus_client strips _total from counter family names.
    want_types = {
        "spotd_checkpoints": "counter", "spotd_uploaded_bytes": "counter",
        "spotd_notices": "counter", "spotd_metadata_poll_errors": "counter",
        "spotd_relaunches": "counter", "spotd_trainer_restarts": "counter",
        "spotd_checkpoint_save_seconds": "histogram",
        "spotd_checkpoint_upload_seconds": "histogram",
        "spotd_last_commit_timestamp_seconds": "gauge",
        "spotd_work_at_risk_seconds": "gauge",
        "spotd_restore_duration_seconds": "gauge",
    }
    for name, typ in want_types.items():
        f = fams.get(name)
        c.check(f is not None and f.type == typ and f.documentation,
                "%s is a %s with help" % (name, typ),
                repr((f.type, f.documentation)) if f else "missing")

    got_counters = {}
    got_gauges = {}
    got_hist = {}
    no_common = []
    for f in fams.values():
        for s in f.samples:
            if any(s.labels.get(k) != v for k, v in COMMON):
                no_common.append(s)
            labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                  if k != "le" and k not in dict(COMMON)))
            if f.type == "counter" and s.name.endswith("_total"):
                got_counters[(s.name, labels)] = s.value
            elif f.type == "gauge":
                got_gauges[(s.name, labels)] = s.value
            elif f.type == "histogram":
                got_hist.setdefault(f.name, []).append((s.name, s.labels.get("le"), s.value))
    c.check(fams and not no_common, "every sample carries the job and rank labels",
            repr(no_common[:3]))
    stray = [k for k in got_counters if k[1] == () and k[0] in LABELLED]
    c.check(not stray, "no unlabelled sample of a labelled counter", repr(stray))
    # Label-less counters are rendered from 0 even when never updated.
    for k in list(got_counters):
        if k[1] == () and k not in counters and k[0] not in LABELLED:
            counters[k] = 0
    c.check(got_counters == {k: float(v) for k, v in counters.items()},
            "every counter series equals this test's sum",
            repr(sorted(set(got_counters.items()) ^ set((k, float(v)) for k, v in counters.items())))[:1500])
    c.check(gauges and all(got_gauges.get(k) == float(v) for k, v in gauges.items()),
            "gauges hold the last value set", repr(got_gauges))
    for fam, bounds in (("spotd_checkpoint_save_seconds", SAVE_B),
                        ("spotd_checkpoint_upload_seconds", UPLOAD_B)):
        obs = hists[fam]
        rows = got_hist.get(fam, [])
        buckets = [(float(le), v) for n, le, v in rows if n == fam + "_bucket"]
        want = [(float(b), float(sum(1 for o in obs if o <= b))) for b in bounds] + \
            [(math.inf, float(len(obs)))]
        c.check(buckets == want, "%s buckets are cumulative up to +Inf" % fam,
                repr(buckets) + " vs " + repr(want))
        sums = [v for n, _, v in rows if n == fam + "_sum"]
        counts = [v for n, _, v in rows if n == fam + "_count"]
        c.check(len(sums) == 1 and abs(sums[0] - sum(obs)) < 1e-6 * max(1, sum(obs)) and
                counts == [float(len(obs))], "%s _sum and _count" % fam,
                repr((sums, counts, sum(obs), len(obs))))
    c.check(('spotd_checkpoints_total', (("outcome", "failed"), ("reason", 'we"ird\\reason')))
            in got_counters, "a quote and a backslash in a label value round-trip",
            repr([k for k in got_counters if "we" in repr(k)]))

    # A refused update is visible (not silently dropped).
    cp = spotlib.run([tool], input="add spotd_notices_total -1 kind=x\n")
    c.check(cp.returncode == 1 and "refused" in cp.stderr, "a negative counter add is refused",
            cp.stderr)

c.finish()
