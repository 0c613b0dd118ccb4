#!/usr/bin/env bash
# Membership drills on the lab, recorded: COUNT replace-node drills in a row
# (power off the VIP holder for good, prune it, join a new node), COUNT
# replace-healthy drills (learner, promote, remove), COUNT scale drills
# (3 -> 5 -> 3; each on a fresh lab, as each run uses two new node
# indexes), and COUNT of each prune drill on a lab with --prune-after
# PRUNE_AFTER (prune-one-sided, prune-cold-start, prune-real-death,
# prune-client-port), and COUNT recover drills (lose 2 of 3 nodes for
# good, vigil members recover on the survivor, 2 new members join). Every
# run is kept as JSON in results/<timestamp>/, with summary.md.
# Usage, as root: bash bench/membership/run.sh   (COUNT=5 by default)
#   e.g. COUNT=10 DRILLS="prune-one-sided prune-cold-start prune-real-death" bash bench/membership/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh ip nft jq
hack/build.sh
COUNT=${COUNT:-5}
DRILLS=${DRILLS:-"replace-node replace-healthy scale prune-one-sided prune-cold-start prune-real-death prune-client-port recover"}
PRUNE_AFTER=${PRUNE_AFTER:-10s}
out=bench/membership/results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
lab=bin/vigil-lab
trap '$lab down >/dev/null 2>&1 || true' EXIT
for d in $DRILLS; do
  if [ "$d" = scale ]; then
    for i in $(seq 1 "$COUNT"); do
      $lab down >/dev/null 2>&1 || true
      $lab up --nodes 3 >/dev/null
      $lab drill scale --json | jq ".results[0].run = $i" > "$out/scale-$i.json" || true
    done
    jq -s '{results: [.[].results[]]}' "$out"/scale-*.json > "$out/scale.json" && rm "$out"/scale-*.json
    continue
  fi
  $lab down >/dev/null 2>&1 || true
  case $d in
    prune-*) $lab up --nodes 3 --prune-after "$PRUNE_AFTER" --etcd-log-level info >/dev/null ;;
    *) $lab up --nodes 3 >/dev/null ;;
  esac
  $lab drill "$d" --count "$COUNT" --json > "$out/$d.json" || true
  cp -r /run/vigil-lab "$out/logs-$d" 2>/dev/null && find "$out/logs-$d" -type f ! -name vigil.log ! -name etcd.log -delete || true
done
$lab down
echo "COUNT=$COUNT DRILLS=\"$DRILLS\" PRUNE_AFTER=$PRUNE_AFTER bash bench/membership/run.sh" > "$out/command"
{
  echo "# Membership drills"
  echo
  echo "Command: \`$(cat "$out/command")\` on $(nproc) cores, kernel $(uname -r)."
  echo "Client outage is the longest gap between answers on the VIP (UDP probe every 10 ms) over the whole drill."
  for d in $DRILLS; do
    echo
    echo "## $d"
    echo
    case $d in prune-*)
      echo "| run | result | victim | pruned | pruned after ms (bound) | etcd answered ms later | client outage ms | holder saw it down ms | members after | what each vigil saw |"
      echo "|---|---|---|---|---|---|---|---|---|---|"
      jq -r '.results[] | "| \(.run) | \(.error // "ok") | \(.prune.victim) | \(.prune.pruned) | \(if .prune.boundMillis then "\(.prune.prunedAfterMillis | round) (\(.prune.boundMillis | round))" else "-" end) | \(.prune.etcdAnsweredAfterMillis // "-" | if type == "number" then round else . end) | \(.outageMillis | round) | \(.prune.holderSawDownMillis // "-") | \(.prune.members | join(",")) | \(.prune.witnesses // "") |"' "$out/$d.json"
      continue
    esac
    if [ "$d" = recover ]; then
      echo "VIP back: from the start of \`vigil members recover\` to the VIP answering steadily (bound in brackets). Client outage: after that, while 2 members joined."
      echo
      echo "| run | result | survivor | lost | keys back | VIP dark before recover ms | VIP back ms (bound) | client outage ms | split brain | phases (ms) |"
      echo "|---|---|---|---|---|---|---|---|---|---|"
      jq -r '.results[] | "| \(.run) | \(.error // "ok") | \(.recovery.survivor) | \(.recovery.lost | join(",")) | \(.recovery.keysBack)/\(.recovery.keys) | \(.recovery.darkMillis | round) | \(.recovery.backMillis | round) (\(.recovery.boundMillis | round)) | \(.outageMillis | round) | \(.splitBrain) | \([.phases[]? | "\(.name) \(.millis | round)"] | join("; ")) |"' "$out/$d.json"
      continue
    fi
    echo "| run | result | client outage ms | holder before -> after | split brain | phases (ms) |"
    echo "|---|---|---|---|---|---|"
    jq -r '.results[] | "| \(.run) | \(.error // "ok") | \(.outageMillis | round) | \(.before) -> \(.after) | \(.splitBrain) | \([.phases[]? | "\(.name) \(.millis | round)"] | join("; ")) |"' "$out/$d.json"
  done
} > "$out/summary.md"
cat "$out/summary.md"
