#!/usr/bin/env bash
# Chaos benchmark: vigil-lab chaos against a fresh 3-node lab (vigil with its
# defaults, load balancer on VIP:6443, a separate VIP link per node). Runs
# every set below; each keeps its JSON report, its printed table and the
# nodes' logs of any fault that broke an invariant in
# results/<timestamp>/<set>.{json,txt} and results/<timestamp>/logs-<set>/.
#
#   all     every fault type, DURATION (30m), the goal's long run
#   pause   only pause (SIGSTOP of vigil for 2-10 s), PAUSE_DURATION (8m)
#   freeze  only freeze (vigil and its guard together), FREEZE_DURATION (4m)
#
# ANNOUNCE=bgp runs them in the routed lab instead (docs/bgp.md): a BIRD 2
# router between the nodes and the client, the VIP on lo, no VIP link and so
# no link faults. IP_FAMILY=dual (or ipv6) gives the VIP an IPv6 address too
# (or only one): stray-VIP faults then add either family's address, and
# every node's addresses of both families are sampled (docs/dualstack.md).
#
# Usage, as root: bash bench/chaos/run.sh        (SETS="all pause freeze", SEED=1)
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh ip jq bird
hack/build.sh
SEED=${SEED:-1}
ANNOUNCE=${ANNOUNCE:-arp} # bgp: the routed lab (BIRD 2 router), without the VIP link faults
IP_FAMILY=${IP_FAMILY:-ipv4}
SETS=${SETS:-"all pause freeze"}
out=bench/chaos/results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
lab=bin/vigil-lab
trap '$lab down >/dev/null 2>&1 || true' EXIT
status=0
for set in $SETS; do
  case $set in
    all) args=(--duration "${DURATION:-30m}") ;;
    pause) args=(--duration "${PAUSE_DURATION:-8m}" --faults pause) ;;
    freeze) args=(--duration "${FREEZE_DURATION:-4m}" --faults freeze) ;;
    *) echo "unknown set $set" >&2; exit 2 ;;
  esac
  args+=(--announce "$ANNOUNCE" --ip-family "$IP_FAMILY")
  echo "== $set: vigil-lab chaos ${args[*]} --seed $SEED"
  $lab chaos "${args[@]}" --seed "$SEED" --json --logs "$out/logs-$set" > "$out/$set.json" || status=1
  jq -r '.summary[] | "  \(.kind): \(.count) faults, outage median \(.outageMedianMillis)ms worst \(.outageWorstMillis)ms, no holder worst \(.noHolderWorstMillis)ms, dual-holder samples \(.dualSamples) (worst \(.dualWorstMillis)ms), failed \(.failed)"' "$out/$set.json" | tee "$out/$set.txt"
done
echo "ANNOUNCE=$ANNOUNCE IP_FAMILY=$IP_FAMILY SETS=\"$SETS\" DURATION=${DURATION:-30m} SEED=$SEED bash bench/chaos/run.sh" > "$out/command"
bash bench/chaos/summarize.sh "$out"
echo "results in $out"
exit $status
