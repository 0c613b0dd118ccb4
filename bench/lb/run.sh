#!/usr/bin/env bash
# Load balancer benchmark: vigil vs HAProxy (Debian package, kubeadm's
# recommended haproxy.cfg) side by side in one lab, over the same three
# backends, driven from the same client namespace. See `vigil-lab bench-lb
# --help` for what is measured. RUNS runs of ROUNDS rounds each; every run is
# kept as JSON in results/<timestamp>/, with summary.md.
# Usage, as root: bash bench/lb/run.sh   (RUNS=3 ROUNDS=3 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh ip haproxy jq
hack/build.sh
RUNS=${RUNS:-3}
ROUNDS=${ROUNDS:-3}
EJECTIONS=${EJECTIONS:-3}
FLOOD=${FLOOD:-0} # connection attempts at the end of each run (0: none)
FLOOD_SOURCES=${FLOOD_SOURCES:-1} # source addresses they come from (5 or more meet the total limit)
LOOPS=${LOOPS:-0} # vigil --lb-event-loops (0: one per CPU; -1: none, every connection on goroutines)
out=bench/lb/results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
lab=bin/vigil-lab
trap '$lab down >/dev/null 2>&1 || true' EXIT
$lab down >/dev/null 2>&1 || true
$lab up --nodes 3 --lb-port 7443 --backend-port 7000 --health-port 6443 --lb-event-loops "$LOOPS" >/dev/null
for run in $(seq 1 "$RUNS"); do
  echo "== run $run"
  $lab bench-lb --rounds "$ROUNDS" --ejections "$EJECTIONS" --flood "$FLOOD" --flood-sources "$FLOOD_SOURCES" --json > "$out/run-$run.json"
done
$lab down
echo "RUNS=$RUNS ROUNDS=$ROUNDS EJECTIONS=$EJECTIONS FLOOD=$FLOOD FLOOD_SOURCES=$FLOOD_SOURCES LOOPS=$LOOPS bash bench/lb/run.sh" > "$out/command"
{ uname -r; nproc; haproxy -v | sed -n 1p; git rev-parse --short HEAD; echo "sched_autogroup_enabled $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo absent)"; } > "$out/machine"
bench/lb/summarize.sh "$out"
