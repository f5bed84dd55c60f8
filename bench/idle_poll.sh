#!/bin/sh
# Idle cost of the metadata poller: lib/meta (through the meta_watch driver)
# polling spotd-emulate at 1 Hz for N minutes, with CPU time and RSS
# sampled every 10 s from /proc. Not run in CI.
#
#   bench/idle_poll.sh [MINUTES] [aws|gcp|azure]     (default 10 aws)
#   BUILD=build-dir bench/idle_poll.sh 2 gcp
#
# Prints one line per sample and a summary: CPU as a percentage of one
# core (target < 0.1%) and RSS first/last/max (target: no growth).
set -eu

MINUTES=${1:-10}
PROVIDER=${2:-aws}
BUILD=${BUILD:-build}
EMULATE=$BUILD/emulate/spotd-emulate
WATCH=$BUILD/tests/integration/meta_watch
TMP=$(mktemp -d)
EMU_PID=
WATCH_PID=

cleanup() {
  [ -n "$WATCH_PID" ] && kill "$WATCH_PID" 2>/dev/null || true
  [ -n "$EMU_PID" ] && kill "$EMU_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

"$EMULATE" --provider "$PROVIDER" --port 0 >"$TMP/emu.out" 2>&1 &
EMU_PID=$!
i=0
while ! grep -q '^listening on ' "$TMP/emu.out"; do
  i=$((i + 1))
  [ $i -gt 100 ] && { echo "emulator did not start" >&2; exit 1; }
  sleep 0.1
done
URL=$(sed -n 's/^listening on //p' "$TMP/emu.out")

"$WATCH" --provider "$PROVIDER" --url "$URL" --poll-ms 1000 \
  >"$TMP/watch.out" 2>"$TMP/watch.err" &
WATCH_PID=$!
sleep 2

hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$WATCH_PID/stat"; }
rss() { awk '/^VmRSS/ {print $2}' "/proc/$WATCH_PID/status"; }

t0=$(date +%s.%N)
c0=$(ticks)
r0=$(rss)
rmax=$r0
samples=$((MINUTES * 6))
n=0
echo "provider=$PROVIDER minutes=$MINUTES poll=1s url=$URL"
while [ $n -lt $samples ]; do
  sleep 10
  n=$((n + 1))
  r=$(rss)
  [ "$r" -gt "$rmax" ] && rmax=$r
  echo "t=$((n * 10))s cpu_ticks=$(($(ticks) - c0)) rss_kib=$r"
done
t1=$(date +%s.%N)
c1=$(ticks)
requests=$(grep -c . "$TMP/watch.err" || true)
awk -v c="$((c1 - c0))" -v hz="$hz" -v t0="$t0" -v t1="$t1" \
    -v r0="$r0" -v r1="$(rss)" -v rmax="$rmax" 'BEGIN {
  wall = t1 - t0; cpu = c / hz;
  printf "cpu: %.2f s over %.0f s wall = %.3f%% of one core\n", cpu, wall,
         100 * cpu / wall;
  printf "rss: first %d KiB, last %d KiB, max %d KiB (growth %d KiB)\n",
         r0, r1, rmax, r1 - r0;
}'
echo "log lines from the poller: $requests"
