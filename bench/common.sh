# common.sh - sourced first by the bench scripts (bash): sets HERE (bench/)
# and SRC (the repository), and answers -h/--help with the script's header
# comment, from its second line down to `set -euo pipefail`:
#
#   . "$(dirname "$0")/common.sh" "$@"
# shellcheck shell=bash
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$HERE/.." && pwd)
export SRC
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
