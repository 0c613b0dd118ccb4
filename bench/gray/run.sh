#!/usr/bin/env bash
# Gray-failure sweep: a fresh 3-node lab (real etcd, default timings: lease
# 800ms, renew deadline 500ms, retry 100ms), then `vigil-lab gray sweep`:
# every etcd answer to every client late by each of LATENCIES in turn, then
# each of LOSSES (% of packets dropped on every path between the nodes, both
# ways, each packet once by its receiver), each held EACH. RUNS runs, each in a lab of its own. Per step: the
# client's longest outage on the VIP (probed every 10 ms), VIP moves and
# dual-holder samples (every node's addresses read every 20 ms), the time no
# node held the VIP, the holder's least renewal margin (time left to its
# deadline when a renewal was answered), and how soon after the heal the
# client was answered again.
# Results: results/<timestamp>/run-N.json and summary.md (median and worst
# over the runs).
# Usage, as root: bash bench/gray/run.sh   (RUNS=3 EACH=30s by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh ip nft jq
hack/build.sh
RUNS=${RUNS:-3}
EACH=${EACH:-30s}
LATENCIES=${LATENCIES:-0s,50ms,100ms,150ms,200ms,300ms,400ms,500ms,700ms}
LOSSES=${LOSSES:-1,5,20}
out=bench/gray/results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
lab=bin/vigil-lab
trap '$lab down >/dev/null 2>&1 || true' EXIT
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "command RUNS=$RUNS EACH=$EACH LATENCIES=$LATENCIES LOSSES=$LOSSES bash bench/gray/run.sh"
  echo "machine $(nproc) cores, $(uname -r)"
} > "$out/command"
for run in $(seq 1 "$RUNS"); do
  $lab down >/dev/null 2>&1 || true
  echo "== run $run of $RUNS"
  $lab up --nodes 3 --impl vigil >/dev/null
  $lab gray sweep --latencies "$LATENCIES" --losses "$LOSSES" --each "$EACH" --json > "$out/run-$run.json"
  jq -r '.[] | "  \(.fault): outage \(.outageMillis)ms, VIP moves \(.vipMoves), dual-holder samples \(.dualSamples), least margin \(.minMarginMillis)ms, back \(.backMillis)ms after heal"' "$out/run-$run.json"
done
$lab down >/dev/null 2>&1 || true
bash bench/gray/summarize.sh "$out" | tee "$out/summary.md"
