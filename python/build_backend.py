"""The PEP 517 build backend of the spotd Python helper: standard library
only, so that `pip install ./python` works into a fresh venv with no
package index (pip's isolated build installs nothing: pyproject.toml
requires nothing and names this file through backend-path).

Builds a pure wheel (py3-none-any) of the spotd package, an sdist, and an
editable wheel (a .pth file naming this folder). The version is the
project's, read from the meson.build one folder up (its one place); an
sdist carries it in PKG-INFO, read back when there is no meson.build."""
import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "spotd"
TAG = "py3-none-any"
# The files of an sdist besides the package itself.
SDIST_FILES = ("pyproject.toml", "build_backend.py", "README.md")


def _project():
    """name, summary and requires-python of pyproject.toml's [project]
    (plain `key = "string"` lines: no TOML parser before Python 3.11)."""
    meta = {}
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as fh:
        section = None
        for line in fh:
            m = re.match(r"\s*\[([^]]+)\]", line)
            if m:
                section = m.group(1).strip()
                continue
            m = re.match(r'\s*([A-Za-z-]+)\s*=\s*"([^"]*)"', line)
            if section == "project" and m:
                meta[m.group(1)] = m.group(2)
    return meta


def version():
    meson = os.path.join(os.path.dirname(HERE), "meson.build")
    if os.path.exists(meson):
        with open(meson, encoding="utf-8") as fh:
            m = re.search(r"\bproject\s*\((.*?)\)", fh.read(), re.S)
        v = m and re.search(r"\bversion\s*:\s*'([^']+)'", m.group(1))
        if v:
            return v.group(1)
        raise RuntimeError("no version in project() of %s" % meson)
    with open(os.path.join(HERE, "PKG-INFO"), encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("Version: "):
                return line.split(": ", 1)[1].strip()
    raise RuntimeError("neither ../meson.build nor a PKG-INFO with a Version")


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: %s" % p.get("name", NAME),
             "Version: %s" % version()]
    if p.get("description"):
        lines.append("Summary: %s" % p["description"])
    if p.get("requires-python"):
        lines.append("Requires-Python: %s" % p["requires-python"])
    lines.append("License: see the spotd source repository")
    return "\n".join(lines) + "\n"


def _dist_info():
    return "%s-%s.dist-info" % (NAME, version())


def _package_files():
    root = os.path.join(HERE, NAME)
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                full = os.path.join(d, f)
                out.append((os.path.relpath(full, HERE).replace(os.sep, "/"), full))
    return out


def _write_wheel(wheel_directory, entries):
    """entries: (archive name, bytes); adds WHEEL, METADATA and RECORD."""
    di = _dist_info()
    entries = list(entries) + [
        (di + "/METADATA", _metadata().encode()),
        (di + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: spotd build_backend\n"
                         "Root-Is-Purelib: true\nTag: %s\n" % TAG).encode()),
    ]
    record = []
    for name, data in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append("%s,sha256=%s,%d" % (name, digest.decode(), len(data)))
    record.append(di + "/RECORD,,")
    entries.append((di + "/RECORD", ("\n".join(record) + "\n").encode()))
    fname = "%s-%s-%s.whl" % (NAME, version(), TAG)
    # fixed times: the same sources give the same wheel
    stamp = (1980, 1, 1, 0, 0, 0)
    with zipfile.ZipFile(os.path.join(wheel_directory, fname), "w",
                         zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            zi = zipfile.ZipInfo(name, stamp)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return fname


def _read(path):
    with open(path, "rb") as fh:
        return fh.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    di = os.path.join(metadata_directory, _dist_info())
    os.makedirs(di, exist_ok=True)
    with open(os.path.join(di, "METADATA"), "w", encoding="utf-8") as fh:
        fh.write(_metadata())
    return _dist_info()


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory,
                        [(name, _read(full)) for name, full in _package_files()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # a .pth file puts this folder on sys.path: `import spotd` is the source
    return _write_wheel(wheel_directory, [(NAME + ".pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, version())
    fname = base + ".tar.gz"
    members = [(name, _read(full)) for name, full in _package_files()]
    members += [(f, _read(os.path.join(HERE, f))) for f in SDIST_FILES
                if os.path.exists(os.path.join(HERE, f))]
    members.append(("PKG-INFO", _metadata().encode()))
    now = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    with tarfile.open(os.path.join(sdist_directory, fname), "w:gz",
                      format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(members):
            ti = tarfile.TarInfo(base + "/" + name)
            ti.size, ti.mtime, ti.mode = len(data), now, 0o644
            tar.addfile(ti, io.BytesIO(data))
    return fname
