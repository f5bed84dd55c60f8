#!/usr/bin/env bash
# slurm.sh - a throwaway single-node Slurm 22.05 cluster on loopback for
# tests, started directly (no systemd).
#
#   tests/slurm.sh start DIR        start; prints `export K=V` lines
#   tests/slurm.sh stop DIR         cancel its jobs, stop by DIR's pid files,
#                                   empty DIR
#   tests/slurm.sh run DIR -- CMD [ARGS...]
#                                   start, run CMD with the env, stop; exits
#                                   with CMD's status
#
# Everything lives under DIR: munged (run as user munge, with its own key,
# socket, seed, log and pid file under DIR/munge), slurm.conf, the
# controller's state, slurmd's spool, logs and pid files. slurmctld runs
# with -i (ignore any saved state), slurmd as node "localhost" with 2 CPUs;
# both on free non-default ports. On success DIR/env holds KEY=VALUE lines:
# SLURM_CONF, SPOT_TEST_SLURM_DIR, SPOT_TEST_SLURM_NODE (the node name).
#
# Daemons are only ever signalled through the pid files in DIR, and only if
# their command line still names DIR. Needs root (munged runs as munge,
# slurmd must be root to start jobs as their user).
#
# Environment knobs:
#   SLURM_TEST_TIMEOUT   seconds to wait for the node to be idle (default 30)
#   SLURM_TEST_KILLWAIT  KillWait: seconds between SIGTERM and SIGKILL when
#                        a job is stopped or requeued (default 30)
set -euo pipefail

readonly MARKER=.spotd-slurm
readonly PY=/usr/bin/python3
readonly PKGS=(slurm-wlm slurm-client munge)
readonly DAEMONS=(slurmd slurmctld munged) # stop order
readonly NODE=localhost
readonly CLAIMS="${TMPDIR:-/tmp}/spotd-slurm.ports"

log() { printf 'slurm: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

usage() {
  cat >&2 <<EOF
usage: $0 start DIR
       $0 stop DIR
       $0 run DIR -- CMD [ARGS...]
EOF
  exit 2
}

ensure_packages() {
  local missing=() p
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null |
      grep -q '^install ok installed$' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing ${missing[*]}"
  local apt=(apt-get -o DPkg::Lock::Timeout=600 install -y
    --no-install-recommends "${missing[@]}")
  DEBIAN_FRONTEND=noninteractive "${apt[@]}" >&2 ||
    { apt-get -o DPkg::Lock::Timeout=600 update >&2 &&
      DEBIAN_FRONTEND=noninteractive "${apt[@]}" >&2; } ||
    die "could not install ${missing[*]}"
}

# Absolute path of DIR (created if missing).
resolve_dir() {
  [[ -n $1 ]] || usage
  mkdir -p -- "$1"
  (cd -- "$1" && pwd -P)
}

# alive PID: exists and is not a zombie (a just-launched daemon may not
# have exec'd yet, so its command line is not checked).
alive() {
  local state
  state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}

# is_ours PID: alive (not a zombie) and started with a path under DIR.
is_ours() {
  local pid=$1 state cmd
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]] || return 1
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ " $cmd " == *" $DIR/slurm.conf "* || " $cmd " == *"=$DIR/munge/"* ]]
}

# Two free ports (slurmctld, slurmd), claimed under a lock until stop so
# that concurrent starts with different DIRs do not pick the same ones. A
# claim is stale once its DIR's marker no longer lists the port.
pick_ports() {
  mkdir -p "$CLAIMS"
  "$PY" - "$CLAIMS" "$DIR" "$MARKER" <<'EOF'
import fcntl, os, random, socket, sys
claims, mydir, marker = sys.argv[1:4]

def claimed(port):
    try:
        with open(os.path.join(claims, str(port))) as f:
            owner = f.read().strip()
        with open(os.path.join(owner, marker)) as f:
            return str(port) in f.read().split()
    except OSError:
        return False

def free(port):
    if claimed(port):
        return False
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()

lock = open(os.path.join(claims, ".lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX)
ports = [p for p in random.sample(range(26817, 27817), 200) if free(p)][:2]
if len(ports) < 2:
    sys.exit("no free port found")
with open(os.path.join(mydir, marker), "w") as f:
    f.write("%d %d\n" % tuple(ports))
for p in ports:
    with open(os.path.join(claims, str(p)), "w") as f:
        f.write(mydir + "\n")
print(*ports)
EOF
}

release_ports() {
  local p owner
  [[ -f $DIR/$MARKER ]] || return 0
  local ports=()
  read -r -a ports <"$DIR/$MARKER" || true
  for p in "${ports[@]}"; do
    [[ $p =~ ^[0-9]+$ ]] || continue
    owner=$(cat "$CLAIMS/$p" 2>/dev/null) || continue
    [[ $owner == "$DIR" ]] && rm -f "$CLAIMS/$p"
  done
  return 0
}

write_conf() {
  local ctld_port=$1 slurmd_port=$2
  cat >"$DIR/slurm.conf" <<EOF
# Generated by tests/slurm.sh for $DIR
ClusterName=spotdtest
SlurmctldHost=$NODE
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$DIR/plugstack.conf
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
JobRequeue=1
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
KillWait=${SLURM_TEST_KILLWAIT:-30}
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  : >"$DIR/plugstack.conf"
}

# launch NAME CMD...: start a daemon in the foreground in the background;
# its pid (not a wrapper's) goes to DIR/pids/NAME.
launch() {
  local name=$1
  shift
  if [[ ${SLURM_TEST_SAME_PGRP:-} == 1 ]]; then
    # run mode: stay in the caller's process group so that a group kill
    # (e.g. a test harness timeout) takes the daemons down too.
    "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
  else
    setsid "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
  fi
  echo $! >"$DIR/pids/$name"
}

dump_logs() {
  local f
  for f in "$DIR"/log/* "$DIR"/munge/munged.log; do
    [[ -s $f ]] || continue
    printf '%s\n' "----- tail of $f" >&2
    tail -n 15 "$f" >&2
  done
}

# cancel_jobs: scancel every job of this cluster and wait (up to KillWait +
# 15 s) for them to leave the node, so slurmd has reaped their steps.
cancel_jobs() {
  local ids deadline
  [[ -f $DIR/slurm.conf ]] || return 0
  local pid
  pid=$(cat "$DIR/pids/slurmctld" 2>/dev/null) || return 0
  is_ours "$pid" || return 0
  ids=$(SLURM_CONF=$DIR/slurm.conf timeout 10 squeue -h -o %i 2>/dev/null) ||
    return 0
  [[ -n $ids ]] || return 0
  # shellcheck disable=SC2086
  SLURM_CONF=$DIR/slurm.conf timeout 10 scancel $ids 2>/dev/null || true
  deadline=$((SECONDS + ${SLURM_TEST_KILLWAIT:-30} + 15))
  while ((SECONDS < deadline)); do
    ids=$(SLURM_CONF=$DIR/slurm.conf timeout 10 squeue -h -o %i 2>/dev/null) ||
      return 0
    [[ -z $ids ]] && return 0
    sleep 0.2
  done
  log "warning: jobs still there: $ids"
}

# stop_daemons: SIGTERM slurmd, slurmctld, then munged; SIGKILL any still
# there after 10 s.
stop_daemons() {
  local name pid deadline
  [[ -d $DIR/pids ]] || return 0
  for name in "${DAEMONS[@]}"; do
    pid=$(cat "$DIR/pids/$name" 2>/dev/null) || continue
    is_ours "$pid" || continue
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while ((SECONDS < deadline)) && is_ours "$pid"; do sleep 0.1; done
    if is_ours "$pid"; then
      log "SIGKILL to $name ($pid): did not stop on SIGTERM"
      kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 50); do is_ours "$pid" || break; sleep 0.1; done
    fi
  done
  for name in "${DAEMONS[@]}"; do
    pid=$(cat "$DIR/pids/$name" 2>/dev/null) || continue
    is_ours "$pid" && return 1
  done
  return 0
}

empty_dir() {
  release_ports
  find "$DIR" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +
}

cmd_stop() {
  DIR=$(resolve_dir "$1")
  local t0
  t0=$(now)
  if [[ ! -e $DIR/$MARKER ]]; then
    [[ -z $(ls -A -- "$DIR") ]] && return 0
    die "$DIR is not empty and was not made by $0; not touching it"
  fi
  cancel_jobs
  stop_daemons || die "some daemons under $DIR did not stop"
  empty_dir
  log "stopped in $(since "$t0") s"
}

start_failed() {
  local rc=$?
  trap - ERR INT TERM EXIT
  ((rc == 0)) && rc=1
  if ((rc == 130 || rc == 143)); then
    log "start interrupted; cleaning up"
  else
    log "start failed; logs follow"
    dump_logs
  fi
  stop_daemons || log "warning: some daemons did not stop"
  empty_dir
  exit "$rc"
}

# wait_for DAEMON WHAT SECONDS CMD...: poll CMD every 0.1 s until it
# succeeds; fail at once if DAEMON exited.
wait_for() {
  local daemon=$1 what=$2 secs=$3 deadline pid
  shift 3
  pid=$(cat "$DIR/pids/$daemon")
  deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    alive "$pid" || die "$daemon exited"
    ((SECONDS < deadline)) || die "$what not ready after $secs s"
    sleep 0.1
  done
}

node_idle() {
  local st
  st=$(SLURM_CONF=$DIR/slurm.conf timeout 5 sinfo -h -N -n "$NODE" -o %t) ||
    return 1
  [[ $st == idle ]]
}

cmd_start() {
  DIR=$(resolve_dir "$1")
  local t0 ports ctld_port slurmd_port m timeout=${SLURM_TEST_TIMEOUT:-30}
  t0=$(now)
  ((EUID == 0)) || die "needs root (munged runs as munge, slurmd as root)"
  ensure_packages
  if [[ -e $DIR/$MARKER ]]; then
    log "$DIR holds an old cluster; stopping it first"
    cmd_stop "$DIR"
  fi
  [[ -z $(ls -A -- "$DIR") ]] || die "$DIR is not empty"

  trap start_failed EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  : >"$DIR/$MARKER"
  ports=$(pick_ports) || die "cannot pick ports"
  read -r ctld_port slurmd_port <<<"$ports"
  # munged refuses a key or socket folder that others can write, and runs
  # as munge: DIR must be reachable by it.
  chmod 755 "$DIR"
  mkdir -p "$DIR"/{run,log,pids,state,spool}
  m=$DIR/munge
  install -d -m 755 -o munge -g munge "$m"
  setpriv --reuid munge --regid munge --init-groups \
    mungekey --create --keyfile "$m/munge.key" >/dev/null 2>&1 ||
    die "mungekey failed"
  write_conf "$ctld_port" "$slurmd_port"

  launch munged setpriv --reuid munge --regid munge --init-groups \
    munged --foreground --socket="$m/munge.socket" --key-file="$m/munge.key" \
    --pid-file="$m/munged.pid" --log-file="$m/munged.log" \
    --seed-file="$m/munged.seed"
  wait_for munged munged "$timeout" test -S "$m/munge.socket"
  wait_for munged munge "$timeout" sh -c \
    "munge -S '$m/munge.socket' -n | unmunge -S '$m/munge.socket'"

  launch slurmctld slurmctld -D -i -f "$DIR/slurm.conf"
  wait_for slurmctld slurmctld "$timeout" env SLURM_CONF="$DIR/slurm.conf" \
    timeout 5 scontrol ping
  launch slurmd slurmd -D -N "$NODE" -f "$DIR/slurm.conf"
  wait_for slurmd "node $NODE" "$timeout" node_idle

  cat >"$DIR/env" <<EOF
SLURM_CONF=$DIR/slurm.conf
SPOT_TEST_SLURM_DIR=$DIR
SPOT_TEST_SLURM_NODE=$NODE
EOF
  trap - EXIT INT TERM
  log "ready (slurmctld port $ctld_port, slurmd port $slurmd_port) in $(since "$t0") s"
  sed 's/^/export /' "$DIR/env"
}

# shellcheck disable=SC2317
stop_run() {
  trap - EXIT INT TERM HUP
  cmd_stop "$DIR" || log "warning: stop failed"
}

cmd_run() {
  local dir=$1 status=0
  shift
  DIR=$(resolve_dir "$dir")
  [[ ${1:-} == -- ]] || usage
  shift
  (($# > 0)) || usage
  trap stop_run EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  (SLURM_TEST_SAME_PGRP=1 cmd_start "$dir" >&2) || die "Slurm did not start"
  set -a
  # shellcheck source=/dev/null
  . "$DIR/env"
  set +a
  "$@" || status=$?
  exit "$status"
}

main() {
  (($# >= 2)) || usage
  local cmd=$1
  shift
  case $cmd in
    start) (($# == 1)) || usage; cmd_start "$1" ;;
    stop) (($# == 1)) || usage; cmd_stop "$1" ;;
    run) cmd_run "$@" ;;
    *) usage ;;
  esac
}

main "$@"
