#!/bin/bash
# The Python helper installs with pip into a fresh venv, with no package
# index (--no-index: nothing is fetched): from the source folder, as an
# editable install, and from the sdist its backend writes; `import spotd`
# then finds the installed copy, whose version is the project's.
# Usage: pip_install.sh SRCDIR BUILDDIR
set -uo pipefail
src=$1 build=$2
fail=0
check() { # cond-status, what
  if [ "$1" -eq 0 ]; then echo "ok: $2"; else echo "FAIL: $2"; fail=1; fi
}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/spotd-pip.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
want=$(meson introspect --projectinfo "$build" |
  /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')

# Debian's venv module brings pip only with python3-venv (ensurepip)
if ! /usr/bin/python3 -m venv "$tmp/v" >"$tmp/venv.log" 2>&1; then
  cat "$tmp/venv.log"
  echo "FAIL: python3 -m venv (Debian: python3-venv, tools/deps.sh test)"
  exit 1
fi
pip=("$tmp/v/bin/pip" --disable-pip-version-check --no-cache-dir -q)
imported() { # prints spotd's file and the installed distribution's version
  (cd "$tmp" && "$tmp/v/bin/python" -c 'import importlib.metadata as m, spotd
print(spotd.__file__, m.version("spotd"))')
}

"${pip[@]}" install --no-index "$src/python" >"$tmp/pip.log" 2>&1
check $? "pip install ./python: $(tail -3 "$tmp/pip.log")"
got=$(imported)
[ "$got" = "$tmp/v/lib/python3.$(/usr/bin/python3 -c 'import sys; print(sys.version_info[1])')/site-packages/spotd/__init__.py $want" ]
check $? "import spotd from the venv, version $want (got: $got)"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  left=$(git -C "$src" status --porcelain --ignored -- python |
    grep -E '^(\?\?|!!)' | grep -v __pycache__)
  [ -z "$left" ]
  check $? "the build left nothing in python/ ($left)"
fi
"${pip[@]}" uninstall -y spotd >/dev/null 2>&1
! (cd "$tmp" && "$tmp/v/bin/python" -c 'import spotd' 2>/dev/null)
check $? "pip uninstall removes it"

"${pip[@]}" install --no-index -e "$src/python" >"$tmp/pip.log" 2>&1
check $? "pip install -e ./python: $(tail -3 "$tmp/pip.log")"
got=$(imported)
[ "$got" = "$src/python/spotd/__init__.py $want" ]
check $? "editable: import spotd is the source tree's (got: $got)"
"${pip[@]}" uninstall -y spotd >/dev/null 2>&1

# the sdist carries its version (PKG-INFO): it builds without ../meson.build
mkdir "$tmp/sdist"
sdist=$(cd "$src/python" && /usr/bin/python3 -B -c 'import sys, build_backend
print(build_backend.build_sdist(sys.argv[1]))' "$tmp/sdist")
check $? "build_sdist: $sdist"
"${pip[@]}" install --no-index "$tmp/sdist/$sdist" >"$tmp/pip.log" 2>&1
check $? "pip install of the sdist: $(tail -3 "$tmp/pip.log")"
got=$(imported)
[ "${got#* }" = "$want" ] && [[ "$got" == "$tmp/v/"* ]]
check $? "import spotd from the sdist's install (got: $got)"
exit $fail
