#!/usr/bin/env bash
# store_many_files.sh - what a checkpoint of many small files costs spotctl:
# peak RSS and wall time of push and restore of N empty files (before
# the manifest work of README "Benchmarks", 300,000 empty files, a 28 MB manifest, cost 424 MiB RSS and 57 s). Not a
# test: it reports, it asserts nothing.
#
#   bench/store_many_files.sh [BUILD_DIR] [N] [SIZE]
#
# SIZE: bytes of random data per file (default 0: empty files; README
# "Benchmarks" measures packing with 5000 x 4096). $PUSH_ARGS are extra `spotctl push` arguments
# (e.g. PUSH_ARGS="--pack-threshold 0" for one object per file).
#
# Needs a running S3 server in the environment the integration tests use
# (SPOT_TEST_S3_ENDPOINT, SPOT_TEST_S3_BUCKET, AWS_* keys; e.g.
# `bash tests/s3server.sh start DIR; set -a; . DIR/env; set +a`). N defaults to 300000, in
# folders of 1000. Prints one line per step: step, files, exit status,
# peak RSS (MiB), wall time (s), and spotctl's last stderr line.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/.." && pwd)
BUILD=${1:-$SRC/build}
N=${2:-300000}
SIZE=${3:-0}
SPOTCTL=$BUILD/client/spotctl
[[ -x $SPOTCTL ]] || { echo "no $SPOTCTL: build first" >&2; exit 1; }
: "${SPOT_TEST_S3_ENDPOINT:?set the S3 test environment}"
: "${SPOT_TEST_S3_BUCKET:?set the S3 test environment}"
export AWS_ENDPOINT_URL=$SPOT_TEST_S3_ENDPOINT AWS_EC2_METADATA_DISABLED=true
WORK=$(mktemp -d /tmp/spotd-many-XXXXXX)
JOB="bench-many/$$-$(date +%s)/job"
URL="s3://$SPOT_TEST_S3_BUCKET/$JOB"
trap 'rm -rf "$WORK"' EXIT

/usr/bin/python3 - "$WORK/src" "$N" "$SIZE" <<'PY'
import os, sys
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    d = os.path.join(root, "d%04d" % (i // 1000))
    if i % 1000 == 0:
        os.makedirs(d)
    with open(os.path.join(d, "f%06d" % i), "wb") as f:
        f.write(os.urandom(size))
PY

measure() { # step, then the spotctl arguments
  local step=$1 st
  shift
  st=0
  /usr/bin/time -f "%M %e" -o "$WORK/time" "$SPOTCTL" "$@" \
    >"$WORK/out" 2>"$WORK/err" || st=$?
  read -r kb secs < <(tail -n 1 "$WORK/time") || true
  printf '%-8s files=%d exit=%d rss_mib=%.0f wall_s=%s  %s\n' "$step" "$N" \
    "$st" "$(echo "${kb:-0} / 1024" | bc -l)" "${secs:-?}" \
    "$(tail -n 1 "$WORK/err" | cut -c1-120)"
}

# shellcheck disable=SC2086 # PUSH_ARGS is a list of words
measure push push "$WORK/src" "$URL" --name many ${PUSH_ARGS:-}
measure restore restore "$URL" "$WORK/dst" --name many
/usr/bin/python3 - "$SPOT_TEST_S3_BUCKET" "$JOB/" <<'PY'
import sys, boto3, os
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["SPOT_TEST_S3_ENDPOINT"],
                  config=Config(s3={"addressing_style": "path"}))
for p in s3.get_paginator("list_objects_v2").paginate(Bucket=sys.argv[1], Prefix=sys.argv[2]):
    for o in p.get("Contents", []):
        s3.delete_object(Bucket=sys.argv[1], Key=o["Key"])
PY
