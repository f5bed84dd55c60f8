#!/bin/bash
# Installs the Debian 12 packages spotd needs. Only what is missing, so a
# second run costs a second. Usage: tools/deps.sh [build|test|demo|bench]...
set -euo pipefail

build_pkgs=(meson ninja-build pkg-config gcc libc6-dev libuv1-dev
  libcurl4-openssl-dev libzstd-dev libjansson-dev libexpat1-dev libinih-dev
  libsystemd-dev libssl-dev libmicrohttpd-dev libcmocka-dev zstd
  libcairo2-dev)
# Ceph RGW is the real S3 server of the tests; boto3 the independent reader.
s3_pkgs=(ceph-mon ceph-osd radosgw ceph-common ceph-base uuid-runtime
  python3-boto3 curl)
test_pkgs=(valgrind clang clang-tidy cppcheck libclang-rt-14-dev
  python3-torch slurm-wlm munge systemd-container awscli iproute2
  python3-prometheus-client python3-pil)
demo_pkgs=(python3-torch)
# bench/: the pictures and the peers (aws s3 cp, its CRT client) it measures.
bench_pkgs=(python3-matplotlib python3-numpy awscli)

want=()
for what in "${@:-build}"; do
  case "$what" in
  build) want+=("${build_pkgs[@]}") ;;
  s3) want+=("${s3_pkgs[@]}") ;;
  test) want+=("${build_pkgs[@]}" "${s3_pkgs[@]}" "${test_pkgs[@]}") ;;
  demo) want+=("${build_pkgs[@]}" "${s3_pkgs[@]}" "${demo_pkgs[@]}") ;;
  bench) want+=("${build_pkgs[@]}" "${s3_pkgs[@]}" "${bench_pkgs[@]}") ;;
  *) echo "deps.sh: unknown set '$what'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "deps.sh: missing packages: ${missing[*]}; run as root or install them" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=600 -q -y --no-install-recommends)
# The package lists may be absent or stale on a new machine.
if ! apt-get "${apt_opts[@]}" install "${missing[@]}" >/tmp/spotd-apt.log 2>&1; then
  apt-get -o DPkg::Lock::Timeout=600 -q update >/tmp/spotd-apt.log 2>&1
  apt-get "${apt_opts[@]}" install "${missing[@]}" >>/tmp/spotd-apt.log 2>&1 || {
    tail -20 /tmp/spotd-apt.log >&2
    echo "deps.sh: apt-get install failed (log: /tmp/spotd-apt.log)" >&2
    exit 1
  }
fi
