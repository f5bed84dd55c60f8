"""Strings from the network or the store never reach stderr raw: control characters fed through each message path come out
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
4. History events written straight into the real Ceph with ESC, OSC, CR,
   newlines and bidi characters in a host and a notice kind, beside an
   object over the event size limit and a malformed one: `spotctl history`
   prints one escaped table, counts the two it skipped, and --json stays
   ASCII.
5. `spotctl relaunch --backend aws` and `--backend gcp` against a server
   whose answers carry a forged "spotd: info: committed checkpoint" line,
   ESC and bidi characters: one escaped line each, nothing forged.
6. `spotctl lease --set-latest` refused by a LATEST whose body holds ESC
   and a newline: the name it prints is escaped.
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


HOSTILE = "x\x1b]0;pwn\x07\r\n" + FORGED + " \u202e\u2028\x9b2J\x1b[31m"


def history(c, wd):
    url, prefix = sl.unique_job("escape-history")
    t0 = 1764748800000
    evs = [
        {"v": 1, "type": "run_start", "time_ms": t0, "owner": "node-a",
         "seq": 0, "host": HOSTILE},
        {"v": 1, "type": "notice", "time_ms": t0 + 60000, "owner": "node-a",
         "seq": 1, "kind": "k\x1b]0;p\x07\r\n\u202e", "step": 10},
        {"v": 1, "type": "run_end", "time_ms": t0 + 90000, "owner": "node-a",
         "seq": 2, "outcome": "preempted", "committed": False},
    ]
    hist = prefix + "history/"
    try:
        for i, e in enumerate(evs):
            sl.s3_put(hist + "%013d-node-a-%06d.json" % (e["time_ms"], i),
                      json.dumps(e).encode())
        big = dict(evs[0], seq=7, host="h", pad="y" * 5000)
        sl.s3_put(hist + "%013d-node-a-%06d.json" % (t0 + 1, 7),
                  json.dumps(big).encode())
        sl.s3_put(hist + "%013d-node-a-%06d.json" % (t0 + 2, 8), b"{not json")
        cp = sl.spotctl("history", url)
        out = cp.stdout + cp.stderr
        c.check(cp.returncode == 0, "history with hostile and oversized "
                "events: exit 0 (an object over 4 KiB is skipped, not fatal)",
                "rc=%d %r" % (cp.returncode, out[:600]))
        c.check(not raw_controls(out) and "\u2028" not in out and
                "\r" not in out.replace("\\r", ""),
                "history: no raw control, CR or separator", repr(out[:600]))
        c.check(not any(l.startswith(FORGED) for l in out.splitlines()),
                "history: no forged line", repr(out[:600]))
        c.check("\\x1b]0;pwn\\x07" in out and "\\u202e" in out and
                "notice k\\x1b]0;p\\x07\\r\\n\\u202e" in out,
                "history: host and notice kind shown escaped",
                repr(out[:600]))
        c.check("2 history objects were not valid" in cp.stderr,
                "history: the oversized and the malformed object counted",
                cp.stderr)
        cp = sl.spotctl("history", url, "--json")
        ok = cp.returncode == 0 and all(ord(ch) < 0x80 for ch in cp.stdout)
        try:
            doc = json.loads(cp.stdout)
            ok = ok and doc["runs"][0]["host"] == HOSTILE
        except (ValueError, KeyError, IndexError) as e:
            ok = False
            cp.stdout += " unparsable: %r" % e
        c.check(ok, "history --json: ASCII only, the host intact once "
                "decoded", repr(cp.stdout[:400]))
    finally:
        sl.s3_cleanup(prefix)


class EvilCloud(http.server.BaseHTTPRequestHandler):
    """EC2 and GCE (and GCE's metadata server) with hostile strings."""
    LINE = "bad\n" + "spotd: info: committed checkpoint step-999\x1b[2K\u202e"

    def log_message(self, *a):
        pass

    def send(self, code, ctype, body):
        body = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        p = self.path
        if "service-accounts/default/token" in p:
            self.send(200, "application/json", json.dumps(
                {"access_token": "tok", "expires_in": 3600,
                 "token_type": "Bearer"}))
        elif p.endswith("/project/project-id"):
            self.send(200, "text/plain", "proj")
        elif "/computeMetadata/" in p:
            self.send(404, "text/plain", "no")
        elif "/compute/v1/" in p:
            self.send(400, "application/json", json.dumps(
                {"error": {"code": 400, "message": self.LINE,
                           "status": "INVALID\x1b[2J",
                           "errors": [{"reason": "r\u009b", "message":
                                       self.LINE}]}}))
        else:
            # XML 1.0 cannot carry ESC: a C1 CSI and the bidi override.
            # A fleet that "launched" an instance with a forged id.
            line = self.LINE.replace("\x1b", "\u009b")
            self.send(200, "text/xml",
                      "<?xml version=\"1.0\"?><CreateFleetResponse>"
                      "<requestId>r</requestId><fleetId>fleet&#10;%s"
                      "</fleetId><fleetInstanceSet><item>"
                      "<launchTemplateAndOverrides><overrides>"
                      "<instanceType>m5.large</instanceType>"
                      "<availabilityZone>us-east-1a</availabilityZone>"
                      "</overrides></launchTemplateAndOverrides>"
                      "<lifecycle>spot</lifecycle><instanceIds><item>i-1%s"
                      "</item></instanceIds><instanceType>m5.large"
                      "</instanceType></item></fleetInstanceSet>"
                      "</CreateFleetResponse>" % (line, line))

    do_GET = do_PUT = do_POST = answer


def relaunch(c, wd):
    server, url = sl.serve_http(EvilCloud)
    env = dict(os.environ, SPOTD_JOB="job", SPOTD_STORE="s3://bkt/p/job",
               SPOTD_CHECKPOINT="step-1", SPOTD_REASON="manual",
               SPOTD_DEADLINE="", AWS_ACCESS_KEY_ID="AKIDEXAMPLE",
               AWS_SECRET_ACCESS_KEY="not-a-real-secret-0000000000000000",
               AWS_REGION="us-east-1")
    try:
        for backend, extra in (
                ("aws", ["--launch-template", "t", "--instance-types",
                         "m5.large", "--zones", "us-east-1a",
                         "--ec2-endpoint", url]),
                ("gcp", ["--instance-template", "t", "--zones",
                         "us-central1-a", "--compute-endpoint", url])):
            cp = sl.spotctl("relaunch", "--backend", backend, "--no-record",
                            "--metadata-url", url, "--timeout", "10", *extra,
                            env=env, timeout=60)
            out = cp.stdout + cp.stderr
            lines = out.splitlines()
            c.check(not raw_controls(out) and
                    not any(l.startswith("spotd:") for l in lines) and
                    "bad\\nspotd: info: committed" in out,
                    "relaunch %s: hostile answers escaped, no forged line"
                    % backend, "rc=%d %r" % (cp.returncode, out[:1500]))
    finally:
        sl.stop_http(server)


def lease_latest(c, wd):
    url, prefix = sl.unique_job("escape-lease")
    try:
        # a LATEST ahead of ours by the trainer's step (99 > 1), so the
        # update is refused and spotctl prints the name it found
        sl.s3().put_object(Bucket=os.environ["SPOT_TEST_S3_BUCKET"],
                           Key=prefix + "LATEST",
                           Body=b"name\x1b[2J\n" + FORGED.encode(),
                           Metadata={"spotd-step": "99"})
        cp = sl.spotctl("lease", url, "--owner", "esc-test", "--ttl", "30",
                        "--no-wait", "--set-latest", "step-1", "--seq", "1",
                        "--release")
        out = cp.stdout + cp.stderr
        c.check("name\\x1b[2J" in out and not raw_controls(out) and
                not any(l.startswith(FORGED) for l in out.splitlines()),
                "lease --set-latest: LATEST's name printed escaped",
                "rc=%d %r" % (cp.returncode, out[:600]))
    finally:
        sl.s3_cleanup(prefix)


def main():
    sl.store_env()
    c = sl.Checks()
    with tempfile.TemporaryDirectory(prefix="spotd-escape-") as wd:
        s3_errors(c, wd)
        manifest_path(c, wd)
        list_names(c, wd)
        history(c, wd)
        relaunch(c, wd)
        lease_latest(c, wd)
    c.finish()


if __name__ == "__main__":
    main()
