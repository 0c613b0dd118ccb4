#!/usr/bin/env bash
# Failover benchmark: the same drills, in the same lab, against
#   vigil             default timings (lease 800ms, renew 500ms, retry 100ms)
#   vigil-tuned       lease 350ms, renew 200ms, retry 50ms
#   keepalived        kubeadm's documented recipe (VRRP, 1 s adverts)
#   keepalived-tuned  VRRPv3 with 0.1 s adverts
#   vigil-lease       the Lease backend's default timings (lease 1.6s, renew
#                     1.2s, retry 200ms), --election kubernetes: a Lease through
#                     each node's own real kube-apiserver (bin/, built by
#                     hack/build-kube-apiserver.sh)
#   vigil-bgp         default timings, --announce bgp: the client reaches the
#                     VIP through a router namespace running BIRD 2, by the
#                     holder's BGP host route (not in the default SETS)
#   vigil-ipv6        default timings, an IPv6 VIP (NDP)          (not default)
#   vigil-dual        default timings, an IPv4 and an IPv6 VIP held as one
#                     (vigil run --vip twice); outage per family and how far
#                     apart the families switched                 (not default)
#   vigil-bgp-dual    vigil-dual in the routed lab: two BGP host routes over
#                     an IPv4 and an IPv6 session per node         (not default)
# COUNT runs of each drill, then MIXED consecutive mixed drills on vigil.
# Every run is kept as JSON in results/<timestamp>/, with summary.md.
# Usage, as root: bash bench/failover/run.sh   (COUNT=10 MIXED=50 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh ip keepalived jq bird
hack/build.sh
COUNT=${COUNT:-10}
MIXED=${MIXED:-50}
SETS=${SETS:-"vigil vigil-tuned keepalived keepalived-tuned vigil-lease"}
case " $SETS " in *" vigil-lease "*) hack/build-kube-apiserver.sh ;; esac
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
    vigil-lease) echo "--impl vigil --apiserver kube --election kubernetes" ;;
    vigil-bgp) echo "--impl vigil --announce bgp" ;;
    vigil-ipv6) echo "--impl vigil --ip-family ipv6" ;;
    vigil-dual) echo "--impl vigil --ip-family dual" ;;
    vigil-bgp-dual) echo "--impl vigil --announce bgp --ip-family dual" ;;
  esac
}

for set in $SETS; do
  $lab down >/dev/null 2>&1 || true
  echo "== $set: $(up_args "$set")"
  # shellcheck disable=SC2046
  $lab up --nodes 3 $(up_args "$set") >/dev/null
  drills="kill-leader graceful partition-leader kill-daemon"
  case $set in vigil*) drills="$drills kill-etcd-leader" ;; esac
  for d in $drills; do
    $lab drill "$d" --count "$COUNT" --json > "$out/$set-$d.json" || true
    jq -r '.summary[] | "  \(.drill) median \(.medianMillis)ms max \(.maxMillis)ms split-brain \(.splitBrains) failed \(.failed)" + ([.families[]? | " \(.family) median \(.medianMillis)ms max \(.maxMillis)ms"] | join(";")) + (if .maxSkewMillis then "; families at most \(.maxSkewMillis)ms apart" else "" end)' "$out/$set-$d.json"
  done
  if [ "$set" = vigil ] && [ "$MIXED" -gt 0 ]; then
    $lab drill mixed --count "$MIXED" --json > "$out/$set-mixed.json" || true
    jq -r '"  mixed: \(.results | length) drills, split-brain \([.results[] | select(.splitBrain)] | length), no holder after \([.results[] | select((.holdersAfterHeal | length) != 1)] | length), failed \([.summary[].failed] | add)"' "$out/$set-mixed.json"
  fi
  # Keep the nodes' logs of a set in which any drill failed.
  if jq -s -e '[.[].summary[].failed] | add > 0' "$out/$set"-*.json >/dev/null 2>&1; then
    mkdir -p "$out/logs-$set"
    for d in /run/vigil-lab/n*; do
      for f in "$d"/*.log; do cp "$f" "$out/logs-$set/$(basename "$d")-$(basename "$f")"; done
    done
  fi
  $lab down
done

echo "COUNT=$COUNT MIXED=$MIXED SETS=\"$SETS\" bash bench/failover/run.sh" > "$out/command"
bench/failover/summarize.sh "$out"
