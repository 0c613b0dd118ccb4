#!/usr/bin/env bash
# Failover benchmark: the same drills, in the same lab, against
#   vigil             default timings (lease 800ms, renew 500ms, retry 100ms)
#   vigil-tuned       lease 350ms, renew 200ms, retry 50ms
#   keepalived        kubeadm's documented recipe (VRRP, 1 s adverts)
#   keepalived-tuned  VRRPv3 with 0.1 s adverts
# COUNT runs of each drill, then MIXED consecutive mixed drills on vigil.
# Every run is kept as JSON in results/<timestamp>/, with summary.md.
# Usage: sudo bench/failover/run.sh   (COUNT=10 MIXED=50 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh
hack/build.sh
COUNT=${COUNT:-10}
MIXED=${MIXED:-50}
SETS=${SETS:-"vigil vigil-tuned keepalived keepalived-tuned"}
out=bench/failover/results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
lab=bin/vigil-lab
trap '$lab down >/dev/null 2>&1 || true' EXIT

up_args() {
  case $1 in
    vigil) echo "--impl vigil" ;;
    vigil-tuned) echo "--impl vigil --lease-duration 350ms --renew-deadline 200ms --retry-period 50ms" ;;
    keepalived) echo "--impl keepalived" ;;
    keepalived-tuned) echo "--impl keepalived-tuned" ;;
  esac
}

for set in $SETS; do
  $lab down >/dev/null 2>&1 || true
  echo "== $set: $(up_args "$set")"
  # shellcheck disable=SC2046
  $lab up --nodes 3 $(up_args "$set") >/dev/null
  drills="kill-leader graceful partition-leader"
  case $set in vigil*) drills="$drills kill-etcd-leader" ;; esac
  for d in $drills; do
    $lab drill "$d" --count "$COUNT" --json > "$out/$set-$d.json" || true
    jq -r '.summary[] | "  \(.drill) median \(.medianMillis)ms max \(.maxMillis)ms split-brain \(.splitBrains) failed \(.failed)"' "$out/$set-$d.json"
  done
  if [ "$set" = vigil ] && [ "$MIXED" -gt 0 ]; then
    $lab drill mixed --count "$MIXED" --json > "$out/$set-mixed.json" || true
    jq -r '"  mixed: \(.results | length) drills, split-brain \([.results[] | select(.splitBrain)] | length), no holder after \([.results[] | select((.holdersAfterHeal | length) != 1)] | length), failed \([.summary[].failed] | add)"' "$out/$set-mixed.json"
  fi
  $lab down
done

{
  echo "# Failover benchmark $(basename "$out")"
  echo
  echo "Command: \`sudo COUNT=$COUNT MIXED=$MIXED SETS=\"$SETS\" bench/failover/run.sh\`"
  echo
  echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, kernel $(uname -r), $(go version | cut -d' ' -f3)."
  echo "Outage = longest gap between answers on the VIP, probed every 10 ms from a client namespace."
  echo
  echo "| set | drill | runs | median ms | min ms | max ms | split brain | failed |"
  echo "|---|---|---|---|---|---|---|---|"
  for set in $SETS; do
    for d in kill-leader graceful partition-leader kill-etcd-leader mixed; do
      f="$out/$set-$d.json"
      [ -s "$f" ] || continue
      jq -r --arg set "$set" '.summary[] | "| \($set) | \(.drill) | \(.runs) | \(.medianMillis) | \(.minMillis) | \(.maxMillis) | \(.splitBrains) | \(.failed) |"' "$f"
    done
  done
  echo
  echo "Every run: the JSON files beside this one."
} > "$out/summary.md"
cat "$out/summary.md"
