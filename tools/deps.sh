#!/bin/bash
# Installs the Debian 12 packages spotd needs. Only what is missing, so a
# second run costs a second. Usage: tools/deps.sh [--list] [build|test|demo|bench]...
# --list prints the packages of the sets, one a line, and installs nothing
# (tests/lint/programs.py checks against it that every program the tests
# and scripts run comes from an essential package or from these).
set -euo pipefail
list=0
if [ "${1:-}" = --list ]; then
  list=1
  shift
fi

build_pkgs=(meson ninja-build pkg-config gcc libc6-dev libuv1-dev
  libcurl4-openssl-dev libzstd-dev libjansson-dev libexpat1-dev libinih-dev
  libsystemd-dev libssl-dev libmicrohttpd-dev libcmocka-dev zstd
  libcairo2-dev)
# Ceph RGW is the real S3 server of the tests; boto3 the independent reader;
# procps: tests/s3server.sh asks ps for its process group.
s3_pkgs=(ceph-mon ceph-osd radosgw ceph-common ceph-base uuid-runtime
  python3-boto3 curl procps)
# time: /usr/bin/time -f %M, the peak RSS of the memory tests; procps: ps;
# clang-format: the format lint; git: the lint's file list (git ls-files);
# python3-venv: the Python helper installed with pip into a venv.
# tests/lint/programs.py fails when a test runs a program from elsewhere.
test_pkgs=(valgrind clang clang-tidy clang-format cppcheck libclang-rt-14-dev
  python3-torch slurm-wlm munge systemd-container awscli iproute2
  python3-prometheus-client python3-pil python3-yaml nodejs time procps git
  python3-venv)
# What the frameworks archive of the framework tests (transformers,
# Lightning: tools/test, $SPOTD_TEST_FRAMEWORKS) imports from Debian.
test_pkgs+=(python3-tqdm python3-packaging python3-fsspec python3-filelock python3-regex python3-psutil python3-typing-extensions python3-requests python3-setuptools)
demo_pkgs=(python3-torch)
# bench/: the pictures and the peers (aws s3 cp, its CRT client) it
# measures; time and bc for the peak RSS and the sums of its scripts.
bench_pkgs=(python3-matplotlib python3-numpy awscli time bc)

want=()
k8s=0
for what in "${@:-build}"; do
  case "$what" in
  build) want+=("${build_pkgs[@]}") ;;
  s3) want+=("${s3_pkgs[@]}") ;;
  test) want+=("${build_pkgs[@]}" "${s3_pkgs[@]}" "${test_pkgs[@]}") k8s=1 ;;
  demo) want+=("${build_pkgs[@]}" "${s3_pkgs[@]}" "${demo_pkgs[@]}") ;;
  bench) want+=("${build_pkgs[@]}" "${s3_pkgs[@]}" "${bench_pkgs[@]}") ;;
  *) echo "deps.sh: unknown set '$what'" >&2; exit 2 ;;
  esac
done

# The Kubernetes manifests' schema validator (deploy/kubernetes/check.py):
# the npm package kubernetes-models, pinned, into the ignored .build-test/k8s.
k8s_models() {
  local dir
  dir="$(cd "$(dirname "$0")/.." && pwd)/.build-test/k8s"
  [ -f "$dir/node_modules/kubernetes-models/package.json" ] &&
    grep -q '"version": "5.1.0"' "$dir/node_modules/kubernetes-models/package.json" &&
    return 0
  # Debian's nodejs comes without npm; a nodejs that bundles it conflicts
  # with the npm package.
  command -v npm >/dev/null ||
    apt-get -o DPkg::Lock::Timeout=600 -q -y install npm >>/tmp/spotd-apt.log 2>&1 || {
    echo "deps.sh: npm is missing and could not be installed" >&2
    exit 1
  }
  mkdir -p "$dir"
  echo "installing kubernetes-models@5.1.0 into $dir"
  npm install --prefix "$dir" --no-audit --no-fund --no-save \
    kubernetes-models@5.1.0 >/tmp/spotd-npm.log 2>&1 || {
    tail -20 /tmp/spotd-npm.log >&2
    echo "deps.sh: npm install kubernetes-models failed (log: /tmp/spotd-npm.log)" >&2
    exit 1
  }
}

if [ "$list" = 1 ]; then
  printf '%s\n' "${want[@]}" | sort -u
  [ "$k8s" = 0 ] || echo npm
  exit 0
fi

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  [ "$k8s" = 0 ] || k8s_models
  exit 0
fi

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
[ "$k8s" = 0 ] || k8s_models
