#!/usr/bin/python3
"""The state machines go through lib/core/fsm.h: every setter (a function
whose name ends in set_state or set_state_at) asks spot_fsm_move(),
spot_fsm_move_detail() or spot_fsm_refuse(), and a machine's state field
is written only in its setter, or once where the object is made (the line
says /* initial state */); in daemon/ only engine.c moves the engine's
state or writes anything of it (struct spotd_engine, d->eng: the state,
the exit status, the notice), and only driver.c steps it. ALLOW lists the writes that are not a machine
of the helper's (yet), each with its reason.

Usage: fsm.py SRCDIR"""
import os
import re
import subprocess
import sys

# (file, function): why its writes of a "state" field are not checked.
ALLOW = {
    ("lib/io/proctree.c", "spot_proc_parse_stat"): "a /proc state letter",
    ("daemon/request.c", "note_sent"): "how far a process was signalled",
    ("daemon/status.c", "spotd_status_json"): "a field of the status JSON",
}

SETTER = re.compile(r"^(\w*_)?set_state(_at)?$")
CALLS = re.compile(r"\bspot_fsm_(move|move_detail|refuse)\s*\(")
WRITE = re.compile(r"(->|\.)(\w+_)?state\s*=(?!=)")
FUNC = re.compile(r"^([A-Za-z_]\w*)\s*\(")


def functions(lines):
    """(name, first line index, last line index) of each function body:
    the house style puts the name at column 0 and the braces too."""
    out = []
    name = None
    start = None
    for i, l in enumerate(lines):
        m = FUNC.match(l)
        if m and not l.startswith(("if", "for", "while", "switch", "return")):
            name = m.group(1)
        if l.startswith("{") and name is not None:
            start = i
        elif l.startswith("}") and start is not None:
            out.append((name, start, i))
            name = start = None
    return out


def allowed(path, fn):
    return (path, fn) in ALLOW or (path, None) in ALLOW


def main():
    src = sys.argv[1]
    os.chdir(src)
    files = subprocess.run(["git", "ls-files", "lib/*.c", "daemon/*.c"],
                           capture_output=True, text=True).stdout.split()
    bad = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        spans = functions(lines)
        for fn, a, b in spans:
            body = "\n".join(lines[a:b + 1])
            if SETTER.match(fn) and not CALLS.search(body):
                print("%s:%d: %s() changes a state without spot_fsm_move() "
                      "(lib/core/fsm.h)" % (path, a, fn))
                bad += 1
            if SETTER.match(fn):
                continue
            for i in range(a, b + 1):
                l = lines[i]
                if not WRITE.search(l) or "/* initial state */" in l:
                    continue
                if allowed(path, fn):
                    continue
                print("%s:%d: %s() writes a state outside its setter "
                      "(a machine of lib/core/fsm.h moves only there; a "
                      "constructor marks its line /* initial state */)" %
                      (path, i + 1, fn))
                bad += 1
    # The engine's state (struct spotd_engine: the state, the exit status,
    # the notice, the deadline) is engine.c's: the other modules of
    # daemon/ report events (driver.h), and driver.c alone steps it.
    engine = re.compile(r"\bspotd_set_state(_at)?\s*\(|"
                        r"\beng(->|\.)\w+(\.\w+|\[[^]]*\])*\s*"
                        r"([-+*/|&^]|<<|>>)?=(?!=)|"
                        r"\b(memset|memcpy|memmove|spot_strlcpy|snprintf)"
                        r"\s*\(\s*&?\w+(->|\.)eng\b")
    stepper = re.compile(r"\bspotd_engine_(step|init)\s*\(")
    for path in files:
        if not path.startswith("daemon/") or path == "daemon/engine.c":
            continue
        with open(path, encoding="utf-8") as f:
            for i, l in enumerate(f, 1):
                code = l.split("/*")[0]
                if engine.search(code):
                    print("%s:%d: only daemon/engine.c moves the engine's "
                          "state or writes its fields (report an event "
                          "to the engine instead: driver.h)" % (path, i))
                    bad += 1
                if path != "daemon/driver.c" and stepper.search(code):
                    print("%s:%d: only daemon/driver.c steps the engine" %
                          (path, i))
                    bad += 1
    if bad:
        print("%d problem(s): see tests/lint/fsm.py" % bad)
        return 1
    print("fsm: %d files checked" % len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
