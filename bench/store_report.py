#!/usr/bin/python3
"""Turns bench/store_bench.sh's measurements into bench/results/store.md
(a Markdown table) and store.png (a chart). Called by the script."""
import json
import statistics
import sys

(res_path, ratio_path, raw, braw, zstored, bz, cpu_path, cores,
 md_path, png_path) = sys.argv[1:11]
raw, braw, zstored, bz = int(raw), int(braw), int(zstored), int(bz)

runs = {}
for line in open(res_path):
    label, secs, rss = line.split()
    runs.setdefault(label, []).append((float(secs), int(rss)))


def med(label):
    v = runs[label]
    return statistics.median(s for s, _ in v), max(r for _, r in v)


def mbps(label, nbytes=raw):
    return nbytes / med(label)[0] / 1e6


ratios = {e["name"]: e["raw_bytes"] / e["stored_bytes"]
          for e in json.load(open(ratio_path))["checkpoints"]}
u, s = (float(x) for x in open(cpu_path).read().split())
cpu_per_gib = (u + s) / (raw / 2**30)

GOALS = {"push_aws": 2.0, "push_zstd": 1.5, "restore_aws": 2.0, "restore_zstd": 2.0}
rows = [
    ("push", "spotctl push", "push_spotd", None),
    ("push", "aws s3 cp --recursive", "push_aws", "push_spotd"),
    ("push", "tar | zstd -T0 -1 | aws s3 cp -", "push_zstd", "push_spotd"),
    ("restore", "spotctl restore", "restore_spotd", None),
    ("restore", "aws s3 cp --recursive", "restore_aws", "restore_spotd"),
    ("restore", "aws s3 cp - | zstd -d | tar -x", "restore_zstd", "restore_spotd"),
]
n = len(runs["push_spotd"])
out = []
out.append("# Checkpoint store benchmark\n")
out.append("Local Ceph RGW (tests/s3server.sh) on this machine (%s cores), "
           "%.0f MiB fp32 checkpoint (weights N(0,0.02), Adam m N(0,1e-3), "
           "Adam v = m²; three files), warm server, median of %d runs; "
           "peak RSS is the max over runs (a pipeline's is the sum of its "
           "processes). Throughput = checkpoint bytes / wall time.\n"
           % (cores, raw / 2**20, n))
out.append("| op | tool | MB/s | peak RSS MiB | spotd / this | goal |")
out.append("|---|---|---:|---:|---:|---|")
for op, tool, label, ref in rows:
    secs, rss = med(label)
    ratio = "" if ref is None else "%.2f×" % (mbps(ref) / mbps(label))
    goal = ""
    if ref is not None and label in GOALS:
        g = GOALS[label]
        goal = "≥ %.1f× %s" % (g, "met" if mbps(ref) / mbps(label) >= g else "**missed**")
    out.append("| %s | %s | %.0f | %.0f | %s | %s |"
               % (op, tool.replace("|", "\\|"), mbps(label), rss / 1024, ratio, goal))
out.append("")
out.append("| data | spotd ratio | zstd -1 ratio | goal |")
out.append("|---|---:|---:|---|")
fr, br = ratios.get("fp32", 0), ratios.get("bf16", 0)
out.append("| fp32 weights + Adam (%.0f MiB) | %.3f | %.3f | ≥ 1.20 %s |"
           % (raw / 2**20, fr, raw / zstored, "met" if fr >= 1.20 else "**missed**"))
out.append("| bf16 (%.0f MiB) | %.3f | %.3f | ≥ 1.45 %s |"
           % (braw / 2**20, br, braw / bz, "met" if br >= 1.45 else "**missed**"))
out.append("")
cz, cr = mbps("ceiling_zstd") / 1e3, mbps("ceiling_raw") / 1e3
out.append("Pipeline ceiling (push to bench/s3_discard.py, a loopback endpoint "
           "that discards bodies; it runs on the same cores, in Python): "
           "%.2f GB/s compressed, %.2f GB/s raw frames. The pipeline itself "
           "costs %.2f CPU-s per GiB (read + byte grouping + zstd + CRC32C + "
           "HTTP), i.e. %.2f GB/s per core, against the machine's memcpy "
           "11.8 GB/s, grouped zstd ~1.9 GB/s per core and CRC32C 6.8 GB/s "
           "per core." % (cz, cr, cpu_per_gib, (2**30 / 1e9) / cpu_per_gib))
out.append("")
open(md_path, "w").write("\n".join(out) + "\n")

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [t for _, t, _, _ in rows]
    vals = [mbps(l) for _, _, l, _ in rows]
    colors = ["tab:blue" if l.endswith("spotd") else "tab:gray" for _, _, l, _ in rows]
    a1.barh(range(len(rows))[::-1], vals, color=colors)
    a1.set_yticks(range(len(rows))[::-1])
    a1.set_yticklabels(["%s: %s" % (o, t) for o, t, _, _ in rows], fontsize=8)
    a1.set_xlabel("MB/s (checkpoint bytes / wall time)")
    a1.set_title("push and restore, %.0f MiB fp32+Adam, local Ceph" % (raw / 2**20))
    rss = [med(l)[1] / 1024 for _, _, l, _ in rows]
    a2.barh(range(len(rows))[::-1], rss, color=colors)
    a2.set_yticks(range(len(rows))[::-1])
    a2.set_yticklabels([])
    a2.set_xlabel("peak RSS MiB")
    a2.set_title("memory")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
except ImportError as e:
    print("no chart: %s" % e, file=sys.stderr)
