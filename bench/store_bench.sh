#!/usr/bin/env bash
# store_bench.sh - spotctl push/restore against the tools users use today,
# in one run against a local Ceph RGW (tests/s3server.sh, started and
# stopped here). Not a test: it reports, it asserts nothing.
#
#   bench/store_bench.sh [BUILD_DIR]
#
# Environment:
#   BENCH_SIZE_MB   fp32 checkpoint size (weights + Adam m + Adam v), 1024
#   BENCH_BF16_MB   bf16 set size, 256
#   BENCH_RUNS      runs per tool (median reported), 3
#   BENCH_WORK      scratch folder (data, server), /tmp/spotd-store-bench
#
# Measured per run, same data, warm server (one upload first): wall time
# and peak RSS (/usr/bin/time -f %M) of
#   push:    spotctl push DIR | aws s3 cp --recursive DIR |
#            tar -cf - DIR | zstd -T0 -1 | aws s3 cp - URL
#   restore: spotctl restore | aws s3 cp --recursive |
#            aws s3 cp URL - | zstd -d | tar -x
# (a pipeline's RSS is the sum of its processes' peaks), the compression
# ratio of spotd and of zstd -1 on fp32+Adam and on bf16, and the push
# pipeline's own ceiling against a discarding endpoint (bench/s3_discard.py).
# Writes bench/results/store.md and bench/results/store.png.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/.." && pwd)
BUILD=${1:-$SRC/build}
SPOTCTL=$BUILD/client/spotctl
SIZE_MB=${BENCH_SIZE_MB:-1024}
BF16_MB=${BENCH_BF16_MB:-256}
RUNS=${BENCH_RUNS:-3}
WORK=${BENCH_WORK:-/tmp/spotd-store-bench}
PY=/usr/bin/python3
AWS=/usr/bin/aws
OUT=$HERE/results
[[ -x $SPOTCTL ]] || { echo "no $SPOTCTL: build first (ninja -C $BUILD)" >&2; exit 1; }
mkdir -p "$WORK" "$OUT"
CEPH=$WORK/ceph
DISCARD_PID=""

cleanup() {
  [[ -n $DISCARD_PID ]] && kill "$DISCARD_PID" 2>/dev/null || true
  bash "$SRC/tests/s3server.sh" stop "$CEPH" >/dev/null 2>&1 || true
  rm -rf "$WORK/data" "$WORK/restore"
}
trap cleanup EXIT

echo "== starting Ceph in $CEPH" >&2
bash "$SRC/tests/s3server.sh" start "$CEPH" >/dev/null
set -a; . "$CEPH/env"; set +a
export AWS_EC2_METADATA_DISABLED=true AWS_ENDPOINT_URL=$SPOT_TEST_S3_ENDPOINT
B=$SPOT_TEST_S3_BUCKET
EP=(--endpoint-url "$SPOT_TEST_S3_ENDPOINT")

echo "== generating ${SIZE_MB} MiB fp32+Adam and ${BF16_MB} MiB bf16" >&2
rm -rf "$WORK/data"; mkdir -p "$WORK/data/fp32" "$WORK/data/bf16"
$PY - "$WORK/data" "$SIZE_MB" "$BF16_MB" <<'PYEOF'
import sys, numpy as np
root, mb, bmb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(2024)
CH = 16 << 20  # values per chunk
def write(path, nbytes, gen, bf16=False):
    with open(path, "wb") as f:
        left = nbytes // (2 if bf16 else 4)
        while left > 0:
            n = min(CH, left)
            v = gen(n).astype(np.float32)
            if bf16:
                v = (v.view(np.uint32) >> 16).astype(np.uint16)
            v.tofile(f)
            left -= n
third = (mb << 20) // 3 // 4 * 4
# weights ~ N(0, 0.02); Adam first moment ~ N(0, 1e-3); second moment = g^2
write(root + "/fp32/model.pt", third, lambda n: rng.normal(0, 0.02, n))
write(root + "/fp32/adam_m.pt", third, lambda n: rng.normal(0, 1e-3, n))
write(root + "/fp32/adam_v.pt", third, lambda n: rng.normal(0, 1e-3, n) ** 2)
half = (bmb << 20) // 2 // 2 * 2
write(root + "/bf16/model.bf16", half, lambda n: rng.normal(0, 0.02, n), True)
write(root + "/bf16/adam_m.bf16", half, lambda n: rng.normal(0, 1e-3, n), True)
PYEOF
RAW=$(du -sb "$WORK/data/fp32" | cut -f1)
BRAW=$(du -sb "$WORK/data/bf16" | cut -f1)

# t LABEL CMD...: runs CMD under /usr/bin/time, appends "LABEL secs rss_kb"
RES=$WORK/results.txt
: >"$RES"
t() {
  local label=$1; shift
  local f=$WORK/time.$$
  /usr/bin/time -f "%e %M" -o "$f" "$@" >/dev/null
  echo "$label $(cat "$f")" >>"$RES"
}
# tp LABEL "A" "B" ["C"]: a pipeline; secs of the whole, RSS summed
tp() {
  local label=$1; shift
  local i=0 cmd="" start end rss=0
  for c in "$@"; do
    cmd+="${cmd:+ | }/usr/bin/time -f %M -o $WORK/rss.$i $c"
    i=$((i + 1))
  done
  start=$(date +%s.%N)
  bash -o pipefail -c "$cmd" >/dev/null
  end=$(date +%s.%N)
  for ((j = 0; j < i; j++)); do rss=$((rss + $(tail -1 "$WORK/rss.$j"))); done
  echo "$label $(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.2f", b-a}') $rss" >>"$RES"
}
wipe() { $AWS "${EP[@]}" s3 rm --recursive --quiet "s3://$B/bench/" >/dev/null 2>&1 || true; }

echo "== warming the server" >&2
$AWS "${EP[@]}" s3 cp --quiet "$WORK/data/bf16/model.bf16" "s3://$B/bench/warm/x"
"$SPOTCTL" push -q "$WORK/data/bf16" "s3://$B/bench/warm" --name w
wipe

for ((r = 1; r <= RUNS; r++)); do
  echo "== run $r/$RUNS" >&2
  rm -rf "$WORK/restore"; mkdir -p "$WORK/restore"
  t push_spotd "$SPOTCTL" push -q "$WORK/data/fp32" "s3://$B/bench/spot" --name "r$r"
  t push_aws $AWS "${EP[@]}" s3 cp --quiet --recursive "$WORK/data/fp32" "s3://$B/bench/aws/r$r/"
  tp push_zstd "tar -C $WORK/data -cf - fp32" "zstd -T0 -1 -q -c" \
    "$AWS ${EP[*]} s3 cp --quiet - s3://$B/bench/zpipe/r$r.tar.zst"
  sync
  t restore_spotd "$SPOTCTL" restore -q "s3://$B/bench/spot" "$WORK/restore/spot" --name "r$r"
  t restore_aws $AWS "${EP[@]}" s3 cp --quiet --recursive "s3://$B/bench/aws/r$r/" "$WORK/restore/aws/"
  mkdir -p "$WORK/restore/zpipe"
  tp restore_zstd "$AWS ${EP[*]} s3 cp --quiet s3://$B/bench/zpipe/r$r.tar.zst -" \
    "zstd -d -q -c" "tar -C $WORK/restore/zpipe -xf -"
  cmp -s "$WORK/data/fp32/model.pt" "$WORK/restore/spot/model.pt" ||
    { echo "restore differs!" >&2; exit 1; }
  ZSTORED=$($AWS "${EP[@]}" s3api head-object --bucket "$B" --key "bench/zpipe/r$r.tar.zst" \
    --query ContentLength --output text)
  wipe
done

echo "== ratios" >&2
"$SPOTCTL" list --json "s3://$B/bench/spot" >/dev/null 2>&1 || true
"$SPOTCTL" push -q "$WORK/data/fp32" "s3://$B/bench/ratio" --name fp32
"$SPOTCTL" push -q "$WORK/data/bf16" "s3://$B/bench/ratio" --name bf16
"$SPOTCTL" list --json "s3://$B/bench/ratio" >"$WORK/ratio.json"
BZ=$(tar -C "$WORK/data" -cf - bf16 | zstd -T0 -1 -q -c | wc -c)
wipe

echo "== ceiling: push to a discarding endpoint" >&2
$PY "$HERE/s3_discard.py" >"$WORK/discard.port" &
DISCARD_PID=$!
for _ in $(seq 50); do [[ -s $WORK/discard.port ]] && break; sleep 0.1; done
DEP=http://127.0.0.1:$(cat "$WORK/discard.port")
for ((r = 1; r <= RUNS; r++)); do
  t ceiling_zstd "$SPOTCTL" push -q "$WORK/data/fp32" s3://discard/x/j --name "c$r" \
    --endpoint "$DEP" --compress always
  t ceiling_raw "$SPOTCTL" push -q "$WORK/data/fp32" s3://discard/x/j --name "c$r" \
    --endpoint "$DEP" --compress never
done
# the pipeline's own CPU cost, whatever the server
/usr/bin/time -f "%U %S" -o "$WORK/cpu" "$SPOTCTL" push -q "$WORK/data/fp32" \
  s3://discard/x/j --name cpu --endpoint "$DEP" --compress always
kill "$DISCARD_PID"; wait "$DISCARD_PID" 2>/dev/null || true; DISCARD_PID=""

$PY "$HERE/store_report.py" "$RES" "$WORK/ratio.json" "$RAW" "$BRAW" "$ZSTORED" "$BZ" \
  "$WORK/cpu" "$(nproc)" "$OUT/store.md" "$OUT/store.png"
cat "$OUT/store.md"
