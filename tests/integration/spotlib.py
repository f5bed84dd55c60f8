"""Small shared helpers for the integration test scripts (python3 stdlib).

Keep this generic: environment access, running a command with a timeout,
comparing files, skipping, and collecting check results.
"""
import filecmp
import os
import subprocess
import sys

SKIP = 77

SRCDIR = os.environ.get(
    "SPOT_SRCDIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
BUILDDIR = os.environ.get("SPOT_BUILDDIR", os.path.join(SRCDIR, "build"))
PY3 = "/usr/bin/python3"


def skip(why):
    """Exit with meson's skip status."""
    print("SKIP: " + why)
    sys.exit(SKIP)


def need_env(*names):
    """The values of names, skipping the test when the first is unset (the
    server was not started) and failing when a later one is missing."""
    if not os.environ.get(names[0]):
        skip(names[0] + " is not set (run under tests/s3server.sh run DIR -- ...)")
    values = []
    for n in names:
        v = os.environ.get(n)
        if v is None:
            print("FAIL: %s is not set" % n)
            sys.exit(1)
        values.append(v)
    return values


def builddir_path(*parts):
    return os.path.join(BUILDDIR, *parts)


def srcdir_path(*parts):
    return os.path.join(SRCDIR, *parts)


def run(argv, timeout=60, env=None, check=False, input=None):
    """Runs argv and returns a CompletedProcess with text stdout/stderr.
    A timeout is a test failure, reported as returncode -9."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                            env=full_env, input=input)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        cp = subprocess.CompletedProcess(argv, -9, out, err + "\n(timed out)")
    if check and cp.returncode != 0:
        print("command failed (%d): %s\n%s%s" % (cp.returncode, " ".join(argv),
                                                cp.stdout, cp.stderr))
        sys.exit(1)
    return cp


def same_file(a, b):
    return filecmp.cmp(a, b, shallow=False)


class Checks:
    """Collects named checks; finish() exits 0 or 1."""

    def __init__(self):
        self.failed = []

    def check(self, cond, what, detail=""):
        if cond:
            print("ok   " + what)
        else:
            print("FAIL " + what + (("\n     " + detail.replace("\n", "\n     "))
                                     if detail else ""))
            self.failed.append(what)
        return cond

    def finish(self):
        if self.failed:
            print("%d check(s) failed: %s" % (len(self.failed), ", ".join(self.failed)))
            sys.exit(1)
        print("all checks passed")
        sys.exit(0)
