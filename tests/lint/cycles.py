#!/usr/bin/python3
"""No include cycle between the modules of daemon/ beyond ALLOW.

A module is X.c with its header (lease.c with joblease.h, history.c with
hist.h, see MODULE); spotd.h, which holds struct spotd, is a module of its
own. Module A depends on module B when a file of A includes B's header
("quoted" includes that name a header of daemon/). The check fails on a
cycle of that graph whose every edge is outside ALLOW; it prints one cycle
per strongly connected component left, as A -> B (file:line) -> ...

ALLOW lists edges, each with why it stays: an allowed edge is dropped from
the graph before the search, so a cycle counts only if it closes without
one. Keep the list short: a new cycle is fixed (a forward declaration in
place of an include, an event reported up instead of a call down), not
allowed.

Usage: cycles.py SRCDIR [-v]   (-v also prints the graph's figures)"""
import os
import re
import subprocess
import sys

# Header -> module, where the names differ (lib/ has a lease.h and a
# history.h).
MODULE = {"joblease": "lease", "hist": "history"}

# (from module, to module): why the edge stays. "*" matches any module.
ALLOW = {
    ("*", "spotd"): "struct spotd is the daemon's one state: every module's "
    "functions take it, and it embeds the modules' state structs by value "
    "(spotd.h includes their headers for those types)",
    ("*", "driver"): "a module reports its events to the engine's driver, its "
    "owner (driver.h), which steps the engine and carries its commands out "
    "by calling the module",
    ("*", "startup"): "the startup's steps (probe, runjoin, fallback, the "
    "RESTARTS counter, the lease) report to the startup, their owner "
    "(restore_probed(), restore_joined()...)",
    ("*", "history"): "hist.h records what the modules report (hist_*()): "
    "history.c only reads their state back, for the metrics",
    ("watch", "upload"): "the watch reports a complete checkpoint folder to "
    "the upload, its owner (spotd_checkpoint_complete())",
    ("upload", "control"): "a commit is told to the control clients that "
    "wait for it (control_commit_event()); control.c asks the upload for "
    "a checkpoint",
}

INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module(path):
    stem = os.path.splitext(os.path.basename(path))[0]
    return MODULE.get(stem, stem)


def graph(files, headers):
    """{module: {module: (file, line)}}: the first include making each
    edge."""
    g = {}
    for path in files:
        a = module(path)
        g.setdefault(a, {})
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                m = INC.match(line)
                if not m:
                    continue
                target = os.path.normpath(
                    os.path.join(os.path.dirname(path), m.group(1)))
                if target not in headers:
                    continue
                b = module(target)
                if b != a:
                    g[a].setdefault(b, (path, n))
    return g


def allowed(a, b):
    return (a, b) in ALLOW or ("*", b) in ALLOW or (a, "*") in ALLOW


def sccs(g):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def cycle_in(g, comp):
    """One cycle through comp's first module, by breadth-first search."""
    start = comp[0]
    members = set(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(g.get(v, {})):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                path.reverse()
                return path + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def main():
    src = sys.argv[1]
    verbose = "-v" in sys.argv[2:]
    os.chdir(src)
    files = subprocess.run(["git", "ls-files", "daemon/*.c", "daemon/*.h"],
                           capture_output=True, text=True,
                           check=True).stdout.split()
    headers = {f for f in files if f.endswith(".h")}
    full = graph(files, headers)
    if verbose:
        edges = sum(len(v) for v in full.values())
        print("daemon/: %d modules, %d edges; components with a cycle "
              "before ALLOW: %s" % (len(full), edges, sccs(full)))
    g = {a: {b: at for b, at in bs.items() if not allowed(a, b)}
         for a, bs in full.items()}
    bad = 0
    for comp in sccs(g):
        cyc = cycle_in(g, comp)
        steps = [cyc[0]]
        for a, b in zip(cyc, cyc[1:]):
            path, line = g[a][b]
            steps.append("%s (%s:%d)" % (b, path, line))
        print("include cycle in daemon/: %s" % " -> ".join(steps))
        bad += 1
    if bad:
        print("%d cycle(s): break them (a forward declaration instead of "
              "an include, an event reported to the engine) or, with a "
              "reason, allow an edge in tests/lint/cycles.py" % bad)
        return 1
    print("cycles: %d daemon/ files, %d modules, no cycle outside ALLOW" %
          (len(files), len(g)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
