#!/usr/bin/env bash
# s3_mem_smoke.sh - shows that bench/s3_mem answers what spotd and spotctl
# need before its figures are trusted: spotctl push, list and restore (the
# restored folder compared with the pushed one), the job lease taken and a
# second --no-wait taker refused, and one `spotd run` with the fake
# trainer, so the store check, the lease, the push, the commit and the
# LATEST compare-and-swap (If-Match) all go through. Loopback only. A bench
# tool's check, not part of the test suite.
#
#   bench/s3_mem_smoke.sh [BUILD_DIR]     (default: build)
#
# S3MEM_SMOKE_KEEP=1 keeps the scratch folder and its logs.
# Prints one line per step and "s3_mem smoke: OK" at the end; exits 1 at
# the first step that fails, with its output.
set -euo pipefail

# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" "$@"
BUILD=$(cd "${1:-$SRC/build}" && pwd)
SPOTCTL=$BUILD/client/spotctl
SPOTD=$BUILD/daemon/spotd
S3MEM=$BUILD/bench/s3_mem
for x in "$SPOTCTL" "$SPOTD" "$S3MEM"; do
  [[ -x $x ]] || { echo "no $x: build first (ninja -C $BUILD)" >&2; exit 1; }
done
WORK=$(mktemp -d /tmp/s3_mem_smoke.XXXXXX)
MEM_PID=""
cleanup() {
  [[ -n $MEM_PID ]] && kill "$MEM_PID" 2>/dev/null && wait "$MEM_PID" 2>/dev/null
  if [[ -n ${S3MEM_SMOKE_KEEP:-} ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# s3_mem checks no signature; spotctl still signs, so it needs some keys
export AWS_ACCESS_KEY_ID=s3mem AWS_SECRET_ACCESS_KEY=s3mem-secret
export AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
unset AWS_PROFILE AWS_SESSION_TOKEN

"$S3MEM" >"$WORK/port" 2>"$WORK/s3_mem.log" &
MEM_PID=$!
for _ in $(seq 50); do [[ -s $WORK/port ]] && break; sleep 0.1; done
[[ -s $WORK/port ]] || { echo "s3_mem did not start" >&2; exit 1; }
AWS_ENDPOINT_URL=http://127.0.0.1:$(cat "$WORK/port")
export AWS_ENDPOINT_URL
STORE=s3://smoke/jobs
fail() { echo "FAIL: $1" >&2; [[ -f ${2:-} ]] && tail -30 "$2" >&2; exit 1; }
step() { echo "ok: $1"; }

# a small folder: one file over a part (multipart), a few small ones
# (packed), an empty one, a nested one
mkdir -p "$WORK/src/step-000100/sub"
head -c $((40 << 20)) /dev/urandom >"$WORK/src/step-000100/big.bin"
for i in 1 2 3; do echo "small $i" >"$WORK/src/step-000100/sub/s$i.txt"; done
: >"$WORK/src/step-000100/empty"
"$SPOTCTL" push "$WORK/src/step-000100" "$STORE/a" --part-size 8M \
  >"$WORK/push.log" 2>&1 || fail "spotctl push" "$WORK/push.log"
step "spotctl push (multipart, packed small files, an empty file)"

"$SPOTCTL" list "$STORE/a" >"$WORK/list.log" 2>&1 || fail "spotctl list" "$WORK/list.log"
grep -q step-000100 "$WORK/list.log" || fail "spotctl list names no step-000100" "$WORK/list.log"
step "spotctl list"

"$SPOTCTL" restore "$STORE/a" "$WORK/restored" >"$WORK/restore.log" 2>&1 ||
  fail "spotctl restore" "$WORK/restore.log"
diff -r "$WORK/src/step-000100" "$WORK/restored" >"$WORK/diff.log" 2>&1 ||
  fail "the restored folder differs from the pushed one" "$WORK/diff.log"
step "spotctl restore: same files"

"$SPOTCTL" lease "$STORE/a" --owner first --ttl 60 --no-wait \
  >"$WORK/lease1.log" 2>&1 || fail "spotctl lease (first)" "$WORK/lease1.log"
rc=0
"$SPOTCTL" lease "$STORE/a" --owner second --ttl 60 --no-wait \
  >"$WORK/lease2.log" 2>&1 || rc=$?
[[ $rc == 3 ]] || fail "a second --no-wait lease exited $rc, not 3 (refused)" "$WORK/lease2.log"
step "spotctl lease: taken, a second owner refused (exit 3)"

# spotd run: the fake trainer checkpoints at steps 5 and 10 on its own and
# exits at step 12; spotd checks the store, takes the lease, uploads and
# commits both, LATEST created and then moved (If-Match), and exits with
# the trainer
rc=0
timeout 300 "$SPOTD" run --job b --store "$STORE" --ckpt-dir "$WORK/ckpt" \
  --socket "$WORK/spotd.sock" --provider none --interval 0 -- \
  /usr/bin/python3 "$SRC/tests/integration/fake_trainer.py" \
  --log "$WORK/trainer.jsonl" --every 5 --exit-at 12 --step-sleep 0.1 \
  --bytes $((20 << 20)) >"$WORK/spotd.log" 2>&1 || rc=$?
[[ $rc == 0 ]] || fail "spotd run exited $rc" "$WORK/spotd.log"
grep -q 'write, read and delete work' "$WORK/spotd.log" ||
  fail "spotd logged no store check" "$WORK/spotd.log"
"$SPOTCTL" list "$STORE/b" >"$WORK/list_b.log" 2>&1 || fail "spotctl list b" "$WORK/list_b.log"
for n in 5 10; do
  grep -q "committed checkpoint name=step-0000$(printf %02d $n)" "$WORK/spotd.log" ||
    fail "spotd did not commit step $n" "$WORK/spotd.log"
done
grep -q step-000010 "$WORK/list_b.log" ||
  fail "spotd's checkpoint step-000010 is not listed" "$WORK/list_b.log"
"$SPOTCTL" restore "$STORE/b" "$WORK/restored_b" >"$WORK/restore_b.log" 2>&1 ||
  fail "spotctl restore of spotd's checkpoint" "$WORK/restore_b.log"
# the marker is the trainer's signal to spotd, not a file of the checkpoint
diff -r -x SPOTD_COMPLETE "$WORK/ckpt/step-000010" "$WORK/restored_b" \
  >"$WORK/diff_b.log" 2>&1 ||
  fail "spotd's checkpoint restored differs from what the trainer wrote" "$WORK/diff_b.log"
step "spotd run: store check, lease, two commits, LATEST moved; LATEST restored"

echo "s3_mem smoke: OK"
