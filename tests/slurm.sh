#!/usr/bin/env bash
# slurm.sh - a throwaway Slurm 22.05 cluster for tests, started directly
# (no systemd): one node on loopback, or N nodes on this one machine, each
# in network and UTS namespaces of its own.
#
#   tests/slurm.sh start DIR [--nodes N] [--forward HOST:PORT]
#                                   start; prints `export K=V` lines
#   tests/slurm.sh stop DIR         cancel its jobs, stop by DIR's pid files,
#                                   remove its namespaces and links, empty DIR
#   tests/slurm.sh run DIR [--nodes N] [--forward HOST:PORT] -- CMD [ARGS...]
#                                   start, run CMD with the env, stop; exits
#                                   with CMD's status
#
# With --nodes N (2..8) the cluster has nodes node1..nodeN. A free subnet
# 10.200.X.0/24 is claimed by creating the bridge spbrX (10.200.X.1, host
# side); node K lives in network namespace spotdX-nK, reached through a
# veth pair (host end spXhK on the bridge, eth0 = 10.200.X.(10+K) inside),
# with no default route: traffic only flows between the namespaces and the
# bridge. slurmd runs there under `unshare --uts` with hostname nodeK;
# slurmctld and munged run on the host (slurmctld answers on the bridge
# address); the munge socket is a path, so every namespace shares it.
# Loopback is per namespace, so a service on the host's 127.0.0.1 (the
# test S3 server) is out of the nodes' reach: --forward HOST:PORT runs
# tests/tcpfwd.py on 10.200.X.1:PORT forwarding to HOST:PORT
# (SPOT_TEST_SLURM_FORWARD names the address nodes use). Every namespace,
# link and bridge is recorded in DIR/net before it is made and removed by
# stop.
#
# Everything lives under DIR: munged (run as user munge, with its own key,
# socket, seed, log and pid file under DIR/munge), slurm.conf, the
# controller's state, slurmd's spool, logs and pid files. slurmctld runs
# with -i (ignore any saved state), slurmd as node "localhost" with 2 CPUs;
# both on free non-default ports. On success DIR/env holds KEY=VALUE lines:
# SLURM_CONF, SPOT_TEST_SLURM_DIR, SPOT_TEST_SLURM_NODE (the node name,
# the first one with --nodes), and with --nodes: SPOT_TEST_SLURM_NODES
# (space-separated), SPOT_TEST_SLURM_NETNS (their namespaces, same order),
# SPOT_TEST_SLURM_NET (the subnet), SPOT_TEST_SLURM_FORWARD (host:port).
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
DAEMONS=(slurmd slurmctld munged) # stop order; a cluster's are in DIR/daemons
NODE=localhost
NODES=1
FORWARD=
readonly CLAIMS="${TMPDIR:-/tmp}/spotd-slurm.ports"

log() { printf 'slurm: %s\n' "$*" >&2; }
# shellcheck source=tests/lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat >&2 <<EOF
usage: $0 start DIR [--nodes N] [--forward HOST:PORT]
       $0 stop DIR
       $0 run DIR [--nodes N] [--forward HOST:PORT] -- CMD [ARGS...]
EOF
  exit 2
}

# is_ours PID: alive (not a zombie) and started with a path under DIR.
is_ours() {
  local cmd
  cmd=$(cmdline "$1") || return 1
  [[ " $cmd " == *" $DIR/slurm.conf "* || " $cmd " == *"=$DIR/munge/"* ||
    " $cmd " == *" $DIR/tcpfwd.py "* ]]
}

# load_daemons: a cluster's daemons, as recorded at start.
load_daemons() {
  if [[ -s $DIR/daemons ]]; then
    read -r -a DAEMONS <"$DIR/daemons"
  fi
  return 0
}

# ---- the multi-node network ------------------------------------------
# net_record KIND NAME: noted in DIR/net before it is made, so that stop
# removes exactly what start made, even after a failed start.
net_record() { printf '%s %s\n' "$1" "$2" >>"$DIR/net"; }

# net_up N: claims a subnet by creating its bridge (a name taken means
# another cluster's), then one namespace and veth pair per node. Sets
# NET_X.
net_up() {
  local n=$1 x i ns host
  NET_X=
  for x in $(shuf -i 1-254); do
    ip -o -4 addr show | grep -q " 10\.200\.$x\." && continue
    if ip link add "spbr$x" type bridge 2>/dev/null; then
      net_record link "spbr$x"
      NET_X=$x
      break
    fi
  done
  [[ -n $NET_X ]] || die "no free subnet 10.200.X.0/24"
  x=$NET_X
  ip addr add "10.200.$x.1/24" dev "spbr$x"
  ip link set "spbr$x" up
  for ((i = 1; i <= n; i++)); do
    ns=spotd$x-n$i
    host=sp${x}h$i
    net_record netns "$ns"
    ip netns add "$ns"
    net_record link "$host"
    ip link add "$host" type veth peer name eth0 netns "$ns"
    ip link set "$host" master "spbr$x" up
    ip -n "$ns" addr add "10.200.$x.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
}

# net_down: removes what DIR/net lists (namespaces first: that also
# removes their veth ends). A process still inside one of our namespaces
# (a job's leftover) is killed by pid, with a warning.
net_down() {
  local kind name pid
  [[ -f $DIR/net ]] || return 0
  while read -r kind name; do
    [[ $kind == netns ]] || continue
    ip netns list | grep -q "^$name\b" || continue
    for pid in $(ip netns pids "$name" 2>/dev/null); do
      log "warning: pid $pid ($(cmdline "$pid" || true)) still in $name: killing it"
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns del "$name" || log "warning: cannot delete netns $name"
  done <"$DIR/net"
  while read -r kind name; do
    [[ $kind == link ]] || continue
    ip link show "$name" >/dev/null 2>&1 || continue
    ip link del "$name" || log "warning: cannot delete link $name"
  done <"$DIR/net"
  rm -f "$DIR/net"
}

# Two free ports (slurmctld, slurmd), claimed under a lock until stop so
# that concurrent starts with different DIRs do not pick the same ones. A
# claim is stale once its DIR's marker no longer lists the port.
pick_ports() {
  # shellcheck disable=SC2119 # no arguments for the program
  claim_ports <<'EOF'
ports = [p for p in random.sample(range(26817, 27817), 200)
         if free(p, "0.0.0.0", reuse=True)][:2]
if len(ports) < 2:
    sys.exit("no free port found")
claim(ports)
print(*ports)
EOF
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
EOF
  if ((NODES == 1)); then
    cat >>"$DIR/slurm.conf" <<EOF
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  else
    local i
    sed -i -e "s|^SlurmctldHost=.*|SlurmctldHost=localhost(10.200.$NET_X.1)|" \
      -e "s|^SlurmdPidFile=.*|SlurmdPidFile=$DIR/run/slurmd-%n.pid|" \
      -e "s|^SlurmdLogFile=.*|SlurmdLogFile=$DIR/log/slurmd-%n.log|" \
      "$DIR/slurm.conf"
    for ((i = 1; i <= NODES; i++)); do
      echo "NodeName=node$i NodeHostname=node$i" \
        "NodeAddr=10.200.$NET_X.$((10 + i)) CPUs=2 State=UNKNOWN"
    done >>"$DIR/slurm.conf"
    echo "PartitionName=debug Nodes=node[1-$NODES] Default=YES" \
      "MaxTime=INFINITE State=UP" >>"$DIR/slurm.conf"
  fi
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
  all_stopped || return 1
  net_down
}

cmd_stop() {
  DIR=$(resolve_dir "$1")
  load_daemons
  stop_dir cancel_jobs
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

# all_idle: every node of a cluster is idle.
all_idle() {
  local st
  st=$(SLURM_CONF=$DIR/slurm.conf timeout 5 sinfo -h -N -o %t) || return 1
  [[ $(grep -cx idle <<<"$st") == "$NODES" ]]
}

# start_nodes: one slurmd per node in its namespaces, and the forwarder.
start_nodes() {
  local i names=() nss=()
  for ((i = 1; i <= NODES; i++)); do
    names+=("node$i")
    nss+=("spotd$NET_X-n$i")
    DAEMONS=("slurmd-node$i" "${DAEMONS[@]}")
    echo "${DAEMONS[*]}" >"$DIR/daemons"
    # shellcheck disable=SC2016 # $1 and $2 are sh's
    # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup
    # hierarchy slurmd needs.
    mkdir -p "$DIR/spool/node$i"
    launch "slurmd-node$i" nsenter --net="/run/netns/spotd$NET_X-n$i" \
      unshare --uts \
      sh -c 'hostname "$1" && exec slurmd -D -N "$1" -f "$2"' sh "node$i" \
      "$DIR/slurm.conf"
  done
  if [[ -n $FORWARD ]]; then
    cp "$(dirname -- "${BASH_SOURCE[0]}")/tcpfwd.py" "$DIR/tcpfwd.py"
    DAEMONS+=(fwd)
    echo "${DAEMONS[*]}" >"$DIR/daemons"
    launch fwd "$PY" "$DIR/tcpfwd.py" "10.200.$NET_X.1:${FORWARD##*:}" \
      "$FORWARD"
  fi
  wait_for slurmctld "$NODES nodes" "$timeout" all_idle
  cat >>"$DIR/env" <<EOF
SPOT_TEST_SLURM_NODES=${names[*]}
SPOT_TEST_SLURM_NETNS=${nss[*]}
SPOT_TEST_SLURM_NET=10.200.$NET_X.0/24
SPOT_TEST_SLURM_FORWARD=${FORWARD:+10.200.$NET_X.1:${FORWARD##*:}}
EOF
}

cmd_start() {
  DIR=$(resolve_dir "$1")
  local t0 ports ctld_port slurmd_port m timeout=${SLURM_TEST_TIMEOUT:-30}
  t0=$(now)
  ((EUID == 0)) || die "needs root (munged runs as munge, slurmd as root)"
  begin_start cluster
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
  if ((NODES > 1)); then
    DAEMONS=(slurmctld munged)
    echo "${DAEMONS[*]}" >"$DIR/daemons"
    net_up "$NODES"
  fi
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
  ((NODES == 1)) || NODE=node1
  cat >"$DIR/env" <<EOF
SLURM_CONF=$DIR/slurm.conf
SPOT_TEST_SLURM_DIR=$DIR
SPOT_TEST_SLURM_NODE=$NODE
EOF
  if ((NODES > 1)); then
    start_nodes
  else
    launch slurmd slurmd -D -N "$NODE" -f "$DIR/slurm.conf"
    wait_for slurmd "node $NODE" "$timeout" node_idle
  fi
  trap - EXIT INT TERM
  log "ready ($NODES node(s), slurmctld port $ctld_port, slurmd port $slurmd_port) in $(since "$t0") s"
  sed 's/^/export /' "$DIR/env"
}

# shellcheck disable=SC2317
stop_run() {
  trap - EXIT INT TERM HUP
  cmd_stop "$DIR" || log "warning: stop failed"
}

# parse_start_opts ARG...: --nodes N, --forward HOST:PORT; sets NOPTS to
# how many arguments they took.
parse_start_opts() {
  NOPTS=0
  while (($# > 0)); do
    case $1 in
      --nodes)
        [[ ${2:-} =~ ^[1-8]$ ]] || die "--nodes: expected 1 to 8"
        NODES=$2
        ;;
      --forward)
        [[ ${2:-} =~ ^[0-9.]+:[0-9]+$ ]] || die "--forward: expected HOST:PORT"
        FORWARD=$2
        ;;
      *) break ;;
    esac
    shift 2
    NOPTS=$((NOPTS + 2))
  done
  [[ -z $FORWARD ]] || ((NODES > 1)) || die "--forward needs --nodes 2 or more"
}

cmd_run() {
  local dir=$1 status=0
  shift
  DIR=$(resolve_dir "$dir")
  parse_start_opts "$@"
  shift "$NOPTS"
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
    start)
      parse_start_opts "${@:2}"
      (($# == NOPTS + 1)) || usage
      cmd_start "$1"
      ;;
    stop) (($# == 1)) || usage; cmd_stop "$1" ;;
    run) cmd_run "$@" ;;
    *) usage ;;
  esac
}

main "$@"
