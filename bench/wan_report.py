#!/usr/bin/python3
"""Turns bench/wan_bench.py's wan.json into wan.md (tables, ratios, the
WAN goals) and wan.png (throughput per case and tool).

usage: wan_report.py WAN_JSON OUT_MD OUT_PNG"""
import json
import statistics
import sys

ALL_TOOLS = ["spot", "spot16", "aws", "crt"]
TOOLS = ALL_TOOLS  # narrowed to the tools of the run in main()
LABEL = {"spot": "spotctl (defaults)", "spot16": "spotctl --parallel 16",
         "aws": "aws s3 cp", "crt": "aws s3 cp (CRT)"}
CASES = ["fp32", "big", "small", "med"]
GIB = 1 << 30


def case_label(res, case):
    s = res["sizes"]
    return {"fp32": "%d MiB fp32+Adam" % s["fp32_mb"],
            "big": "%.0f GiB checkpoint" % (s["big_mb"] / 1024) if s["big_mb"] >= 1024
            else "%d MiB checkpoint" % s["big_mb"],
            "small": "%d x 4 KiB" % s["small_n"],
            "med": "%d x 1 MiB" % s["med_n"]}[case]


def medians(res):
    """{(target, variant, case, op, tool): summary} over the ok runs."""
    groups = {}
    for r in res["records"]:
        k = (r["target"], r["variant"], r["case"], r["op"], r["tool"])
        groups.setdefault(k, []).append(r)
    out = {}
    for k, rs in groups.items():
        good = [r for r in rs if r["ok"] and r.get("verified", True)]
        if not good:
            out[k] = {"failed": len(rs)}
            continue
        wall = statistics.median(r["wall_s"] for r in good)
        b = good[0]["bytes"]
        out[k] = {"n": len(good), "failed": len(rs) - len(good), "wall_s": wall,
                  "mbs": b / wall / 1e6,
                  "cpu_per_gib": statistics.median(r["cpu_s"] for r in good) / (b / GIB),
                  "rss_mib": max(r["rss_kib"] for r in good) / 1024,
                  "proxy_cpu_per_gib": statistics.median(r["proxy_cpu_s"] for r in good)
                  / (b / GIB),
                  "server_cpu_per_gib": statistics.median(
                      r.get("server_cpu_s") or 0.0 for r in good) / (b / GIB)}
    return out


def ratio(m, k, base_tool, tool="spot"):
    a, b = m.get(k + (tool,)), m.get(k + (base_tool,))
    if not a or not b or "wall_s" not in a or "wall_s" not in b:
        return None
    return b["wall_s"] / a["wall_s"]


def fmt_r(x):
    return "–" if x is None else "%.2fx" % x


def table(res, m, target, variant):
    rows = []
    keys = sorted({k[:4] for k in m if k[0] == target and k[1] == variant},
                  key=lambda k: (CASES.index(k[2]), k[3] != "push"))
    if not keys:
        return rows
    p16 = "spot16" in TOOLS
    rows.append("| case | op | " + " | ".join(LABEL[t] for t in TOOLS) +
                " | spotctl vs aws | vs CRT |" + (" p16 vs aws | p16 vs CRT |" if p16 else ""))
    rows.append("|---|---|" + "---|" * (len(TOOLS) + 2 + (2 if p16 else 0)))
    for k in keys:
        cells = []
        for t in TOOLS:
            s = m.get(k + (t,))
            if not s:
                cells.append("–")
            elif "wall_s" not in s:
                cells.append("failed")
            else:
                cells.append("%.2f s, %.0f MB/s<br>%.2f CPU-s/GiB, %.0f MiB%s" % (
                    s["wall_s"], s["mbs"], s["cpu_per_gib"], s["rss_mib"],
                    " (%d failed)" % s["failed"] if s["failed"] else ""))
        ratios = [ratio(m, k, "aws"), ratio(m, k, "crt")]
        if p16:
            ratios += [ratio(m, k, "aws", "spot16"), ratio(m, k, "crt", "spot16")]
        rows.append("| %s | %s | %s | %s |" % (
            case_label(res, k[2]), k[3], " | ".join(cells),
            " | ".join(fmt_r(x) for x in ratios)))
    return rows


def goals(res, m):
    out = []

    def g(name, ok, figure):
        out.append("| %s | %s | %s |" % (name, figure,
                                         "–" if ok is None else "met" if ok else "missed"))
    out.append("| goal | figure today | |")
    out.append("|---|---|---|")
    for op in ("push", "restore"):
        tgt = "discard" if op == "push" else "ceph"
        for tg in ([tgt, "ceph"] if op == "push" else [tgt]):
            k = (tg, "wan", "fp32", op)
            ra, rc = ratio(m, k, "aws"), ratio(m, k, "crt")
            g("%s fp32, WAN, %s: >= 2.5x aws" % (op, tg), None if ra is None else ra >= 2.5,
              fmt_r(ra))
            g("%s fp32, WAN, %s: >= 1.5x CRT" % (op, tg), None if rc is None else rc >= 1.5,
              fmt_r(rc))
            s, a = m.get(k + ("spot",)), m.get(k + ("aws",))
            if s and a and "cpu_per_gib" in s and "cpu_per_gib" in a:
                x = s["cpu_per_gib"] / a["cpu_per_gib"]
                g("%s fp32, WAN, %s: CPU/GiB <= 0.3x aws" % (op, tg), x <= 0.3,
                  "%.2f vs %.2f CPU-s/GiB (%.2fx)" % (s["cpu_per_gib"], a["cpu_per_gib"], x))
    # the C sink's ceiling when measured, else the Python sink's
    for variant, note in (("csink", "C sink, %s" % case_label(res, "fp32")),
                          ("direct", "the Python sink is the limit here")):
        d = m.get(("discard", variant, "fp32", "push", "spot"))
        if d and "cpu_per_gib" in d:
            g("push to a discard sink (no proxy): CPU/GiB <= 1.125 (25 % below ~1.5)",
              d["cpu_per_gib"] <= 1.125, "%.2f CPU-s/GiB (%s)" % (d["cpu_per_gib"], note))
            g("push to a discard sink (no proxy): >= 1.3 GB/s", d["mbs"] >= 1300,
              "%.0f MB/s (%s)" % (d["mbs"], note))
            break
    for op in ("push", "restore"):
        for tg in ("discard", "ceph"):
            k = (tg, "wan", "small", op)
            r = ratio(m, k, "aws")
            if r is not None:
                g("%s small files, WAN, %s: >= 10x aws --recursive" % (op, tg), r >= 10,
                  fmt_r(r))
    dj = daemon_summary(res)
    big = dj.get(4 << 30) if dj else None
    if big:
        g("4 GiB notice->durable on loopback Ceph <= 0.7x 28.5 s (19.95 s)",
          big["total"] <= 0.7 * 28.5,
          "%.2f s (%.2fx; save %.2f s, upload+commit after the save %.2f s; "
          "bench/results/daemon.md)" % (big["total"], big["total"] / 28.5,
                                         big["save"], big["upload"]))
    else:
        g("4 GiB notice->durable on loopback Ceph <= 0.7x 28.5 s", None,
          "not in bench/results/daemon.json (bench/daemon_bench.sh --sizes 4G)")
    budget = res.get("memory_budget")
    spots = [r for r in res["records"] if r["tool"] == "spot" and r["ok"]]
    if budget and spots:
        worst = max(r["rss_kib"] for r in spots) << 10
        g("peak RSS within the memory budget (spotctl defaults, every case)",
          worst <= budget, "worst %.0f MiB, budget %.0f MiB" % (worst / (1 << 20),
                                                                budget / (1 << 20)))
    else:
        g("peak RSS within the memory budget", None, "no budget recorded")
    return out


def daemon_summary(res):
    """{size: summary} of bench/daemon_bench.py's daemon.json next to
    wan.json, or None."""
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(res["_path"])), "daemon.json")
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    s = d.get("summary")
    rows = s if isinstance(s, list) else [s] if s else []
    return {r["size"]: r for r in rows if "total" in r}


def main():
    src, md, png = sys.argv[1:4]
    with open(src) as f:
        res = json.load(f)
    res["_path"] = src
    global TOOLS
    ran = {r["tool"] for r in res["records"]}
    TOOLS = [t for t in ALL_TOOLS if t in ran] or ALL_TOOLS
    m = medians(res)
    mo = res["model"]
    out = ["# WAN benchmark\n"]
    full = res["sizes"] == {"fp32_mb": 1024, "big_mb": 4096, "small_n": 5000,
                            "med_n": 200} and res["runs"] >= 3
    out.append("Made by `bench/wan_bench.sh` (%s, %d round%s, medians; started %s, "
               "finished %s; %s cores shared by client, proxy and server)." % (
                   "quick mode" if res.get("quick") else "full run" if full
                   else "reduced run: see the sizes in the case column", res["runs"],
                   "s" if res["runs"] != 1 else "", res.get("started"),
                   res.get("finished", "not finished"), res.get("nproc")))
    out.append("Each connection goes through `bench/wanproxy.py`: %.0f MB/s per connection "
               "and direction, %.0f ms RTT, %d RTTs to set a connection up (TCP + TLS); "
               "`lossy` adds a %.0f ms stall with probability %.2g per 64 KiB (an "
               "approximation of %.0f %% loss, see the proxy). Cells: median wall time, "
               "throughput of the raw bytes, client CPU-seconds per GiB (user + system), "
               "peak RSS. Ratios: wall time of the other tool / spotctl's (higher is "
               "better for spotctl).\n" % (
                   mo["rate_mbs"], mo["rtt_ms"], mo["setup_rtts"], mo["stall_ms"],
                   mo["loss"], mo["loss"] * 100))
    for target, tname in (("discard", "discard sink (`bench/s3_discard.py`, push only)"),
                          ("ceph", "Ceph RGW (`tests/s3server.sh`, 1 OSD on this "
                                   "machine; the server uses ~6 CPU-s/GiB of the 2 cores)")):
        for variant in ("wan", "lossy"):
            rows = table(res, m, target, variant)
            if rows:
                out.append("## %s, %s\n" % (tname, variant))
                out += rows
                out.append("")
    d = m.get(("discard", "direct", "fp32", "push", "spot"))
    if d and "wall_s" in d:
        out.append("Pipeline ceiling, spotctl push straight to the discard sink (no "
                   "proxy, loopback), %s: %.2f s, %.0f MB/s, %.2f CPU-s/GiB, %.0f MiB.\n"
                   % (case_label(res, "fp32"), d["wall_s"], d["mbs"], d["cpu_per_gib"],
                      d["rss_mib"]))
        out.append("The discard sink is a forking Python server: it, not spotctl, "
                   "bounds this figure (the pass through the unshaped proxy below is "
                   "no slower); the C sink below measures the pipeline's own "
                   "ceiling.\n")
    for case in ("fp32", "big"):
        x = m.get(("discard", "csink", case, "push", "spot"))
        if x and "wall_s" in x:
            out.append("Pipeline ceiling against `bench/s3_sink` (a discarding server "
                       "in C, %.2f CPU-s/GiB of its own), %s: %.2f s, %.0f MB/s, "
                       "%.2f CPU-s/GiB, %.0f MiB.\n" % (
                           x.get("server_cpu_per_gib", 0), case_label(res, case),
                           x["wall_s"], x["mbs"], x["cpu_per_gib"], x["rss_mib"]))
    for t in ("spot", "spot16"):
        x = m.get(("discard", "noshape", "fp32", "push", t))
        if x and "wall_s" in x:
            out.append("The same through `wanproxy.py` with no cap and no delay (%s): "
                       "%.2f s, %.0f MB/s, the proxy using %.2f CPU-s/GiB: the proxy's "
                       "ceiling with a real client.\n" % (
                           LABEL[t], x["wall_s"], x["mbs"], x["proxy_cpu_per_gib"]))
    out.append("## Goals\n")
    out += goals(res, m)
    out.append("")
    pc = res.get("proxy_ceiling")
    if pc:
        out.append("## The proxy's own ceiling\n")
        out.append("`bench/wanproxy_ceiling.py`: N connections of raw TCP through the "
                   "proxy to a discarding socket.\n")
        out.append("| connections | cap per conn | aggregate | proxy CPU-s/GiB | "
                   "proxy cores busy |")
        out.append("|---|---|---|---|---|")
        for c in pc:
            out.append("| %d | %s | %.0f MB/s | %.2f | %.2f |" % (
                c["conns"], "%.0f MB/s" % c["rate_mbs"] if c["rate_mbs"] else "none",
                c["aggregate_mbs"], c["proxy_cpu_s_per_gib"], c["proxy_cores_busy"]))
        out.append("")
    prox = [v["proxy_cpu_per_gib"] for k, v in m.items()
            if "proxy_cpu_per_gib" in v and k[2] in ("fp32", "big")
            and k[1] in ("wan", "lossy")]
    if prox:
        out.append("Proxy CPU during the large transfers (fp32, checkpoint): median "
                   "%.2f CPU-s per GiB moved (max %.2f).\n" % (statistics.median(prox), max(prox)))
    for n in sorted(set(res.get("notes", []))):
        out.append("Note: %s\n" % n)
    with open(md, "w") as f:
        f.write("\n".join(out) + "\n")
    picture(res, m, png)


def picture(res, m, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, NullFormatter
    except ImportError:
        print("wan_report: no matplotlib (tools/deps.sh bench): no picture",
              file=sys.stderr)
        return
    panels = sorted({(k[0], k[1]) for k in m if k[1] in ("wan", "lossy")},
                    key=lambda p: (p[0] != "discard", p[1] != "wan"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.2 * len(panels)),
                             squeeze=False)
    colors = {"spot": "#1f77b4", "spot16": "#17becf", "aws": "#ff7f0e", "crt": "#d62728"}
    for ax, (target, variant) in zip(axes[:, 0], panels):
        keys = sorted({k[2:4] for k in m if k[0] == target and k[1] == variant},
                      key=lambda k: (CASES.index(k[0]), k[1] != "push"))
        w = 0.8 / len(TOOLS)
        ratios_drawn = []
        for i, t in enumerate(TOOLS):
            ys = [ratio(m, (target, variant) + k, "aws", t) or 0 for k in keys]
            ratios_drawn += ys
            xs = [j + i * w for j in range(len(keys))]
            ax.bar(xs, ys, w, label=LABEL[t], color=colors[t])
            for x, y, k in zip(xs, ys, keys):
                s = m.get((target, variant) + k + (t,), {})
                if "wall_s" in s:
                    ax.text(x, y, "%.1fs" % s["wall_s"], ha="center", va="bottom",
                            fontsize=6)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_yscale("log")  # small files reach 20-40x, the rest 1-4x
        ax.set_yticks([v for v in (0.5, 1, 2, 3, 5, 10, 20, 50)
                       if v <= max([1.0] + ratios_drawn) * 1.3])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "%gx" % v))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(keys))])
        ax.set_xticklabels(["%s\n%s" % (case_label(res, c), op) for c, op in keys],
                           fontsize=8)
        ax.set_ylabel("speed vs aws s3 cp (x, log)")
        ax.set_title("%s, %s (%.0f MB/s per connection, %.0f ms RTT)" % (
            target, variant, res["model"]["rate_mbs"], res["model"]["rtt_ms"]),
            fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(png, dpi=90)


if __name__ == "__main__":
    main()
