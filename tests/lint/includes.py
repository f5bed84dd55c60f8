#!/usr/bin/python3
"""The include convention of lib/ (lib/io/README.md, docs/design.md
"Layout"):

- a header of lib/ is named by its path under lib/, everywhere, also from
  the files next to it: "core/log.h", "io/s3.h", "io/store/store.h" (the
  build puts only lib/ on the include path for them);
- a folder's X_internal.h is included only by the files of that folder
  (not its subfolders, not its parent) and by tests/, which may reach into
  a module's internals.

A quoted include resolves as the compiler does it: next to the including
file first, then under lib/. bench/ is not checked (its programs are run
by hand; see lib/meson.build).

Usage: includes.py SRCDIR"""
import os
import re
import subprocess
import sys

INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
CHECKED = ("lib/", "daemon/", "client/", "emulate/", "tests/")


def resolve(path, name, known, bare):
    for base in (os.path.dirname(path), "lib"):
        target = os.path.normpath(os.path.join(base, name))
        if target in known:
            return target
    # A bare name that only another include path would find (one of
    # lib/'s folders): that header, to report.
    return bare.get(name)


def main():
    os.chdir(sys.argv[1])
    files = subprocess.run(["git", "ls-files", "*.c", "*.h"],
                           capture_output=True, text=True,
                           check=True).stdout.split()
    known = set(files)
    bare = {os.path.basename(f): f for f in files
            if f.startswith("lib/") and f.endswith(".h")}
    bad = checked = 0
    for path in files:
        if not path.startswith(CHECKED):
            continue
        checked += 1
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                m = INC.match(line)
                if not m:
                    continue
                target = resolve(path, m.group(1), known, bare)
                if target is None or not target.startswith("lib/"):
                    continue
                want = target[len("lib/"):]
                if m.group(1) != want:
                    print('%s:%d: include "%s" as "%s" (a lib/ header is '
                          'named by its path under lib/)' %
                          (path, n, m.group(1), want))
                    bad += 1
                if (target.endswith("_internal.h") and
                        os.path.dirname(path) != os.path.dirname(target) and
                        not path.startswith("tests/")):
                    print("%s:%d: includes %s, internal to %s/ (export what "
                          "is needed through a public header)" %
                          (path, n, target, os.path.dirname(target)))
                    bad += 1
    if bad:
        print("%d problem(s): see tests/lint/includes.py" % bad)
        return 1
    print("includes: %d files checked" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
