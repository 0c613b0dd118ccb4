#!/usr/bin/env bash
# Handoff benchmark: vigil handoff, run on the VIP holder, COUNT times in a
# 3-node lab (real etcd, vigil with its load balancer on VIP:6443, the
# lab's stand-in API servers). Each run measures the client outage (probes
# of the VIP every 10 ms) and, for 8 keep-alive clients sending a request
# every 10-40 ms through the load balancer, the requests lost: written
# before the old holder let go (in flight), or after (on a connection it
# had already closed while idle, before the client saw the close).
# Goals (issue 17): outage <= 50 ms and 0 lost, in every run.
# Every run is kept as JSON in results/<timestamp>/.
# Usage, as root: COUNT=10 bash bench/handoff/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh ip jq
hack/build.sh
COUNT=${COUNT:-10}
out=bench/handoff/results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
lab=bin/vigil-lab
trap '$lab down >/dev/null 2>&1 || true' EXIT
$lab down >/dev/null 2>&1 || true
$lab up --nodes 3 >/dev/null
$lab drill handoff --count "$COUNT" --json > "$out/handoff.json" || true
echo "COUNT=$COUNT bash bench/handoff/run.sh" > "$out/command"
jq -r '
  "runs \(.results | length), failed \(.summary[0].failed), split-brain \(.summary[0].splitBrains)",
  "outage ms: median \(.summary[0].medianMillis), worst \(.summary[0].maxMillis); runs over 50 ms: \([.results[] | select(.outageMillis > 50)] | length)",
  "keep-alive requests \([.results[].handoff.requests] | add); lost in flight (written before the old holder let go) \([.results[].handoff.lostInFlight] | add), in \([.results[] | select(.handoff.lostInFlight > 0)] | length) runs; sent on a connection already closed while idle \([.results[].handoff.lostRacingClose] | add); failed on a new connection \([.results[].handoff.failedNew] | add)",
  "drain: released without a quiet moment in \([.results[].handoff.output[] | select(test("without a quiet moment"))] | length) runs"
' "$out/handoff.json" | tee "$out/summary.txt"
