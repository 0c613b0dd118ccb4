#!/usr/bin/env bash
# A/B of two builds on one host: graceful and kill-leader, 10 each, in a
# fresh 3-node lab per build. Usage, as root:
#   bash bench/failover/ab.sh OLD_VIGIL_LAB OLD_VIGIL NEW_VIGIL_LAB NEW_VIGIL
# (build the old pair from a worktree: git worktree add /tmp/old REV &&
#  cd /tmp/old && go build -o /tmp/oldbin/ ./cmd/vigil ./cmd/vigil-lab)
set -euo pipefail
run() {
  local lab=$1 vig=$2
  $lab down >/dev/null 2>&1 || true
  $lab --vigil-bin "$vig" up --nodes 3 --impl vigil >/dev/null
  for d in graceful kill-leader; do
    $lab drill $d --count 10 --json | jq -r '.summary[] | "  \(.drill) median \(.medianMillis)ms max \(.maxMillis)ms failed \(.failed)"'
  done
  $lab down >/dev/null
}
echo "old: $2"; run "$1" "$2"
echo "new: $4"; run "$3" "$4"
