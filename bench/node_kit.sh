#!/usr/bin/env bash
# node_kit.sh - a folder that runs bench/node_bench.sh on a machine without
# the project's Debian libraries (the GPU host: its own glibc, no Debian
# packages, no package registry):
#
#   bench/node_kit.sh [KIT]          (default .nodekit)
#
# Builds spotctl, spotd, spotd-emulate, bench/s3_sink and bench/s3_mem in
# release mode (in KIT.build) with an RPATH of $ORIGIN/../lib, and lays them
# out in KIT as a build folder is (KIT/client/spotctl, KIT/daemon/spotd,
# ...), with every shared library they load except glibc's in KIT/lib.
# The RPATH (not RUNPATH) also covers the libraries' own dependencies, and
# only these binaries: a trainer that spotd starts loads its own libraries,
# with no LD_LIBRARY_PATH to keep away from it. The kit is ~26 MiB;
# .gitignore keeps .nodekit and .nodekit.build out of the repository (a
# remote runner that copies only tracked files must be told to take
# .nodekit along).
#
# There, from the repository root (python3 with numpy; torch for a real
# trainer; /usr/bin/time or not, node_bench.sh falls back to timecmd.py):
#
#   NODE_BENCH_PY=python3 NODE_BENCH_OUT=/tmp/node.md bash bench/node_bench.sh .nodekit
set -euo pipefail

# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" "$@"
KIT=$(realpath -m "${1:-$SRC/.nodekit}")
BUILD=$KIT.build
BINS=(client/spotctl daemon/spotd emulate/spotd-emulate bench/s3_sink bench/s3_mem)

if [[ ! -f $BUILD/build.ninja ]]; then
  # meson passes $ORIGIN through to the linker as it is
  meson setup "$BUILD" "$SRC" -Dbuildtype=release \
    "-Dc_link_args=-Wl,--disable-new-dtags,-rpath,\$ORIGIN/../lib" >/dev/null
fi
ninja -C "$BUILD" "${BINS[@]}" >/dev/null

rm -rf "$KIT"
mkdir -p "$KIT/lib"
for b in "${BINS[@]}"; do
  mkdir -p "$KIT/$(dirname "$b")"
  cp "$BUILD/$b" "$KIT/$b"
  strip "$KIT/$b"
done
# every library the loader resolves to a file, glibc's own excepted (the
# host has its own, and a foreign libc cannot be mixed with its loader)
for b in "${BINS[@]}"; do
  ldd "$KIT/$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv)\.so' |
  while read -r lib; do cp -L "$lib" "$KIT/lib/"; done

# each binary must find all its libraries in the kit, and run
for b in "${BINS[@]}"; do
  if ldd "$KIT/$b" | grep -q 'not found'; then
    echo "$b: a library is missing from the kit:" >&2
    ldd "$KIT/$b" | grep 'not found' >&2
    exit 1
  fi
  "$KIT/$b" --help >/dev/null 2>&1 || { echo "$b --help failed in the kit" >&2; exit 1; }
done
echo "kit $KIT: $(du -sh "$KIT" | cut -f1), ${#BINS[@]} binaries, $(find "$KIT/lib" -type f | wc -l) libraries"
