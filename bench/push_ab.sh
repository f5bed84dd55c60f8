#!/usr/bin/env bash
# push_ab.sh - `spotctl push` of the same fp32 folder by several builds,
# alternating run by run (a loaded machine slows them alike), against the
# S3 of $SPOT_TEST_S3_ENDPOINT (source /work/ceph-shared.env or the like).
# Not a test: it reports, it asserts nothing.
#
#   bench/push_ab.sh BUILD_DIR... [-- SPOTCTL_PUSH_OPTIONS]
#
# Environment:
#   PUSH_AB_RUNS   runs per build (default 9); the median and every run
#   PUSH_AB_MIB    size of the folder in MiB (default 256: fp32 weights,
#                  Adam m and v, a third each, numpy N(0, 0.02) etc.)
#   PUSH_AB_WORK   scratch folder (default /tmp/spotd-push-ab)
# Each run pushes to a fresh job under $SPOT_TEST_S3_BUCKET/push-ab-PID/,
# removed after each round (outside the timing). Per build: wall, user +
# sys CPU (wait4, /usr/bin/time), as median (min-max).
set -euo pipefail

# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" "$@"
BUILDS=()
while [[ $# -gt 0 && $1 != -- ]]; do BUILDS+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift
[[ ${#BUILDS[@]} -ge 1 ]] || { echo "usage: $0 BUILD_DIR... [-- OPTIONS]" >&2; exit 2; }
: "${SPOT_TEST_S3_ENDPOINT:?source the S3 env first}" "${SPOT_TEST_S3_BUCKET:?}"
RUNS=${PUSH_AB_RUNS:-9}
MIB=${PUSH_AB_MIB:-256}
WORK=${PUSH_AB_WORK:-/tmp/spotd-push-ab}
PY=/usr/bin/python3
ROOT=push-ab-$$
export AWS_EC2_METADATA_DISABLED=true
mkdir -p "$WORK"
rm -rf "$WORK/data" "$WORK"/times.*
$PY - "$WORK/data" "$MIB" <<'PYEOF'
import os, sys, numpy as np
root, mib = sys.argv[1], int(sys.argv[2])
os.makedirs(root)
n = (mib << 20) // 4 // 3
rng = np.random.default_rng(1)
for name, scale in (("model.bin", 0.02), ("adam_m.bin", 1e-3)):
    a = rng.standard_normal(n, dtype=np.float32) * np.float32(scale)
    a.tofile(os.path.join(root, name))
    if name == "adam_m.bin":
        (a * a).tofile(os.path.join(root, "adam_v.bin"))
PYEOF
wipe() {
  /usr/bin/aws --endpoint-url "$SPOT_TEST_S3_ENDPOINT" s3 rm --recursive \
    --quiet "s3://$SPOT_TEST_S3_BUCKET/$ROOT/" >/dev/null 2>&1 || true
}
trap wipe EXIT
# a warm-up push per build (the first upload to a server is slower)
for b in "${BUILDS[@]}"; do
  "$b/client/spotctl" push "$WORK/data" "s3://$SPOT_TEST_S3_BUCKET/$ROOT/warm" \
    --endpoint "$SPOT_TEST_S3_ENDPOINT" -n "w$(echo "$b" | md5sum | cut -c1-8)" -q "$@"
done
wipe
for i in $(seq "$RUNS"); do
  for k in "${!BUILDS[@]}"; do
    b=${BUILDS[$k]}
    /usr/bin/time -f "%e %U %S %R %w" -o "$WORK/t" "$b/client/spotctl" push \
      "$WORK/data" "s3://$SPOT_TEST_S3_BUCKET/$ROOT/b$k-r$i" \
      --endpoint "$SPOT_TEST_S3_ENDPOINT" -n "step-$(printf %06d "$i")" -q "$@"
    tail -1 "$WORK/t" >>"$WORK/times.$k"
    echo "run $i $b: $(tail -1 "$WORK/t") (wall user sys minflt vcsw), load $(cut -d' ' -f1 /proc/loadavg)" >&2
  done
  wipe
done
echo "push of $MIB MiB fp32, $RUNS alternating runs, options: ${*:-none}; load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| build | wall s median (min-max) | CPU-s median (min-max) | user s | sys s | minor faults | voluntary switches | every wall |"
echo "|---|---|---|---|---|---|---|---|"
for k in "${!BUILDS[@]}"; do
  $PY - "${BUILDS[$k]}" "$WORK/times.$k" <<'PYEOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[2]) if l.strip()]
w = [r[0] for r in rows]
c = [r[1] + r[2] for r in rows]
med = statistics.median
print("| %s | %.2f (%.2f-%.2f) | %.2f (%.2f-%.2f) | %.2f | %.2f | %d | %d | %s |" % (
    sys.argv[1], med(w), min(w), max(w), med(c), min(c), max(c),
    med(r[1] for r in rows), med(r[2] for r in rows),
    med(r[3] for r in rows), med(r[4] for r in rows),
    ", ".join("%.2f" % x for x in w)))
PYEOF
done
