#!/usr/bin/env bash
# node_bench.sh - the data path at node scale: `spotctl push` of a
# real-shaped checkpoint to bench/s3_sink (discards; the push ceiling) and
# to bench/s3_mem (holds it in RAM), and `spotctl restore` from s3_mem, with
# no Ceph taking the CPU. Runs on any Linux box (a GPU host included); only
# loopback traffic. Not a test: it reports, it asserts nothing.
#
#   bench/node_bench.sh [BUILD_DIR]
#
# BUILD_DIR defaults to .build-bench, set up here as a release build.
# Environment:
#   NODE_BENCH_GIB     size of each checkpoint set in GiB (default 4)
#   NODE_BENCH_MEMORY  spotctl --memory (default 1G, spotctl's own)
#   NODE_BENCH_RUNS    runs of each measurement, the median reported (3)
#   NODE_BENCH_WORK    scratch folder (default /tmp/spotd-node-bench;
#                      needs 3x NODE_BENCH_GIB free, and RAM for one set)
#   NODE_BENCH_OUT     report (default bench/results/node.md)
#   NODE_BENCH_NOTE    a sentence about the machine's load, put in the report
#
#   NODE_BENCH_PY      the python for the generator and the trainer
#                      (default /usr/bin/python3)
#   NODE_BENCH_TIME    the timer: /usr/bin/time (the default when it is
#                      there) or bench/timecmd.py (the same figures from
#                      wait4(2), for a machine without it)
#
# On a machine without the build's libraries (the GPU host), run it on a
# kit of bench/node_kit.sh: bench/node_bench.sh KIT.
#
# Two sets: fp32 (weights, Adam m and v, a third each) and bf16 (the same
# three in bf16), generated with numpy like bench/store_bench.sh. For each:
# push to the sink, push to s3_mem, restore from s3_mem (compared with the
# source). Measured with /usr/bin/time: wall, user + sys CPU (CPU-s per GiB
# of checkpoint), the share of the machine's cores busy with spotctl
# (CPU-s / (wall x nproc)), peak RSS against --memory; the server's own
# CPU from /proc. The source files are in the page cache (just written).
# Then notice -> durable against s3_mem: spotd runs a trainer that saves
# an fp32 training state of NODE_BENCH_GIB (torch.save when the python has
# torch, else bench/daemon_bench.py's fake trainer) and spotd-emulate
# posts a notice (bench/daemon_bench.py --spotd-only, the breakdown of
# the time from spotd's log).
set -euo pipefail

# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" "$@"
BUILD=${1:-$SRC/.build-bench}
GIB=${NODE_BENCH_GIB:-4}
MEMORY=${NODE_BENCH_MEMORY:-1G}
WORK=${NODE_BENCH_WORK:-/tmp/spotd-node-bench}
OUT=${NODE_BENCH_OUT:-$HERE/results/node.md}
NOTE=${NODE_BENCH_NOTE:-}
RUNS=${NODE_BENCH_RUNS:-3}
PY=${NODE_BENCH_PY:-/usr/bin/python3}
TIME=${NODE_BENCH_TIME:-/usr/bin/time}
[[ -x $TIME || -n ${NODE_BENCH_TIME:-} ]] || TIME=$HERE/timecmd.py
[[ $GIB =~ ^[0-9]+$ && $GIB -ge 1 ]] ||
  { echo "NODE_BENCH_GIB must be a whole number of GiB >= 1, not '$GIB'" >&2; exit 2; }
[[ $RUNS =~ ^[0-9]+$ && $RUNS -ge 1 ]] ||
  { echo "NODE_BENCH_RUNS must be a whole number >= 1, not '$RUNS'" >&2; exit 2; }
[[ -x $TIME || $TIME == *timecmd.py ]] ||
  { echo "no timer $TIME (Debian: apt-get install time)" >&2; exit 1; }
$PY -c 'import numpy' 2>/dev/null ||
  { echo "needs numpy for $PY (Debian: apt-get install python3-numpy)" >&2; exit 1; }

if [[ $# -eq 0 && ! -f $BUILD/build.ninja ]]; then
  meson setup "$BUILD" "$SRC" -Dbuildtype=release >/dev/null
fi
if [[ -f $BUILD/build.ninja ]]; then
  ninja -C "$BUILD" client/spotctl bench/s3_sink bench/s3_mem daemon/spotd \
    emulate/spotd-emulate >/dev/null
fi
SPOTCTL=$BUILD/client/spotctl
for x in "$SPOTCTL" "$BUILD/bench/s3_sink" "$BUILD/bench/s3_mem"; do
  [[ -x $x ]] || { echo "no $x: build first (ninja -C $BUILD)" >&2; exit 1; }
done

mkdir -p "$WORK"
SERVER_PID=""
stop_server() {
  if [[ -n $SERVER_PID ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
  fi
}
cleanup() {
  stop_server
  rm -rf "$WORK/data" "$WORK/restore" "$WORK/n2d"/run-* "$WORK/n2d"/cache
}
trap cleanup EXIT

export AWS_ACCESS_KEY_ID=nodebench AWS_SECRET_ACCESS_KEY=nodebench-secret
export AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL_S3

# starts s3_sink or s3_mem (with its arguments), sets SERVER_PID and
# AWS_ENDPOINT_URL
start_server() {
  rm -f "$WORK/port"
  "$BUILD/bench/$1" "${@:2}" >"$WORK/port" 2>"$WORK/$1.log" &
  SERVER_PID=$!
  # s3_mem touches its arena first: about 1-2 s per GiB on a small VM
  for _ in $(seq 1200); do [[ -s $WORK/port ]] && break; sleep 0.1; done
  [[ -s $WORK/port ]] || { echo "$1 did not start" >&2; exit 1; }
  AWS_ENDPOINT_URL=http://127.0.0.1:$(cat "$WORK/port")
  export AWS_ENDPOINT_URL
}

# the server's user + sys CPU seconds so far
server_cpu() {
  awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$SERVER_PID/stat"
}

NPROC=$(nproc)
MODEL=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
[[ -n $MODEL ]] || MODEL=$(uname -m)
MEM_GIB=$(awk '/^MemTotal/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo)
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
KERNEL=$(uname -r)
GPUS=""
if command -v nvidia-smi >/dev/null; then
  GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort |
    uniq -c | awk '{ c = $1; $1 = ""; printf "%s%d x%s", (NR > 1 ? ", " : ""), c, $0 }' || true)
fi

echo "== generating $GIB GiB fp32 + Adam and $GIB GiB bf16 in $WORK/data" >&2
rm -rf "$WORK/data" "$WORK/restore"
mkdir -p "$WORK/data/fp32" "$WORK/data/bf16"
$PY - "$WORK/data" "$GIB" <<'PYEOF'
import sys, numpy as np
root, gib = sys.argv[1], int(sys.argv[2])
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
third = (gib << 30) // 3 // 4 * 4
# weights ~ N(0, 0.02); Adam first moment ~ N(0, 1e-3); second moment = g^2
for d, bf in (("fp32", False), ("bf16", True)):
    ext = "bf16" if bf else "pt"
    write(f"{root}/{d}/model.{ext}", third, lambda n: rng.normal(0, 0.02, n), bf)
    write(f"{root}/{d}/adam_m.{ext}", third, lambda n: rng.normal(0, 1e-3, n), bf)
    write(f"{root}/{d}/adam_v.{ext}", third, lambda n: rng.normal(0, 1e-3, n) ** 2, bf)
PYEOF

rm -f "$WORK"/rows.*
# timed FILE CMD...: runs CMD; FILE gets "wall user sys maxrss-KiB"
timed() {
  local out=$1
  shift
  if [[ $TIME == *timecmd.py ]]; then
    "$PY" "$TIME" -o "$out" "$@"
  else
    "$TIME" -o "$out" -f '%e %U %S %M' "$@"
  fi
}

# run OP SET TARGET CMD...: one measured spotctl run; its table row goes
# to $WORK/rows.OP.SET.TARGET after its wall time
run() {
  local op=$1 set=$2 target=$3 bytes wall user sys rss cpu0 cpu1
  shift 3
  bytes=$(du -sb "$WORK/data/$set" | cut -f1)
  cpu0=$(server_cpu)
  if ! timed "$WORK/time" "$@" >"$WORK/run.log" 2>&1; then
    echo "$op $set ($target) failed:" >&2
    tail -20 "$WORK/run.log" >&2
    exit 1
  fi
  cpu1=$(server_cpu)
  read -r wall user sys rss <"$WORK/time"
  $PY - "$op" "$set" "$target" "$bytes" "$wall" "$user" "$sys" "$rss" \
    "$NPROC" "$cpu0" "$cpu1" >>"$WORK/rows.$op.$set.$target" <<'PYEOF'
import sys
op, st, target = sys.argv[1:4]
b, wall, user, sys_, rss, nproc, c0, c1 = map(float, sys.argv[4:12])
gib = b / (1 << 30)
cpu = user + sys_
wall = max(wall, 0.01)
print("%.2f\t| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f %% | %.0f | %.2f |" % (
    wall, op, st, target, gib, wall, b / 1e9 / wall, cpu, cpu / gib,
    100 * cpu / (wall * nproc), rss / 1024, (c1 - c0) / gib))
PYEOF
  tail -1 "$WORK/rows.$op.$set.$target" | cut -f2 >&2
}

for set in fp32 bf16; do
  for i in $(seq "$RUNS"); do
    echo "== $set, run $i of $RUNS: push to s3_sink" >&2
    start_server s3_sink
    run push "$set" s3_sink "$SPOTCTL" push "$WORK/data/$set" \
      "s3://bench/node/$set" --memory "$MEMORY" -q
    stop_server

    echo "== $set, run $i of $RUNS: push to s3_mem, restore from it" >&2
    # an arena for the set (it compresses to less) and the store's small
    # objects: no page faults while measured
    start_server s3_mem --arena "$((GIB + 1))G"
    run push "$set" s3_mem "$SPOTCTL" push "$WORK/data/$set" \
      "s3://bench/node/$set" --memory "$MEMORY" -q
    rm -rf "$WORK/restore"
    run restore "$set" s3_mem "$SPOTCTL" restore "s3://bench/node/$set" \
      "$WORK/restore"
    if ! diff -r "$WORK/data/$set" "$WORK/restore" >/dev/null; then
      echo "the $set restore differs from its source" >&2
      exit 1
    fi
    rm -rf "$WORK/restore"
    # the same into the page cache (--page-cache: what a trainer started
    # next reads from memory; the default writes whole blocks O_DIRECT)
    run restore-pc "$set" s3_mem "$SPOTCTL" restore "s3://bench/node/$set" \
      "$WORK/restore" --page-cache
    if ! diff -r "$WORK/data/$set" "$WORK/restore" >/dev/null; then
      echo "the $set --page-cache restore differs from its source" >&2
      exit 1
    fi
    rm -rf "$WORK/restore"
    stop_server
  done
done

# notice -> durable against s3_mem: one daemon_bench.py notice run per
# run, each with a fresh s3_mem (the trainer's state is built in memory)
TRAINER=fake
$PY -c 'import torch' 2>/dev/null && TRAINER=torch
rm -rf "$WORK/n2d"
N2D_RUNS=$RUNS
if [[ ! -x $BUILD/daemon/spotd || ! -x $BUILD/emulate/spotd-emulate ]]; then
  echo "== no spotd or spotd-emulate in $BUILD: notice->durable not run" >&2
  N2D_RUNS=0
fi
for i in $(seq "$N2D_RUNS"); do
  echo "== notice->durable, run $i of $RUNS: spotd, a $TRAINER trainer, s3_mem" >&2
  start_server s3_mem --arena "$((GIB + 1))G"
  if ! SPOT_TEST_S3_ENDPOINT=$AWS_ENDPOINT_URL SPOT_TEST_S3_BUCKET=bench \
    "$PY" "$HERE/daemon_bench.py" --build "$BUILD" --work "$WORK/n2d" \
    --out "$WORK/n2d/r$i" --sizes "${GIB}G" --runs 1 --spotd-only \
    --idle skip --no-warm --trainer "$TRAINER" --python "$PY" \
    >"$WORK/n2d.log" 2>&1; then
    echo "notice->durable run $i failed:" >&2
    tail -20 "$WORK/n2d.log" >&2
    exit 1
  fi
  grep '^daemon_bench: .*detect' "$WORK/n2d.log" >&2 || true
  stop_server
done
N2D="| not run: no spotd or spotd-emulate in the build |"
[[ $N2D_RUNS -gt 0 ]] && N2D=$($PY - "$WORK/n2d" "$RUNS" <<'PYEOF'
import json, os, statistics, sys
root, runs = sys.argv[1], int(sys.argv[2])
rs = [json.load(open(os.path.join(root, "r%d" % i, "daemon.json")))["runs"][0]
      for i in range(1, runs + 1)]
def med(k):
    xs = [r[k] for r in rs if r.get(k) is not None]
    return statistics.median(xs) if xs else float("nan")
tail = med("t_tail")
print("| %.2f | %.2f | %.2f | %.2f | %.0f %% | %.2f | %.2f | %.2f | %s |" % (
    med("total"), med("detect"), med("save"), med("trainer_write"),
    100.0 * med("read_at_marker") / rs[0]["size"], tail, med("t_drain"),
    med("t_final"), ", ".join("%.2f" % r["total"] for r in rs)))
PYEOF
)

# each measurement's median run by wall time, and every run's wall
ROWS=()
for set in fp32 bf16; do
  for m in push.$set.s3_sink push.$set.s3_mem restore.$set.s3_mem \
    restore-pc.$set.s3_mem; do
    f=$WORK/rows.$m
    row=$(sort -g -k1,1 "$f" | sed -n "$(((RUNS + 1) / 2))p" | cut -f2)
    walls=$(cut -f1 "$f" | paste -sd' ')
    ROWS+=("$row ${walls// /, } |")
  done
done

mkdir -p "$(dirname "$OUT")"
{
  echo "# The data path at node scale (bench/node_bench.sh)"
  echo
  echo "spotctl push of a real-shaped checkpoint to \`bench/s3_sink\` (a C"
  echo "server that discards every body: the push ceiling) and to"
  echo "\`bench/s3_mem\` (a C server that keeps every object in RAM), and"
  echo "spotctl restore from s3_mem (the restored folder compared with the"
  echo "source; \`restore\` is the default, whole blocks written O_DIRECT,"
  echo "\`restore-pc\` the same with \`--page-cache\`, leaving the files in the"
  echo "page cache), over loopback with no Ceph on the machine. Two sets of"
  echo "$GIB GiB each: fp32 weights + Adam m + Adam v, and the same three in"
  echo "bf16 (numpy, N(0, 0.02) weights, N(0, 1e-3) m, its square as v)."
  echo "spotctl runs with its defaults (adaptive transfers in flight, the"
  echo "cores as compressing workers) and \`--memory $MEMORY\`; the median of"
  echo "$RUNS runs by wall time (every run's wall in the last column),"
  echo "the sources in the page cache. s3_mem stores the bodies in memory it"
  echo "reserved and touched before the run (\`--arena\`): on a VM, faulting"
  echo "pages in as bodies arrive costs the server more than spotctl's"
  echo "compression."
  echo
  echo "## The machine"
  echo
  echo "- $NPROC cores: $MODEL"
  echo "- RAM $MEM_GIB GiB; Linux $KERNEL"
  [[ -n $GPUS ]] && echo "- GPUs: $GPUS"
  echo "- load average when the run began: $LOAD"
  [[ -n $NOTE ]] && echo "- $NOTE"
  echo
  echo "## Figures"
  echo
  echo "GB/s: checkpoint bytes (10^9) per second of wall time. CPU: spotctl's"
  echo "user + sys. Cores busy: spotctl's CPU / (wall × $NPROC cores). The"
  echo "server's CPU is its own, on the same cores, per GiB."
  echo
  echo "| op | set | server | GiB | wall s | GB/s | CPU-s | CPU-s / GiB | cores busy | peak RSS MiB | server CPU-s / GiB | walls of the runs |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "## Notice to durable against s3_mem"
  echo
  echo "spotd runs a $TRAINER trainer (bench/daemon_bench.py \`--trainer"
  echo "$TRAINER\`) holding an fp32 training state of $GIB GiB (weights,"
  echo "Adam's two moments); spotd-emulate posts an AWS notice; on the"
  echo "signal the trainer saves model.pt and optim.pt, fsyncs them and"
  echo "writes SPOTD_COMPLETE; spotd uploads while it saves (overlap) and"
  echo "commits to s3_mem. Times from spotd's log stamps, the median of $RUNS"
  echo "runs: detect (notice -> signal), save (-> the marker seen; the"
  echo "trainer's, its write + fsync apart), what spotd had read by then,"
  echo "the tail after the marker and in it the files started before the"
  echo "marker being stored and the final walk."
  echo
  echo "| notice->durable s | detect s | save s | trainer write + fsync s | read while saving | tail s | of which storing the files started s | of which the final walk s | notice->durable of the runs |"
  echo "|---|---|---|---|---|---|---|---|---|"
  echo "$N2D"
  echo
  echo "Peak RSS is to be read against \`--memory $MEMORY\` (the part"
  echo "buffers' budget). A restore also writes the checkpoint to the local"
  echo "disk and syncs it (the servers hold no disk), so its wall includes"
  echo "the disk's write-back, which other jobs share on a shared machine."
  echo
  if [[ $NPROC -lt 16 || -z $GPUS ]]; then
    echo "## Not measured here: the 16-core GPU host"
    echo
    echo "The goals at node scale are for a 16-core GPU host: push >= 10 GB/s"
    echo "to the sink, restore >= 8 GB/s from s3_mem, notice->durable of 4 GB"
    echo "<= 10 s. This machine is not one ($NPROC cores${GPUS:+, }${GPUS:-, no GPU}),"
    echo "so these figures say what the data path costs per GiB and per core,"
    echo "not whether the goals are met. On such a host without the project's"
    echo "Debian libraries: \`bench/node_kit.sh\` here, then"
    echo "\`NODE_BENCH_PY=python3 bash bench/node_bench.sh .nodekit\` there."
  else
    echo "## Goals on this host"
    echo
    echo "push >= 10 GB/s to the sink, restore >= 8 GB/s from s3_mem,"
    echo "notice->durable of 4 GB <= 10 s (see the tables)."
  fi
} >"$OUT"
echo "== wrote $OUT" >&2
