#!/bin/bash
# signal_spawn.sh - does the checkpoint signal kill a child between fork()
# and exec()? A trainer without the helper catches SIGRTMIN+4 and runs
# subprocess.run(["/bin/true"]) in a loop while spotd asks for checkpoints
# back to back (each kept pending for 1.5 s of spawning), until at least
# SPAWNS children ran; counts the children killed by the signal.
#
#   bench/signal_spawn.sh [BUILD_DIR] [SPAWNS]    (default .build, 20000)
#
# Needs the test S3 server (set -a; . ENV_OF_THE_SERVER; set +a). Writes
# bench/results/signal_spawn.json and prints one line; the CI test
# (tests/integration/test_signal_spawn.py) is the same run, shorter.
set -euo pipefail
. "$(dirname "$0")/common.sh" "$@"
BUILD=$(cd "${1:-$SRC/.build}" && pwd)
SPAWNS=${2:-20000}
export SPOTD=$BUILD/daemon/spotd SPOTCTL=$BUILD/client/spotctl
export SPOT_SRCDIR=$SRC SPOT_BUILDDIR=$BUILD PYTHONPATH=$SRC/python
python3 "$SRC/tests/integration/test_signal_spawn.py" --spawns "$SPAWNS" \
  --out "$HERE/results/signal_spawn.json" | grep -v '^\[spotd\]'
