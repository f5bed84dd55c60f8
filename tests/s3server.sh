#!/usr/bin/env bash
# s3server.sh - a throwaway single-node Ceph RGW (S3) on loopback for tests.
#
#   tests/s3server.sh start DIR [PORT]      start; prints `export K=V` lines
#   tests/s3server.sh stop DIR              stop by DIR's pid files, empty DIR
#   tests/s3server.sh run DIR [PORT] -- CMD [ARGS...]
#                                           start, run CMD with the env, stop;
#                                           exits with CMD's status
#
# Everything (config, keyrings, mon store, OSD with bluestore on a sparse
# file, sockets, logs, pid files) lives under DIR. One mon (msgr2 only, on a
# free non-default port), one OSD, one radosgw on 127.0.0.1:PORT (default:
# 7480 if free, else another free port). A user with fixed keys and the
# bucket `spotd-test` are created. On success DIR/env holds KEY=VALUE lines:
# SPOT_TEST_S3_ENDPOINT, SPOT_TEST_S3_BUCKET, AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, AWS_REGION and AWS_DEFAULT_REGION (RGW's default
# zonegroup signs with any region name; us-east-1 is what clients default to).
#
# Daemons are only ever signalled through the pid files in DIR, and only if
# their command line still names DIR/ceph.conf.
#
# Environment knobs:
#   S3SERVER_BLOCK_SIZE    sparse bluestore file size (default 32G)
#   S3SERVER_TIMEOUT       limit in seconds for the start, package install
#                          excluded (default 60)
set -euo pipefail

readonly ACCESS_KEY=SPOTDTESTACCESSKEY01
readonly SECRET_KEY=spotdTestSecretKey0123456789abcdefghijklm
readonly BUCKET=spotd-test
readonly REGION=us-east-1
readonly RGW_ID=spotd
readonly MARKER=.spotd-s3server
readonly PY=/usr/bin/python3
readonly PKGS=(ceph-mon ceph-osd radosgw ceph-common ceph-base uuid-runtime
  python3-boto3)
readonly DAEMONS=(rgw osd mon)        # stop order
readonly CLAIMS="${TMPDIR:-/tmp}/spotd-s3server.ports"

unset CEPH_ARGS CEPH_CONF
STEP_PID="" MKFS_PID=""

# Messages go to fd 9, the caller's stderr, even from inside a redirected
# function call.
exec 9>&2
log() { printf 's3server: %s\n' "$*" >&9; }
# shellcheck source=tests/lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat >&2 <<EOF
usage: $0 start DIR [PORT]
       $0 stop DIR
       $0 run DIR [PORT] -- CMD [ARGS...]
EOF
  exit 2
}

# is_ours PID: alive (not a zombie) and started with our config file.
is_ours() {
  local cmd
  cmd=$(cmdline "$1") || return 1
  [[ " $cmd " == *" $DIR/ceph.conf "* ]]
}

# Pick the gateway and mon ports under a lock, and claim them until stop, so
# that concurrent starts with different DIRs do not pick the same ones. A
# claim is stale once its DIR's marker no longer lists the port.
pick_ports() {
  claim_ports "$1" <<'EOF'
want = sys.argv[4]
if want:
    if not free(int(want)):
        sys.exit("port %s is busy" % want)
    rgw = int(want)
else:
    cands = [7480] + list(range(7481, 7500)) + random.sample(range(17480, 17980), 100)
    rgw = next((p for p in cands if free(p)), None)
mon = next((p for p in random.sample(range(16300, 16800), 100)
            if p != rgw and free(p)), None)
if rgw is None or mon is None:
    sys.exit("no free port found")
claim((rgw, mon))
print(rgw, mon)
EOF
}

write_conf() {
  local fsid=$1 mon_port=$2 rgw_port=$3 block_size=$4
  # \$name and \$cluster are Ceph's own metavariables.
  cat >"$DIR/ceph.conf" <<EOF
[global]
fsid = $fsid
mon_host = v2:127.0.0.1:$mon_port
public_addr = 127.0.0.1
ms_bind_msgr1 = false
ms_bind_ipv6 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
keyring = $DIR/keyring
run_dir = $DIR/run
admin_socket = $DIR/run/\$name.asok
pid_file = $DIR/run/\$name.pid
log_file = $DIR/log/\$name.log
mon_cluster_log_file = $DIR/log/cluster.log
crash_dir = $DIR/crash
log_to_stderr = false
err_to_stderr = true
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_max_pg_per_osd = 1000
mon_data_avail_warn = 2
mon_data_avail_crit = 1
auth_allow_insecure_global_id_reclaim = false
ms_async_op_threads = 2

[mon]
mon_data = $DIR/mon
# Commit map changes at once instead of once a second: RGW's first start
# makes ~20 osdmap epochs (pools, application tags), 1 s each by default.
paxos_propose_interval = 0.01
paxos_min_wait = 0.001
mon_memory_target = 268435456
rocksdb_cache_size = 33554432

[osd]
osd_data = $DIR/osd
keyring = $DIR/osd/keyring
osd_objectstore = bluestore
bluestore_block_path = $DIR/osd-block
bluestore_block_create = true
bluestore_block_size = $block_size
bluestore_block_db_create = false
bluestore_block_wal_create = false
bluestore_fsck_on_mkfs = false
bluestore_fsck_on_mount = false
bluestore_cache_autotune = false
bluestore_cache_size = 134217728
osd_memory_target = 939524096
osd_memory_cache_min = 67108864
osd_mon_shutdown_timeout = 1

[client]
# A client whose op waits for an OSD to come up only asks for a newer map
# on this tick (default 5 s).
objecter_tick_interval = 0.5

[client.rgw.$RGW_ID]
keyring = $DIR/rgw.keyring
rgw_data = $DIR/rgw
rgw_frontends = beast endpoint=127.0.0.1:$rgw_port
rgw_thread_pool_size = 64
rgw_enable_usage_log = false
rgw_enable_ops_log = false
rgw_enable_lc_threads = false
rgw_dynamic_resharding = false
EOF
}

# launch NAME CMD...: start a daemon in the foreground (-f) in the
# background; its pid (not a wrapper's) goes to DIR/pids/NAME.
launch() {
  local name=$1
  shift
  local as_root=()
  ((EUID == 0)) && as_root=(--setuser root --setgroup root)
  if [[ ${S3SERVER_SAME_PGRP:-} == 1 ]]; then
    # run mode: stay in the caller's process group so that a group kill
    # (e.g. a test harness timeout) takes the daemons down too.
    "$@" -c "$DIR/ceph.conf" -f "${as_root[@]}" \
      </dev/null >>"$DIR/log/$name.out" 2>&1 9>&- &
  else
    # Not a process group leader here, so setsid execs without forking.
    setsid "$@" -c "$DIR/ceph.conf" -f "${as_root[@]}" \
      </dev/null >>"$DIR/log/$name.out" 2>&1 9>&- &
  fi
  echo $! >"$DIR/pids/$name"
}

# step CMD...: run an external command asynchronously and wait for it, so
# that a signal's trap runs at once (start_failed then kills it), within
# what is left of the start's time limit.
step() {
  local left=$((DEADLINE - SECONDS)) rc=0
  ((left > 0)) || die "start limit of $TIMEOUT s reached before $1"
  timeout --foreground "$left" "$@" 9>&- &
  STEP_PID=$!
  wait "$STEP_PID" || rc=$?
  STEP_PID=""
  ((rc != 124)) || log "$1 timed out (start limit $TIMEOUT s)"
  return "$rc"
}

ceph_cli() { step ceph -c "$DIR/ceph.conf" --connect-timeout 30 "$@"; }

# Ready = an authenticated S3 request works: create the bucket (again).
readonly READY_PY='
import sys, time
import boto3, botocore.config, botocore.exceptions as bx
endpoint, ak, sk, region, bucket, pidfile = sys.argv[1:7]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ak,
                  aws_secret_access_key=sk, region_name=region,
                  config=botocore.config.Config(
                      s3={"addressing_style": "path"}, connect_timeout=2,
                      read_timeout=10, retries={"max_attempts": 1}))
pid = open(pidfile).read().strip()
while True:
    try:
        with open("/proc/%s/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                raise OSError
    except (OSError, IndexError):
        sys.exit("radosgw exited")
    try:
        s3.create_bucket(Bucket=bucket)
        break
    except bx.ClientError as e:
        if e.response["Error"]["Code"] == "BucketAlreadyOwnedByYou":
            break
    except bx.BotoCoreError:
        pass
    time.sleep(0.2)
s3.head_bucket(Bucket=bucket)
'

dump_logs() {
  local f
  for f in "$DIR"/log/*; do
    [[ -s $f ]] || continue
    printf '%s\n' "----- tail of $f" >&9
    tail -n 15 "$f" >&9
  done
}

# stop_daemons: SIGTERM the gateway, the OSD, then the mon, one after the
# other (an OSD stopping tells the mon; with the mon gone it waits
# osd_mon_shutdown_timeout); SIGKILL any of them still there after 10 s.
stop_daemons() {
  local left=() deadline
  [[ -d $DIR/pids ]] || return 0
  term_wait() {
    local n p pids=()
    for n in "$@"; do
      p=$(cat "$DIR/pids/$n" 2>/dev/null) || continue
      is_ours "$p" || continue
      kill -TERM "$p" 2>/dev/null || true
      pids+=("$p")
    done
    deadline=$((SECONDS + 10))
    while ((SECONDS < deadline)); do
      left=()
      for p in "${pids[@]}"; do is_ours "$p" && left+=("$p"); done
      ((${#left[@]} == 0)) && return 0
      sleep 0.1
    done
    log "SIGKILL to ${left[*]} (did not stop on SIGTERM)"
    kill -KILL "${left[@]}" 2>/dev/null || true
    for _ in $(seq 50); do
      for p in "${left[@]}"; do is_ours "$p" && { sleep 0.1; continue 2; }; done
      return 0
    done
    log "processes ${left[*]} survive SIGKILL"
  }
  term_wait rgw
  term_wait osd
  term_wait mon
  all_stopped
}

cmd_stop() {
  [[ -n $1 ]] || usage
  [[ -e $1 ]] || return 0
  DIR=$(resolve_dir "$1")
  # shellcheck disable=SC2119 # nothing to do before the daemons stop
  stop_dir
}

start_failed() {
  local rc=$?
  # Cleanup is bounded; a second signal must not cut it short.
  trap - EXIT
  trap '' INT TERM HUP
  ((rc == 0)) && rc=1
  local p
  for p in ${STEP_PID:-} ${MKFS_PID:-}; do
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if ((rc == 130 || rc == 143)); then
    log "start interrupted; cleaning up"
  else
    log "start failed"
    dump_logs
  fi
  stop_daemons || log "warning: some daemons did not stop"
  empty_dir
  exit "$rc"
}

cmd_start() {
  DIR=$(resolve_dir "$1")
  local want=${2:-} t0 ports rgw_port mon_port fsid osd_uuid osd_secret id
  [[ -z $want || $want =~ ^[0-9]+$ ]] || usage
  t0=$(now)
  begin_start server
  TIMEOUT=${S3SERVER_TIMEOUT:-60}
  DEADLINE=$((SECONDS + TIMEOUT))
  : >"$DIR/$MARKER"
  ports=$(pick_ports "$want") || die "cannot pick ports"
  read -r rgw_port mon_port <<<"$ports"
  mkdir -p "$DIR"/{run,log,crash,pids,mon,osd,rgw}
  fsid=$(uuidgen)
  write_conf "$fsid" "$mon_port" "$rgw_port" "${S3SERVER_BLOCK_SIZE:-32G}"

  # Monitor.
  ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n mon. \
    --cap mon 'allow *' >/dev/null
  ceph-authtool "$DIR/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' \
    --cap mds 'allow *' >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" \
    "$DIR/monmap" >/dev/null
  ceph-mon -c "$DIR/ceph.conf" --mkfs -i a --monmap "$DIR/monmap" \
    --keyring "$DIR/keyring" >>"$DIR/log/mkfs.out" 2>&1
  launch mon ceph-mon -i a

  # OSD: the store is made while the mon comes up; a new cluster's first
  # OSD id is 0, checked against what the mon hands out below.
  osd_uuid=$(uuidgen)
  osd_secret=$(ceph-authtool --gen-print-key)
  ceph-authtool --create-keyring "$DIR/osd/keyring" -n osd.0 \
    --add-key "$osd_secret" >/dev/null
  ceph-osd -c "$DIR/ceph.conf" -i 0 --mkfs --no-mon-config \
    --osd-uuid "$osd_uuid" >>"$DIR/log/mkfs.out" 2>&1 9>&- &
  MKFS_PID=$!
  printf '{"cephx_secret": "%s"}\n' "$osd_secret" >"$DIR/osd/new.json"
  ceph_cli osd new "$osd_uuid" -i "$DIR/osd/new.json" >"$DIR/osd/id" \
    2>>"$DIR/log/cli.out" || die "ceph osd new failed"
  wait "$MKFS_PID" || die "ceph-osd --mkfs failed"
  MKFS_PID=""
  id=$(<"$DIR/osd/id")
  [[ $id == 0 ]] || die "mon gave OSD id '$id', expected 0"
  launch osd ceph-osd -i 0

  # Gateway key, user (radosgw-admin waits for the OSD to be up and creates
  # the zone and its pools), then the gateway itself.
  ceph_cli auth get-or-create "client.rgw.$RGW_ID" mon 'allow rw' \
    osd 'allow rwx' -o "$DIR/rgw.keyring" 2>>"$DIR/log/cli.out" ||
    die "ceph auth get-or-create failed"
  step radosgw-admin -c "$DIR/ceph.conf" \
    user create --uid=spotd-test --display-name="spotd test" \
    --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" \
    >>"$DIR/log/cli.out" 2>&1 || die "radosgw-admin user create failed"
  launch rgw radosgw -n "client.rgw.$RGW_ID"

  local endpoint=http://127.0.0.1:$rgw_port
  step "$PY" -c "$READY_PY" "$endpoint" "$ACCESS_KEY" "$SECRET_KEY" \
    "$REGION" "$BUCKET" "$DIR/pids/rgw" 2>>"$DIR/log/ready.out" ||
    die "S3 gateway on $endpoint did not answer: $(tail -n 1 "$DIR/log/ready.out" 2>/dev/null)"

  cat >"$DIR/env" <<EOF
SPOT_TEST_S3_ENDPOINT=$endpoint
SPOT_TEST_S3_BUCKET=$BUCKET
AWS_ACCESS_KEY_ID=$ACCESS_KEY
AWS_SECRET_ACCESS_KEY=$SECRET_KEY
AWS_REGION=$REGION
AWS_DEFAULT_REGION=$REGION
EOF
  trap - EXIT INT TERM
  log "ready on $endpoint (port $rgw_port, mon port $mon_port) in $(since "$t0") s"
  sed 's/^/export /' "$DIR/env"
}

# Traps of cmd_run. Signals go to whatever runs (the start, then CMD); the
# server is stopped once it has exited. The start is told with SIGTERM (an
# async subshell ignores SIGINT). Ctrl-C on a terminal reaches CMD directly,
# so SIGINT is passed on to CMD only when we are not the terminal's
# foreground group.
# shellcheck disable=SC2317
stop_run() {
  trap - EXIT
  trap '' INT TERM HUP
  cmd_stop "$DIR" || log "warning: stop failed"
}

# shellcheck disable=SC2317
on_signal() {
  local s=$1 me tty
  sig=$s
  [[ -n $child ]] || return 0
  if [[ $phase == start ]]; then
    s=TERM
  elif [[ $s == INT ]]; then
    read -r me tty < <(ps -o pgid=,tpgid= -p $$) || true
    [[ $me == "$tty" ]] && return 0
  fi
  kill -s "$s" "$child" 2>/dev/null || true
}

cmd_run() {
  local dir=$1 port=""
  shift
  DIR=$(resolve_dir "$dir")
  if [[ ${1:-} != -- ]]; then port=${1:-}; shift || true; fi
  [[ ${1:-} == -- ]] || usage
  shift
  (($# > 0)) || usage

  trap stop_run EXIT
  child="" sig="" phase=start
  trap 'on_signal INT' INT
  trap 'on_signal TERM' TERM
  trap 'on_signal HUP' HUP

  # Both steps run asynchronously so that the traps fire at once. An async
  # command has SIGINT and SIGQUIT ignored and stdin on /dev/null unless
  # told otherwise: CMD gets the default dispositions and our stdin back.
  local status=0
  (S3SERVER_SAME_PGRP=1 cmd_start "$dir" "$port" >&2) &
  child=$!
  wait_child || status=$?
  child=""
  case $sig in
    INT) exit 130 ;; TERM) exit 143 ;; HUP) exit 129 ;;
  esac
  ((status == 0)) || die "S3 server did not start"
  set -a
  # shellcheck source=/dev/null
  . "$DIR/env"
  set +a
  unset AWS_SESSION_TOKEN AWS_SECURITY_TOKEN AWS_PROFILE

  phase=cmd
  exec 3<&0
  env --default-signal=INT,QUIT -- "$@" <&3 3<&- &
  child=$!
  exec 3<&-
  status=0
  wait_child || status=$?
  exit "$status"
}

# wait_child: wait for $child to exit, across interrupting traps; returns
# its status.
wait_child() {
  local rc
  while :; do
    rc=0
    wait "$child" || rc=$?
    kill -0 "$child" 2>/dev/null || return "$rc"
  done
}

main() {
  (($# >= 2)) || usage
  local cmd=$1
  shift
  case $cmd in
    start) (($# <= 2)) || usage; cmd_start "$@" ;;
    stop) (($# == 1)) || usage; cmd_stop "$1" ;;
    run) cmd_run "$@" ;;
    *) usage ;;
  esac
}

main "$@"
