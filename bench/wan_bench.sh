#!/usr/bin/env bash
# wan_bench.sh - the WAN benchmark (README "Benchmarks"): spotctl push/restore against
# `aws s3 cp` and its CRT client, each connection through bench/wanproxy.py
# (60 MB/s per connection, 20 ms RTT; a lossy variant), in front of a
# discard sink and a Ceph RGW of its own. Not a test: it reports.
#
#   bench/wan_bench.sh [BUILD_DIR]        (default: build)
#
# Needs root only to bind the proxy to 127.0.0.1:80 for the CRT client
# (which ignores the port of --endpoint-url); without it the CRT column is
# empty. Packages: tools/deps.sh bench. Quick mode (one round, small
# sizes, for development): WAN_QUICK=1. Every knob (sizes, cases, tools,
# targets, rounds, the proxy's model) is listed in bench/wan_bench.py.
# Writes bench/results/wan.json (after every run), wan.md and wan.png.
# A full run (3 rounds) takes over an hour on 2 cores; a reduced one, e.g.
#   WAN_RUNS=1 WAN_BIG_MB=2048 WAN_SMALL_N=1000 bench/wan_bench.sh
# about 12 minutes.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-$HERE/../build}
exec /usr/bin/python3 "$HERE/wan_bench.py" "$BUILD"
