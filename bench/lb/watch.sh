#!/usr/bin/env bash
# Watch drills: are established connections through the load balancer kept
# when a backend is only paused, and ended when it is killed? In a lab with
# vigil's load balancer on VIP:6443 in front of the stand-in API servers,
# COUNT runs (default 10) each of `vigil-lab drill backend-paused` (SIGSTOP a
# non-holder's API server for 1.5 s: 0 of its watches may be reset) and
# `backend-killed` (SIGKILL it: all of its watches must end within 1 s).
# Every run is kept in results/<timestamp>-watch/, as JSON and as the text
# the drill printed.
# Usage, as root: bash bench/lb/watch.sh   (COUNT=10 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh ip jq
hack/build.sh
COUNT=${COUNT:-10}
out=bench/lb/results/$(date -u +%Y%m%d-%H%M%S)-watch
mkdir -p "$out"
lab=bin/vigil-lab
trap '$lab down >/dev/null 2>&1 || true' EXIT
$lab down >/dev/null 2>&1 || true
$lab up --nodes 3 --lb-port 6443 --backend-port 6443 >/dev/null
status=0
for d in backend-paused backend-killed; do
  $lab drill "$d" --count "$COUNT" --json > "$out/$d.json" || status=1
  jq -r '.results[] | "\(.drill) #\(.run) target \(.target): watches \(.watch.watches), on target \(.watch.onTarget), reset \(.watch.reset), elsewhere \(.watch.resetElsewhere), resumed \(.watch.resumed // 0), ended median \(.watch.endedMedianMillis // 0 | . * 10 | round / 10)ms worst \(.watch.endedWorstMillis // 0 | . * 10 | round / 10)ms  VIP \(.before) -> \(.after)  \(.error // "ok")"' "$out/$d.json" | tee "$out/$d.txt"
done
$lab down
echo "COUNT=$COUNT bash bench/lb/watch.sh" > "$out/command"
{ uname -r; nproc; git rev-parse --short HEAD; } > "$out/machine"
exit $status
