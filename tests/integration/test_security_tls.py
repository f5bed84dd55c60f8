#!/usr/bin/python3
"""TLS is verified, and nothing turns it off.

A local https server on loopback with a self-signed certificate (made
here with openssl, for 127.0.0.1) answers like S3. spotctl list, push and
restore against it must fail with one clear line about the certificate,
and the server must never see a request (the handshake is refused before
any signed request leaves). No option or documented variable of spotd or
spotctl disables verification (--help and the config option table are
grepped). Needs only openssl, not the S3 server; skips (77) without
SPOT_TEST_S3_ENDPOINT like the other integration tests."""
import http.server
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib as sl  # noqa: E402

sl.store_env()
c = sl.Checks()
seen = []


class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _any(self):
        seen.append((self.command, self.path))
        body = b"<ListBucketResult></ListBucketResult>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any


with tempfile.TemporaryDirectory() as tmp:
    key, crt = os.path.join(tmp, "k.pem"), os.path.join(tmp, "c.pem")
    cp = sl.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                 "-out", crt, "-days", "1", "-subj", "/CN=127.0.0.1",
                 "-addext", "subjectAltName=IP:127.0.0.1"], timeout=60)
    c.check(cp.returncode == 0, "self-signed certificate made", cp.stderr)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    ep = "https://127.0.0.1:%d" % srv.server_address[1]
    store = "s3://spotd-test/tls/job"
    src = os.path.join(tmp, "src")
    os.makedirs(src)
    with open(os.path.join(src, "a"), "w") as f:
        f.write("x")
    env = {"AWS_ENDPOINT_URL": ep}
    for what, args in [("list", ["list", store]),
                       ("push", ["push", src, store]),
                       ("restore", ["restore", store, os.path.join(tmp, "out")])]:
        cp = sl.spotctl(*args, "--endpoint", ep, timeout=60, env=env)
        lines = [ln for ln in cp.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        c.check(cp.returncode != 0, "%s: refused" % what, cp.stdout + cp.stderr)
        c.check(re.search(r"certificate|SSL|TLS", last, re.I) is not None
                and last.startswith("spotctl: "),
                "%s: the message names the TLS problem: %s" % (what, last), cp.stderr)
        c.check(not os.path.exists(os.path.join(tmp, "out")), "%s: nothing restored" % what)
    c.check(seen == [], "the server never got a request past the handshake", repr(seen))
    srv.shutdown()

    # no switch that turns verification off
    bad = re.compile(r"insecure|no-?verify|verify[-_]?(ssl|tls|peer)|skip[-_]?(tls|ssl)|"
                     r"ca[-_]?bundle|tls[-_]?verify|ssl[-_]?verify", re.I)
    texts = []
    for argv in ([sl.spotd_exe(), "--help"], [sl.spotctl_exe(), "--help"],
                 [sl.spotctl_exe(), "push", "--help"], [sl.spotctl_exe(), "restore", "--help"],
                 [sl.spotctl_exe(), "list", "--help"]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        texts.append(r.stdout + r.stderr)
    for path in ("lib/config.c", "systemd/spotd.conf"):  # the option table
        try:
            texts.append(open(sl.srcdir_path(path)).read())
        except FileNotFoundError:
            pass
    hits = sorted({m.group(0) for t in texts for m in bad.finditer(t)})
    c.check(hits == [], "no option, variable or config key disables TLS verification",
            repr(hits))
    s3c = open(sl.srcdir_path("lib", "io", "s3.c")).read()
    http_c = open(sl.srcdir_path("lib", "io", "http.c")).read()
    c.check(not re.search(r"VERIFY(PEER|HOST), 0|getenv", http_c),
            "lib/io/http.c neither turns verification off nor reads a variable")
    c.check("CURLOPT_SSL_VERIFYPEER, 1L" in s3c and "CURLOPT_SSL_VERIFYHOST, 2L" in s3c
            and not re.search(r"VERIFY(PEER|HOST), 0", s3c),
            "lib/s3.c always sets VERIFYPEER 1 and VERIFYHOST 2")
c.finish()
