"""Strings from the network or the store never reach stderr raw (issue 14,
item 7): control characters fed through each message path come out
escaped (spot_escape), never as a forged line or a terminal sequence.

1. S3 error bodies: a loopback server answers every request 403 with an
   <Error> whose <Code> holds a newline and whose <Message> holds a newline,
   a forged "spotctl: error:" line, a C1 control (U+0085, U+009B) and a
   bidi override: `spotctl list` and `spotctl restore` print one line each.
2. A manifest path with ESC and a newline (a file so named, pushed to the
   real Ceph), its object then corrupted: the restore's checksum error
   names the path escaped.
3. A checkpoint name with DEL, a C1 CSI and a bidi override in the
   store's keys (characters XML 1.0 can carry in a listing):
   `spotctl list` (table and --json) prints it escaped, and the JSON still
   parses.
"""
import http.server
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

FORGED = "spotctl: error: FORGED"
RAW_BAD = ["\x7f", "\x1b", "\x07", "\x85", "\x9b", "\u202e", "\u0085", "\u009b"]


def raw_controls(text):
    """The raw control characters in text (newlines ending lines aside)."""
    return sorted({repr(ch) for ch in text if ch in RAW_BAD or
                   (ord(ch) < 0x20 and ch not in "\n")})


def clean(c, what, cp, must_have=()):
    err = cp.stderr
    lines = [l for l in err.splitlines() if l.strip()]
    c.check(cp.returncode != 0, what + ": fails", "rc=%d" % cp.returncode)
    c.check(not raw_controls(err), what + ": no raw control character on "
            "stderr", repr(err[:400]))
    c.check(not any(l.startswith(FORGED) or l.startswith("FORGED")
                    for l in lines), what + ": no forged line",
            repr(err[:400]))
    for m in must_have:
        c.check(m in err, what + ": shows %s escaped" % m, repr(err[:400]))


class Evil(http.server.BaseHTTPRequestHandler):
    BODY = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>"
            "<Code>Access&#10;Denied</Code>"
            "<Message>no\n" + FORGED + " \u0085 \u009b[2J \u202e gnp.exe"
            "</Message><RequestId>x</RequestId></Error>").encode()

    def log_message(self, *a):
        pass

    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(self.BODY)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = answer


def s3_errors(c, wd):
    server, url = sl.serve_http(Evil)
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
           "AWS_SECRET_ACCESS_KEY": "not-a-real-secret-0000000000000000",
           "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        cp = sl.spotctl("list", "s3://evil-bucket/p/job", env=env, timeout=60)
        clean(c, "S3 error through spotctl list", cp,
              ["Access\\nDenied", "no\\n" + FORGED, "\\u0085", "\\u009b",
               "\\u202e"])
        cp = sl.spotctl("restore", "s3://evil-bucket/p/job",
                        os.path.join(wd, "r1"), env=env, timeout=60)
        clean(c, "S3 error through spotctl restore", cp, ["\\u0085"])
    finally:
        sl.stop_http(server)


def manifest_path(c, wd):
    url, prefix = sl.unique_job("escape")
    src = os.path.join(wd, "src")
    os.makedirs(src)
    evil = "evil\x1b[31m\nFORGED line \x07"
    with open(os.path.join(src, evil), "wb") as f:
        f.write(os.urandom(200000))
    with open(os.path.join(src, "ok.bin"), "wb") as f:
        f.write(b"fine" * 100)
    try:
        # one object per file (no packing): its key carries the name
        cp = sl.spotctl("push", src, url, "--name", "ck1", "--pack-threshold", "0")
        if not c.check(cp.returncode == 0, "push of a file named with ESC "
                       "and a newline", cp.stderr):
            return
        keys = [k for k in sl.s3_keys(prefix) if "evil" in k]
        if not c.check(len(keys) == 1, "its object is in the store",
                       repr(sl.s3_keys(prefix))):
            return
        body = bytearray(sl.s3_get(keys[0]))
        for i in range(len(body) // 2, len(body) // 2 + 64):
            body[i] ^= 0x5a  # same length, wrong bytes
        sl.s3_put(keys[0], bytes(body))
        cp = sl.spotctl("restore", url, os.path.join(wd, "r2"))
        clean(c, "a corrupted file named with ESC: the restore error", cp,
              ["evil\\x1b[31m\\nFORGED line \\x07"])
    finally:
        sl.s3_cleanup(prefix)


def list_names(c, wd):
    """A folder under checkpoints/ whose name holds DEL, CSI and RLO is not
    a checkpoint name spotd can write (lib/core/manifest.c
    spot_ckpt_name_valid): list leaves it out and never prints it raw, and
    still lists the real checkpoint beside it."""
    url, prefix = sl.unique_job("escape-list")
    src = os.path.join(wd, "listsrc")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "w.bin"), "wb") as f:
        f.write(b"fine" * 100)
    try:
        cp = sl.spotctl("push", src, url, "--name", "good1")
        c.check(cp.returncode == 0, "push of a valid checkpoint", cp.stderr)
        sl.s3_put(prefix + "checkpoints/bad\x7f\u009b2J\u202ename/x.zst",
                  b"x")
        cp = sl.spotctl("list", url)
        out = cp.stdout + cp.stderr
        c.check(cp.returncode == 0 and not raw_controls(out) and
                "good1" in out and "bad" not in out,
                "spotctl list: a name with DEL, CSI, RLO left out, never raw",
                repr(out[:400]))
        cp = sl.spotctl("list", url, "--json")
        try:
            names = [e["name"] for e in json.loads(cp.stdout)["checkpoints"]]
        except (ValueError, KeyError) as e:
            names = ["unparsable: %r" % e]
        c.check(cp.returncode == 0 and not raw_controls(cp.stdout) and
                names == ["good1"],
                "spotctl list --json: valid JSON, only the valid name",
                repr(cp.stdout[:400]))
    finally:
        sl.s3_cleanup(prefix)


def main():
    sl.store_env()
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-escape-") as wd:
        s3_errors(c, wd)
        manifest_path(c, wd)
        list_names(c, wd)
    c.finish()


if __name__ == "__main__":
    main()
