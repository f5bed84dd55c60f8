#!/usr/bin/python3
"""Credentials against the real Ceph.

1. Instance-role credentials that expire and rotate mid-upload. The test
   adds a second S3 key pair (K1) to the Ceph test user with radosgw-admin
   and `spotd-emulate --provider aws` serves it as the role's
   credentials with a 4 s Expiration (re-read from a file on every
   request). spotctl pushes through a bandwidth-capped faultproxy (so the
   upload lasts ~10 s) with no key in the environment or files, the chain
   pointed at the emulator by AWS_EC2_METADATA_SERVICE_ENDPOINT. Mid-upload
   a new pair K2 is created, the emulator serves it, and once the old
   credentials can only have been used by requests already signed, K1 is
   removed from Ceph. The push must complete (requests signed with K1 then
   K2, none refused) and restore identical from Ceph. Ceph does not know
   IMDS session tokens; it ignores x-amz-security-token, so the emulator
   serves a dummy one.
2. Wrong credentials: a wrong secret (SignatureDoesNotMatch) and an unknown
   key id (InvalidAccessKeyId) fail at once: non-zero exit, one line
   naming the S3 code, no retries (one request through the proxy).

Never reaches 169.254.169.254: the endpoint variable points at the
emulator, and the emulator must have seen the requests."""
import json
import os
import secrets
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spotlib  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402

endpoint, bucket = spotlib.store_env()
c = spotlib.Checks()
url, root = spotlib.unique_job("creds")


def ceph_dir():
    """The folder of the running test server: $SPOT_TEST_S3_DIR, else the
    port claim tests/s3server.sh wrote for the gateway's port."""
    d = os.environ.get("SPOT_TEST_S3_DIR")
    if d:
        return d
    port = endpoint.rsplit(":", 1)[1].strip("/")
    claims = os.path.join(os.environ.get("TMPDIR", "/tmp"), "spotd-s3server.ports", port)
    with open(claims) as f:
        return f.read().strip()


CONF = os.path.join(ceph_dir(), "ceph.conf")
if not os.path.exists(CONF):
    print("FAIL: no ceph.conf at %s" % CONF)
    sys.exit(1)


def rgw_admin(*args):
    cp = spotlib.run(["radosgw-admin", "-c", CONF] + list(args), timeout=60)
    if cp.returncode != 0:
        print("radosgw-admin %s failed: %s" % (args[:2], cp.stderr[-500:]))
    return cp.returncode == 0


def new_pair():
    ak = "SPOTDROLE" + secrets.token_hex(6).upper()
    sk = secrets.token_urlsafe(30)
    return ak, sk


def role_env(emu_url, home):
    """No credentials in the environment or files: only the role."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") or k in ("AWS_REGION", "AWS_DEFAULT_REGION")}
    env.update(HOME=home, AWS_EC2_METADATA_SERVICE_ENDPOINT=emu_url,
               SPOTD_LOG_LEVEL="7")
    return env


def spotctl_env(env, *args, timeout=120):
    import subprocess
    try:
        return subprocess.run([spotlib.spotctl_exe()] + [str(a) for a in args],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(args, -9, str(e.stdout), str(e.stderr))


px = FaultProxy(endpoint, seed=3)
added = []
try:
    with tempfile.TemporaryDirectory() as tmp:
        home = os.path.join(tmp, "home")
        os.makedirs(home)
        src = os.path.join(tmp, "ckpt")
        os.makedirs(src)
        spotlib.write_gaussian(os.path.join(src, "model.pt"), 40 * 1024 * 1024, seed=11)
        with open(os.path.join(src, "step.txt"), "w") as f:
            f.write("step 99\n")

        # ---- 1. rotation mid-upload
        k1 = new_pair()
        c.check(rgw_admin("key", "create", "--uid=spotd-test", "--key-type=s3",
                          "--access-key=" + k1[0], "--secret-key=" + k1[1]),
                "radosgw-admin adds the role's first key pair")
        added.append(k1[0])
        creds_file = os.path.join(tmp, "role.json")
        token = "DUMMYSESSIONTOKEN" + secrets.token_hex(8)

        def serve(pair):
            with open(creds_file + ".tmp", "w") as f:
                json.dump({"AccessKeyId": pair[0], "SecretAccessKey": pair[1],
                           "Token": token}, f)
            os.replace(creds_file + ".tmp", creds_file)

        serve(k1)
        emu = spotlib.EmulatorProc("aws", "--role-creds", creds_file, "--role-expire", "4")
        env = role_env(emu.url, home)
        px.configure(bandwidth=4 * 1000 * 1000)
        px.reset_stats()
        import subprocess
        t0 = time.monotonic()
        p = subprocess.Popen([spotlib.spotctl_exe(), "push", src, url, "--name", "rotated",
                              "--endpoint", px.url, "--part-size", "5M", "--parallel", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        spotlib._STARTED.append(p)
        time.sleep(3)
        k2 = new_pair()
        c.check(rgw_admin("key", "create", "--uid=spotd-test", "--key-type=s3",
                          "--access-key=" + k2[0], "--secret-key=" + k2[1]),
                "radosgw-admin adds the rotated key pair")
        added.append(k2[0])
        serve(k2)
        t_rot = time.monotonic() - t0
        # refreshes come every ~2 s (half of a 4 s life); a part in
        # flight at 4 MB/s takes <= 2.6 s: then K1 can go
        time.sleep(4.5)
        c.check(p.poll() is None, "the push was still uploading when K1 was removed "
                "(%.1f s in)" % (time.monotonic() - t0))
        c.check(rgw_admin("key", "rm", "--uid=spotd-test", "--key-type=s3",
                          "--access-key=" + k1[0]), "radosgw-admin removes K1")
        added.remove(k1[0])
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        wall = time.monotonic() - t0
        st = px.stats()
        print("     rotation at %.1f s, push %.1f s, keys used %s, statuses %s" % (
            t_rot, wall, st["access_keys"], st["statuses"]))
        c.check(p.returncode == 0 and "pushed rotated" in out,
                "push completes across expiry and rotation", out + err)
        c.check(st["access_keys"].get(k1[0], 0) > 0 and st["access_keys"].get(k2[0], 0) > 0,
                "requests were signed with K1, then with K2 (refreshed mid-upload)",
                repr(st["access_keys"]))
        c.check(set(st["access_keys"]) <= {k1[0], k2[0]}, "only the role's keys were used",
                repr(st["access_keys"]))
        c.check(not any(s in ("400", "401", "403") for s in st["statuses"]),
                "no request was refused", repr(st["statuses"]))
        c.check(err.count("credentials refreshed") >= 2 or "refresh" in err,
                "the refreshes are logged (debug)", err[-1500:])
        c.check(k1[1] not in out + err and k2[1] not in out + err and token not in out + err,
                "no secret key or token in the output")
        c.check(emu.state()["requests"] > 0, "the chain asked the emulator (not 169.254.169.254)")
        emu.stop()
        spotlib.check_restore(c, url, src, os.path.join(tmp, "back"),
                              "restored from Ceph, identical", "--name", "rotated",
                              "--endpoint", endpoint)

        # ---- 2. wrong credentials
        small = os.path.join(tmp, "small")
        os.makedirs(small)
        with open(os.path.join(small, "a.txt"), "w") as f:
            f.write("hello\n")
        px.configure()
        for what, ak, sk, code in [
                ("wrong secret", os.environ["AWS_ACCESS_KEY_ID"], "not-the-secret-0123456789",
                 "SignatureDoesNotMatch"),
                ("unknown key id", "SPOTDNOSUCHKEY000001", "whatever-secret-0123456789",
                 "InvalidAccessKeyId")]:
            px.reset_stats()
            env = dict(os.environ, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk)
            env.pop("AWS_SESSION_TOKEN", None)
            t0 = time.monotonic()
            cp = spotctl_env(env, "push", small, url, "--name", "wrong", "--endpoint", px.url,
                             timeout=60)
            secs = time.monotonic() - t0
            lines = [ln for ln in cp.stderr.strip().splitlines() if ln]
            st = px.stats()
            n = sum(st["requests"].values())
            c.check(cp.returncode != 0, "%s: non-zero exit" % what, cp.stdout + cp.stderr)
            c.check(len(lines) == 1 and lines[0].startswith("spotctl: ") and code in lines[0],
                    "%s: one line naming %s" % (what, code), cp.stderr)
            c.check(n == 1 and "retr" not in cp.stderr,
                    "%s: no retries (%d request(s), %.1f s)" % (what, n, secs), repr(st))
            c.check(sk not in cp.stdout + cp.stderr, "%s: the secret is not echoed" % what)
        c.check(not any(k.endswith("wrong/MANIFEST.json") for k in spotlib.s3_keys(root)),
                "nothing committed with wrong credentials")
finally:
    for ak in list(added):
        rgw_admin("key", "rm", "--uid=spotd-test", "--key-type=s3", "--access-key=" + ak)
    px.close()
    spotlib.kill_started()
    spotlib.s3_cleanup(root)
c.finish()
