#!/usr/bin/env bash
# daemon_bench.sh - runs bench/daemon_bench.py: spotd's notice-to-durable
# time against spotctl push and the AWS CLI, and spotd's idle cost, against
# a local Ceph RGW (tests/s3server.sh, started here and stopped at the end)
# and spotd-emulate. Only loopback traffic. Not a test: it reports.
#
#   bench/daemon_bench.sh [--sizes 256M,1G,4G] [--quick] [--runs N]
#                         [--idle-minutes M] [--idle parallel|after|skip]
#                         [--no-notice] [--overlap on|off] [--write-mbps N]
#                         [--spotd-only] [--no-warm] [--prefix P]
#                         [--trainer fake|torch] [--python PY]
#
# --overlap off runs spotd with --overlap=false (upload only after the
# marker) to compare notice->durable with and without the overlap;
# --write-mbps makes the fake trainer write at most N MB/s (a trainer
# serializing as it goes); --spotd-only skips spotctl push and the aws
# tools after each run; --trainer torch saves a training state in torch
# tensors with torch.save instead of writing the fake trainer's bytes.
# spotd runs at --log-level debug: the report's breakdown of notice ->
# durable comes from the stamps of its log lines.
#
# Builds the project in .build-bench (meson, release) if needed.
# Environment: BENCH_WORK scratch folder (default /tmp/spotd-daemon-bench;
# needs about 3x the largest size free). Writes bench/results/daemon.md,
# daemon.png and daemon.json.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/.." && pwd)
BUILD=$SRC/.build-bench
WORK=${BENCH_WORK:-/tmp/spotd-daemon-bench}
CEPH=$WORK/ceph

if [[ ! -f $BUILD/build.ninja ]]; then
  meson setup "$BUILD" "$SRC" -Dbuildtype=release >/dev/null
fi
ninja -C "$BUILD" daemon/spotd client/spotctl emulate/spotd-emulate >/dev/null

mkdir -p "$WORK"
cleanup() { bash "$SRC/tests/s3server.sh" stop "$CEPH" >/dev/null 2>&1 || true; }
trap cleanup EXIT
echo "== starting Ceph in $CEPH" >&2
bash "$SRC/tests/s3server.sh" start "$CEPH" >/dev/null
set -a
# shellcheck source=/dev/null
. "$CEPH/env"
set +a
export AWS_EC2_METADATA_DISABLED=true
export AWS_ENDPOINT_URL=$SPOT_TEST_S3_ENDPOINT
/usr/bin/python3 "$HERE/daemon_bench.py" --build "$BUILD" --work "$WORK" \
  --ceph-dir "$CEPH" "$@"
