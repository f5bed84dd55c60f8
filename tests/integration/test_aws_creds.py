#!/usr/bin/python3
"""The AWS credentials chain end to end: tests/integration/aws_creds (the
driver, lib/core/aws_conf.c + lib/io/aws_imds.c + lib/io/http.c on a real uv loop) against
a small IMDSv2 stand-in on loopback (http.server), plus the environment and
profile files, then the same chain against spotd-emulate.

Checks: which source wins, the instance role path (token required on every
GET), refresh when short-lived role credentials expire, the last good
credentials kept while refreshes fail, clear errors for every bad input,
and that no secret or IMDS token ever reaches stdout or stderr.
"""
import datetime
import hashlib
import http.server
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import spotlib as sl

BUILD = os.environ.get("SPOT_BUILDDIR",
                       os.path.join(os.path.dirname(__file__), "../../build"))
DRIVER = os.path.join(BUILD, "tests", "integration", "aws_creds")

ROLE = "spot-test-role"
CHECKS = sl.Checks()


def check(cond, what):
    CHECKS.check(cond, what)


def sha12(s):
    return hashlib.sha256(s.encode()).hexdigest()[:12]


class Imds:
    """IMDSv2 stand-in: PUT token, then GETs that must carry it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.tokens = set()
        self.secrets = []
        self.n_creds = 0
        self.lifetime_s = 4
        self.role_status = 200
        self.creds_status = 200
        self.fail_after = None  # creds GETs beyond this many answer 500
        self.unauthorized = 0
        self.token_busy = 0  # answer this many token PUTs with 503
        self.requests = 0
        imds = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, body=b"", ctype="text/plain"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                with imds.lock:
                    imds.requests += 1
                n = int(self.headers.get("Content-Length", "0") or 0)
                if n:
                    self.rfile.read(n)
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                if self.path != "/latest/api/token":
                    return self.reply(404)
                if ttl is None or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self.reply(400)
                with imds.lock:
                    busy = imds.token_busy > 0
                    imds.token_busy -= 1 if busy else 0
                if busy:
                    return self.reply(503)
                with imds.lock:
                    tok = "imds-token-%d-AQAEAExampleTokenValue" % len(imds.tokens)
                    imds.tokens.add(tok)
                self.reply(200, tok.encode())

            def do_GET(self):
                with imds.lock:
                    imds.requests += 1
                    authorized = (self.headers.get("X-aws-ec2-metadata-token")
                                  in imds.tokens)
                    if not authorized:
                        imds.unauthorized += 1
                if not authorized:
                    return self.reply(401)
                base = "/latest/meta-data/iam/security-credentials/"
                if self.path == "/latest/meta-data/placement/region":
                    return self.reply(200, b"eu-west-3")
                if self.path == base:
                    if imds.role_status != 200:
                        return self.reply(imds.role_status)
                    return self.reply(200, (ROLE + "\n").encode())
                if self.path == base + ROLE:
                    with imds.lock:
                        imds.n_creds += 1
                        n = imds.n_creds
                        failing = (imds.creds_status != 200 or
                                   (imds.fail_after is not None and
                                    n > imds.fail_after))
                    if failing:
                        return self.reply(500)
                    secret = "imdsSecret%04d/ExampleKeyDoNotPrint+xyz" % n
                    with imds.lock:
                        imds.secrets.append(secret)
                    exp = (datetime.datetime.now(datetime.timezone.utc) +
                           datetime.timedelta(seconds=imds.lifetime_s))
                    body = ('{"Code":"Success","LastUpdated":"%s",'
                            '"Type":"AWS-HMAC","AccessKeyId":"ASIAROLE%04d",'
                            '"SecretAccessKey":"%s","Token":"roleToken%04dEx==",'
                            '"Expiration":"%s"}' %
                            (exp.strftime("%Y-%m-%dT%H:%M:%SZ"), n, secret, n,
                             exp.strftime("%Y-%m-%dT%H:%M:%SZ")))
                    return self.reply(200, body.encode(), "text/plain")
                self.reply(404)

        self.server, self.url = sl.serve_http(Handler)

    def stop(self):
        sl.stop_http(self.server)


def clean_env(home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["HOME"] = home
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
              "all_proxy", "ALL_PROXY"):
        env.pop(k, None)
    return env


def run(env, *args, timeout=30):
    t0 = time.monotonic()
    p = subprocess.run([DRIVER, *args], env=env, capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def field(out, line_prefix, name):
    for line in out.splitlines():
        if line.startswith(line_prefix):
            for tok in line.split():
                if tok.startswith(name + "="):
                    return tok.split("=", 1)[1]
    return None


def no_leak(what, out, err, secrets):
    leaked = [s for s in secrets if s in out or s in err]
    check(not leaked, what + ": no secret or token in the output")


def emulator_checks(home, base):
    """The same chain against spotd-emulate (fixed role credentials
    valid 6 h: no refresh to see there, the stand-in above covers it)."""
    emulator = os.environ.get("SPOTD_EMULATE",
                              os.path.join(BUILD, "emulate", "spotd-emulate"))
    if not os.access(emulator, os.X_OK):
        print("spotd-emulate not built: skipping the emulator checks")
        return
    secret = "emuSecretExampleKey/DoNotPrint+0123456789ab"
    token = "emuSessionTokenExample+/=="
    creds = os.path.join(home, "role.json")
    with open(creds, "w") as f:
        f.write('{"AccessKeyId": "ASIAEMULATED", "SecretAccessKey": "%s", '
                '"Token": "%s"}' % (secret, token))
    emu = subprocess.Popen([emulator, "--provider", "aws",
                            "--port", "0", "--region", "ap-southeast-2",
                            "--role", "trainer-role", "--role-creds", creds],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        line = emu.stdout.readline().strip()
        check(line.startswith("listening on http://127.0.0.1:"),
              "emulator: started (%r)" % line)
        if not line.startswith("listening on "):
            return
        url = line.split()[-1]
        env = dict(base, AWS_EC2_METADATA_SERVICE_ENDPOINT=url)
        rc, out, err, _ = run(env, "--watch-ms", "1500")
        print(out + err)
        check(rc == 0 and field(out, "source=", "source") == "imds",
              "emulator: source=imds")
        check(field(out, "initial", "key_id") == "ASIAEMULATED" and
              field(out, "initial", "secret_sha256") == sha12(secret) and
              field(out, "initial", "session_token") == "yes",
              "emulator: the role's credentials")
        check(field(out, "source=", "region") == "ap-southeast-2",
              "emulator: region from placement/region")
        check(field(out, "final", "key_id") == "ASIAEMULATED" and
              "refreshes=0" in out, "emulator: 6 h credentials not refreshed")
        no_leak("emulator", out, err, [secret, token])
        # Every request refused: one clear line, quickly.
        emu2 = subprocess.Popen([emulator, "--provider", "aws",
                                 "--port", "0", "--fault", "throttle=1",
                                 "--role-creds", creds],
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            url2 = emu2.stdout.readline().strip().split()[-1]
            rc, out, err, secs = run(dict(base,
                                          AWS_EC2_METADATA_SERVICE_ENDPOINT=url2))
            check(rc == 1 and "no AWS credentials found" in err and
                  "HTTP 503" in err, "emulator throttling: clear error (%r)" %
                  err.strip())
        finally:
            emu2.terminate()
            emu2.communicate(timeout=10)
    finally:
        emu.terminate()
        emu.communicate(timeout=10)
        os.unlink(creds)


def main():
    if not os.access(DRIVER, os.X_OK):
        print("driver not built: " + DRIVER)
        return 1
    imds = Imds()
    home = tempfile.mkdtemp(prefix="spot-aws-integ-")
    env_secret = "envSecretExampleKey/DoNotPrint+0123456789ab"
    file_secret = "fileSecretExampleKey/DoNotPrint+0123456789a"
    try:
        base = clean_env(home)
        base["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = imds.url

        # 1. Instance role: credentials and region from IMDS, refreshed as
        #    they expire (4 s lifetime: refresh at half-life, 2 s).
        rc, out, err, secs = run(base, "--watch-ms", "15000",
                                 "--want-refreshes", "2")
        print(out + err)
        check(rc == 0, "imds: exit 0 (got %d)" % rc)
        check(field(out, "source=", "source") == "imds", "imds: source=imds")
        check(field(out, "source=", "region") == "eu-west-3",
              "imds: region from placement/region")
        check(field(out, "source=", "endpoint") ==
              "https://s3.eu-west-3.amazonaws.com", "imds: regional endpoint")
        check(field(out, "source=", "path_style") == "0",
              "imds: virtual-host style for AWS")
        check(field(out, "initial", "key_id") == "ASIAROLE0001",
              "imds: first role key id")
        check(field(out, "initial", "secret_sha256") == sha12(imds.secrets[0]),
              "imds: first role secret")
        check(field(out, "initial", "session_token") == "yes",
              "imds: session token present")
        refreshed = [l for l in out.splitlines() if l.startswith("refresh ")]
        check(len(refreshed) >= 2, "imds: refreshed twice (%d)" % len(refreshed))
        ids = [field(l, "refresh", "key_id") for l in refreshed]
        check(len(set(ids)) == len(ids) and "ASIAROLE0001" not in ids,
              "imds: each refresh brings new credentials")
        check(3.0 <= secs <= 12.0, "imds: two refreshes took %.1f s" % secs)
        check(imds.unauthorized == 0, "imds: every GET carried the token")
        no_leak("imds", out, err, imds.secrets + list(imds.tokens) +
                ["roleToken0001Ex=="])

        # 2. Refresh failures keep the last good credentials.
        imds.fail_after = imds.n_creds + 1
        rc, out, err, secs = run(base, "--watch-ms", "5000",
                                 "--want-refreshes", "1")
        print(out + err)
        first = field(out, "initial", "key_id")
        check(rc == 4, "refresh failing: no refresh seen (exit %d)" % rc)
        check(field(out, "final", "key_id") == first,
              "refresh failing: still the first credentials")
        check("AWS credentials refresh failed" in err,
              "refresh failing: one warning")
        check(err.count("AWS credentials refresh failed") == 1,
              "refresh failing: warned once, not per retry")
        no_leak("refresh failing", out, err, imds.secrets + list(imds.tokens))
        imds.fail_after = None

        # 2b. A busy IMDS (503) is retried a bounded number of times.
        imds.token_busy = 2
        rc, out, err, _ = run(base)
        check(rc == 0 and field(out, "source=", "source") == "imds",
              "busy IMDS: two 503s then success")
        imds.token_busy = 3
        rc, out, err, _ = run(base)
        check(rc == 1 and "HTTP 503" in err, "busy IMDS: three 503s, gives up")
        imds.token_busy = 0

        # 3. The environment beats everything; IMDS is not asked.
        before = imds.requests
        env = dict(base, AWS_ACCESS_KEY_ID="AKIAENVEXAMPLE",
                   AWS_SECRET_ACCESS_KEY=env_secret, AWS_REGION="us-west-2")
        rc, out, err, _ = run(env)
        check(rc == 0 and field(out, "source=", "source") == "env",
              "env: source=env")
        check(field(out, "initial", "secret_sha256") == sha12(env_secret),
              "env: the env secret")
        check(imds.requests == before, "env: IMDS not contacted")
        no_leak("env", out, err, [env_secret])

        # 4. A profile beats IMDS; region from its config section.
        cred = os.path.join(home, "credentials")
        conf = os.path.join(home, "config")
        with open(cred, "w") as f:
            f.write("[default]\naws_access_key_id = AKIAFILEEXAMPLE\n"
                    "aws_secret_access_key = %s\n" % file_secret)
        with open(conf, "w") as f:
            f.write("[default]\nregion = ap-northeast-1\n")
        before = imds.requests
        env = dict(base, AWS_SHARED_CREDENTIALS_FILE=cred, AWS_CONFIG_FILE=conf)
        rc, out, err, _ = run(env)
        check(rc == 0 and field(out, "source=", "source") == "profile",
              "profile: source=profile")
        check(field(out, "source=", "region") == "ap-northeast-1",
              "profile: region from the config file")
        check(imds.requests == before, "profile: IMDS not contacted")
        no_leak("profile", out, err, [file_secret])

        # 5. Custom endpoint: path style, default region, no IMDS for it.
        rc, out, err, _ = run(dict(env, AWS_CONFIG_FILE=os.devnull + ".none"),
                              "--endpoint", "http://127.0.0.1:7480")
        check(rc == 1 and "cannot read AWS config file" in err,
              "explicit missing config file: clear error")
        os.unlink(conf)
        rc, out, err, _ = run(dict(base, AWS_SHARED_CREDENTIALS_FILE=cred),
                              "--endpoint", "http://127.0.0.1:7480/")
        check(rc == 0 and field(out, "source=", "endpoint") ==
              "http://127.0.0.1:7480" and
              field(out, "source=", "path_style") == "1" and
              field(out, "source=", "region") == "us-east-1",
              "custom endpoint: path style, region us-east-1")

        # 6. No role attached: the chain ends with one clear line.
        imds.role_status = 404
        rc, out, err, _ = run(base)
        check(rc == 1 and "no AWS credentials found" in err and
              "no IAM role attached" in err, "no role: clear error")
        check(len(err.strip().splitlines()) == 1, "no role: one line")
        imds.role_status = 200

        # 7. Unreachable IMDS: error after the 2 s timeout at most.
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % s.getsockname()[1]
        s.close()
        rc, out, err, secs = run(dict(base, AWS_EC2_METADATA_SERVICE_ENDPOINT=dead))
        check(rc == 1 and "no AWS credentials found" in err,
              "unreachable IMDS: clear error")
        check(secs < 5, "unreachable IMDS: quick (%.1f s)" % secs)

        # 8. Disabled IMDS: no request at all.
        before = imds.requests
        rc, out, err, _ = run(dict(base, AWS_EC2_METADATA_DISABLED="true"))
        check(rc == 1 and "instance metadata is disabled" in err and
              imds.requests == before, "disabled IMDS: not contacted")

        # 9. Bad input, one clear line each, never the secret.
        cases = [
            ("half-set env", dict(base, AWS_ACCESS_KEY_ID="AKIAX"), [],
             "AWS_SECRET_ACCESS_KEY is not"),
            ("invalid region", base, ["--region", "Moon_1"],
             "invalid AWS region 'Moon_1'"),
            ("malformed endpoint", base, ["--endpoint", "s3.local:80"],
             "malformed endpoint"),
            ("unreadable profile file",
             dict(base, AWS_SHARED_CREDENTIALS_FILE=home), [],
             "Is a directory"),
            ("profile not found", dict(base, AWS_PROFILE="nosuch"), [],
             "AWS profile 'nosuch' not found"),
            ("password in endpoint", base,
             ["--endpoint", "http://u:%s@h" % env_secret], "user or password"),
        ]
        for name, env, args, want in cases:
            rc, out, err, _ = run(env, *args)
            check(rc == 1 and want in err and
                  len(err.strip().splitlines()) == 1,
                  "%s: %r (got %d %r)" % (name, want, rc, err.strip()))
            no_leak(name, out, err, [env_secret])
        emulator_checks(home, base)
    finally:
        imds.stop()
        for f in ("credentials", "config"):
            try:
                os.unlink(os.path.join(home, f))
            except FileNotFoundError:
                pass
        os.rmdir(home)
    CHECKS.finish()


if __name__ == "__main__":
    sys.exit(main())
