# tests/lib.sh - shell helpers shared by tests/s3server.sh and tests/slurm.sh
# (sourced, not run). The sourcing script defines log, usage, stop_daemons
# and the readonly PKGS, MARKER and CLAIMS, and sets DIR, the absolute
# folder it works in, before calling anything that uses it.
# shellcheck shell=bash

die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Installs those of PKGS not installed yet.
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

# cmdline PID: prints the command line (NULs as spaces) of PID, a number and
# alive; fails otherwise.
cmdline() {
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  alive "$1" || return 1
  tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null
}

# claim_ports [ARG...] <PROGRAM: runs the Python PROGRAM (ARGs in
# sys.argv[4:]) holding the lock on CLAIMS, after a prelude that defines
# free(port, host="127.0.0.1", reuse=False) (not claimed for a live DIR,
# and bindable) and claim(ports) (write DIR's marker and CLAIMS/PORT
# files naming DIR). A claim is stale once its DIR's marker no longer lists
# the port.
claim_ports() {
  mkdir -p "$CLAIMS"
  {
    cat <<'EOF'
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

def free(port, host="127.0.0.1", reuse=False):
    if claimed(port):
        return False
    s = socket.socket()
    try:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()

def claim(ports):
    with open(os.path.join(mydir, marker), "w") as f:
        f.write(" ".join("%d" % p for p in ports) + "\n")
    for p in ports:
        with open(os.path.join(claims, str(p)), "w") as f:
            f.write(mydir + "\n")

lock = open(os.path.join(claims, ".lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX)
EOF
    cat
  } | "$PY" - "$CLAIMS" "$DIR" "$MARKER" "$@"
}

# all_stopped: true when none of DAEMONS runs any more (by DIR's pid files).
all_stopped() {
  local name pid
  for name in "${DAEMONS[@]}"; do
    pid=$(cat "$DIR/pids/$name" 2>/dev/null) || continue
    is_ours "$pid" && return 1
  done
  return 0
}

# Drops the port claims (CLAIMS/PORT naming DIR) of the ports DIR's marker
# lists.
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

empty_dir() {
  release_ports
  find "$DIR" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +
}

# begin_start WHAT: the start of cmd_start once DIR is set: install
# PKGS, stop the old WHAT DIR may hold, insist on an empty DIR, and from now
# on clean up through start_failed on any exit (INT and TERM exit 130/143).
begin_start() {
  ensure_packages
  if [[ -e $DIR/$MARKER ]]; then
    log "$DIR holds an old $1; stopping it first"
    cmd_stop "$DIR"
  fi
  [[ -z $(ls -A -- "$DIR") ]] || die "$DIR is not empty"

  trap start_failed EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# stop_dir [CMD...]: if DIR has our marker, run CMD (if any), stop_daemons
# and empty DIR; an empty DIR without it is left as is, a non-empty one is
# an error.
stop_dir() {
  local t0
  t0=$(now)
  if [[ ! -e $DIR/$MARKER ]]; then
    [[ -z $(ls -A -- "$DIR") ]] && return 0
    die "$DIR is not empty and was not made by $0; not touching it"
  fi
  (($# == 0)) || "$@"
  stop_daemons || die "some daemons under $DIR did not stop"
  empty_dir
  log "stopped in $(since "$t0") s"
}
