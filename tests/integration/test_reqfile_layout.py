"""The request file's layout is written down once, in lib/core/reqfile.h:
the Python helper's constants (python/spotd) must say the same (size,
mode-free layout: magic, version, every offset, the identity variable).
Every slot lies within the file, 8-byte aligned, none overlapping."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402


def header_defines(path):
    out = {}
    with open(path) as f:
        for m in re.finditer(r"^#define (SPOT_REQ_\w+) (.+)$", f.read(), re.M):
            v = m.group(2).strip()
            out[m.group(1)] = (v[1:-1].encode() if v.startswith('"')
                               else int(v, 8) if re.fullmatch(r"0[0-7]+", v)
                               else int(v, 0))
    return out


def main():
    c = sl.Checks()
    h = header_defines(sl.srcdir_path("lib", "core", "reqfile.h"))
    os.environ.pop("SPOTD_REQUEST_FILE", None)
    sys.path.insert(0, sl.srcdir_path("python"))
    import spotd
    pairs = [("SPOT_REQ_FILE_SIZE", spotd.REQ_SIZE),
             ("SPOT_REQ_MAGIC", spotd.REQ_MAGIC),
             ("SPOT_REQ_VERSION", spotd.REQ_VERSION),
             ("SPOT_REQ_ENV_ID", spotd.REQ_ENV_ID.encode()),
             ("SPOT_REQ_OFF_VERSION", spotd._OFF_VERSION),
             ("SPOT_REQ_OFF_SEQ", spotd._OFF_SEQ),
             ("SPOT_REQ_OFF_SERVED", spotd._OFF_SERVED),
             ("SPOT_REQ_OFF_POLLS", spotd._OFF_POLLS),
             ("SPOT_REQ_OFF_ATTACHED", spotd._OFF_ATTACHED),
             ("SPOT_REQ_OFF_DEADLINE", spotd._OFF_DEADLINE)]
    for name, py in pairs:
        c.check(h.get(name) == py, "%s: the header says %r, python/spotd %r"
                % (name, h.get(name), py))
    c.check(h.get("SPOT_REQ_OFF_MAGIC") == 0 and len(h) == len(pairs) + 2,
            "every define of the header is compared (magic at 0, the mode "
            "is spotd's alone)", repr(sorted(h)))
    offs = sorted(v for k, v in h.items() if k.startswith("SPOT_REQ_OFF_")
                  and k not in ("SPOT_REQ_OFF_MAGIC", "SPOT_REQ_OFF_VERSION"))
    c.check(all(o % 8 == 0 for o in offs) and len(set(offs)) == len(offs)
            and offs[0] >= 16 and offs[-1] + 8 <= h["SPOT_REQ_FILE_SIZE"],
            "the u64 slots are aligned, apart and inside the file", repr(offs))
    c.finish()


if __name__ == "__main__":
    main()
