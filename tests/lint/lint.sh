#!/bin/bash
# Static checks, one per invocation:
#   banned | layers | includes | cycles | fsm | pure | cppcheck |
#   clang-tidy | format | programs
# Usage: lint.sh CHECK SRCDIR BUILDDIR
set -uo pipefail
check=$1 src=$2 build=$3
cd "$src"
mapfile -t csrc < <(git ls-files 'lib/*.c' 'daemon/*.c' 'client/*.c' 'emulate/*.c' 2>/dev/null ||
  find lib daemon client emulate -name '*.c')
mapfile -t allc < <(git ls-files '*.c' '*.h' 2>/dev/null | grep -v '^tests/fuzz/corpus/')

case "$check" in
banned)
  # Banned in our C code: unbounded writes (strcpy, strcat, sprintf),
  # conversions that hide errors (atoi), hidden state (strtok), a shell or a
  # process-wide disposition (system, signal) and a transfer that blocks the
  # loop (curl_easy_perform).
  # String literals and comments are blanked first, so prose may name them.
  rc=0
  for f in "${allc[@]}"; do
    if sed -E 's/"([^"\\]|\\.)*"/""/g; s|//.*$||; s|/\*.*\*/||g; s|^[[:space:]]*\*.*$||' "$f" |
      grep -nE '(^|[^A-Za-z0-9_.>])(strcpy|strcat|sprintf|vsprintf|atoi|atol|strtok|system|signal|curl_easy_perform|gets)[[:space:]]*\(' |
      sed "s|^|$f:|"; then
      rc=1
    fi
  done
  if [ $rc -ne 0 ]; then
    echo "banned functions used (the list is in tests/lint/lint.sh)"
    exit 1
  fi
  # No bare assert in the Python tests: python -O (PYTHONOPTIMIZE) drops
  # it, and the test then passes without checking. Use Checks.check() or
  # expect() of tests/integration/spotlib.py.
  mapfile -t pytests < <(git ls-files 'tests/*.py' 2>/dev/null ||
    find tests -name '*.py')
  /usr/bin/python3 - "${pytests[@]}" <<'PY' || exit 1
import ast, sys
bad = 0
for f in sys.argv[1:]:
    with open(f, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), f)
    for n in ast.walk(tree):
        if isinstance(n, ast.Assert):
            print("%s:%d: bare assert in a test (use an explicit check)" % (f, n.lineno))
            bad += 1
sys.exit(1 if bad else 0)
PY
  ;;
layers)
  # lib/core is pure: it includes neither libuv, libcurl nor an io/ header
  # (lib/ headers are named by their path under lib/: tests/lint/includes.py).
  if grep -nE '#include [<"](uv\.h|curl/[a-z]+\.h|io/[a-z_/]+\.h|\.\./)[>"]' \
    lib/core/*.c lib/core/*.h; then
    echo "lib/core must not include libuv, libcurl or lib/io headers"
    exit 1
  fi
  # The client runs on every training node: no HTTP server, no emulator
  # code (that is spotd-emulate, emulate/, which spotctl only execs), and
  # the emulator stands on lib/ alone, not on the client's files.
  if grep -nE '#include [<"](microhttpd\.h|emulate[a-z_]*\.h)[>"]' client/*.c client/*.h; then
    echo "client/ must not include the HTTP server or emulate/ headers"
    exit 1
  fi
  if grep -nE '#include "(spotctl|relaunch_cloud)\.h"' emulate/*.c emulate/*.h; then
    echo "emulate/ must not include client/ headers"
    exit 1
  fi
  ;;
cppcheck)
  cppcheck --enable=warning,performance,portability --error-exitcode=1 -q \
    --std=c11 -D_GNU_SOURCE --inline-suppr \
    --suppress=missingIncludeSystem -I lib -I "$build" "${csrc[@]}"
  ;;
clang-tidy)
  command -v clang-tidy >/dev/null || { echo "clang-tidy missing"; exit 1; }
  # One file per process, as many at once as there are cores; a file's
  # findings come out in one piece. Any finding or failure fails.
  # shellcheck disable=SC2016 # expanded by the inner bash
  printf '%s\0' "${csrc[@]}" | xargs -0 -n 1 -P "$(nproc)" bash -c '
    out=$(clang-tidy -p "$0" --quiet --extra-arg=-Wno-unknown-warning-option "$1" 2>/dev/null)
    rc=$?
    if [ -n "$out" ]; then echo "$out"; rc=1; fi
    exit $((rc != 0))' "$build" || exit 1
  exit 0
  ;;
format)
  command -v clang-format >/dev/null || { echo "clang-format missing"; exit 1; }
  rc=0
  for f in "${allc[@]}"; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
      echo "not clang-formatted: $f"
      rc=1
    fi
  done
  exit $rc
  ;;
includes)
  # lib/ headers named by their path under lib/; X_internal.h only next
  # to it (tests/lint/includes.py).
  exec /usr/bin/python3 tests/lint/includes.py "$src"
  ;;
cycles)
  # No include cycle between daemon/ modules beyond its allowlist
  # (tests/lint/cycles.py).
  exec /usr/bin/python3 tests/lint/cycles.py "$src"
  ;;
fsm)
  # Every state machine goes through lib/core/fsm.h (tests/lint/fsm.py).
  exec /usr/bin/python3 tests/lint/fsm.py "$src"
  ;;
pure)
  # The engine (daemon/engine.c) is a pure step function: its object file
  # calls no libuv and no system call, only the pure libc functions below
  # (and what a sanitizer or _FORTIFY_SOURCE adds) and lib/core, what
  # libspot-core.a defines (layers keeps libuv out of it), but its logger:
  # a line to log is a command too.
  obj=$build/daemon/libspotd-engine.a.p/engine.c.o
  core=$build/lib/libspot-core.a
  if [ ! -f "$obj" ] || [ ! -f "$core" ]; then
    echo "engine: $obj or $core is missing: build first (ninja -C $build)"
    exit 1
  fi
  libc='memcpy|memmove|memset|memcmp|strcmp|strncmp|strlen|snprintf|vsnprintf'
  allow="^(($libc)|__(($libc)_chk|stack_chk_fail)|__(asan|ubsan|tsan|msan|sanitizer|gcov|llvm)_.*)\$"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if ! nm --defined-only -g "$core" >"$tmp/core.nm" || ! nm -u "$obj" >"$tmp/undefined.nm"; then
    echo "engine: nm failed"
    exit 1
  fi
  awk 'NF == 3 {print $3}' "$tmp/core.nm" | sort -u >"$tmp/core"
  rc=0
  n=0
  while read -r sym; do
    n=$((n + 1))
    case "$sym" in uv_* | spot_io_* | curl_*)
      echo "daemon/engine.c calls $sym: the engine is pure (driver.c runs libuv)"
      rc=1
      continue
      ;;
    spot_log*)
      echo "daemon/engine.c calls $sym: the engine writes no log line itself" \
        "(elog(): a LOG command driver.c carries out)"
      rc=1
      continue
      ;;
    esac
    [[ $sym =~ $allow ]] && continue
    grep -qxF -- "$sym" "$tmp/core" && continue
    echo "daemon/engine.c calls $sym: not a pure libc function nor lib/core's" \
      "(a system call, the clock, I/O: a command for driver.c instead)"
    rc=1
  done < <(awk '{print $NF}' "$tmp/undefined.nm")
  [ $rc -eq 0 ] && echo "pure: daemon/engine.c: $n undefined symbols, all pure"
  exit $rc
  ;;
programs)
  # Every program a test, tool or benchmark runs comes from an essential
  # package or from tools/deps.sh (with what those depend on).
  exec /usr/bin/python3 tests/lint/programs.py "$src"
  ;;
*)
  echo "unknown check $check"
  exit 2
  ;;
esac
