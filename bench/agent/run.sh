#!/usr/bin/env bash
# vigil agent benchmarks; results go to bench/agent/results/<timestamp>/.
#   1. latency.txt: what the agent adds to a request (p50/p99), direct vs
#      through the agent, new connection and kept-alive, RUNS runs.
#   2. load.txt: control-plane load of N = 10, 100, 1000 agents (go test
#      -bench, RUNS runs each).
#   3. rss.txt: resident memory of the real vigil-agent process on the lab's
#      workers, with 5 control-plane nodes (5 API server and 5 etcd
#      backends), after a minute of client traffic (RUNS labs).
#   4. fanout.txt: what N agents' EndpointSlice watches cost a real
#      kube-apiserver, and how fast a change reaches all N (RUNS runs).
#   5. fleet.txt: 1,000 agents with and without the agent feed, 5,000 with
#      it (5,000 checking everything themselves would only measure two
#      saturated cores): steady load, and how long a killed and an added
#      API server take to reach 50/99/100 % of them (RUNS runs each).
# Usage, as root: bash bench/agent/run.sh   (RUNS=3 by default)
#   PARTS="rss" bash bench/agent/run.sh runs only some parts (default:
#   "latency load rss fanout fleet").
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh ip jq curl
hack/build.sh
export GOTOOLCHAIN=local
RUNS=${RUNS:-3}
PARTS=${PARTS:-latency load rss fanout fleet}
part() { [[ " $PARTS " == *" $1 "* ]]; }
out=bench/agent/results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
echo "RUNS=$RUNS PARTS=\"$PARTS\" bash bench/agent/run.sh  # $(git rev-parse --short HEAD), $(nproc) cores, $(uname -r)" > "$out/command"

if part latency; then
echo "== latency"
for run in $(seq 1 "$RUNS"); do
  echo "-- run $run"
  go run ./bench/agent/latency -n 3000
done | tee "$out/latency.txt"
fi

if part load; then
echo "== control-plane load"
go test ./bench/agent -run "^$" -bench ControlPlaneLoad -benchtime 1x -count "$RUNS" -timeout 60m 2>&1 \
  | grep -E '^(Benchmark|goos|goarch|cpu|pkg|PASS|ok|FAIL|--- FAIL|    load_test)' | tee "$out/load.txt"
fi

if part fleet; then
echo "== fleet (agent feed)"
fleet() {
  go test ./bench/agent -run "^$" -bench Fleet -benchtime 1x -count "$RUNS" -timeout 90m 2>&1 \
    | grep -E '^(Benchmark|goos|goarch|cpu|pkg|PASS|ok|FAIL|--- FAIL|    fleet_test)'
}
# 5,000 start 40 ms apart (200 s): 10 ms apart, on two cores, they fell
# behind before their feed was fresh (fleetSpacing in fleet_test.go).
{ VIGIL_BENCH_AGENTS=1000 fleet; VIGIL_BENCH_AGENTS=5000 VIGIL_BENCH_FEED=on VIGIL_BENCH_SPACING=40ms fleet; } | tee "$out/fleet.txt"
fi

if part rss; then
echo "== agent memory (lab, 5 control-plane nodes, 2 workers, $RUNS labs)"
lab=bin/vigil-lab
trap '$lab down >/dev/null 2>&1 || true' EXIT
echo "lab worker binary agent-pid backends(api+etcd) VmRSS RssAnon RssFile VmHWM" > "$out/rss.txt"
for run in $(seq 1 "$RUNS"); do
  $lab down >/dev/null 2>&1 || true
  $lab up --nodes 5 --workers 2 >/dev/null
  sleep 60
  for w in $(jq -r '.workers[].name' /run/vigil-lab/state.json); do
    pid=$(jq -r ".workers[] | select(.name==\"$w\") | .pids.agent" /run/vigil-lab/state.json)
    nb=$(ip netns exec "vlab-$w" curl -s 127.0.0.1:9559/status | jq '[.upstreams[].backends[] | select(.source=="cluster")] | length')
    kb() { awk -v k="$1:" '$1==k{print $2 "kB"}' "/proc/$pid/status"; }
    echo "$run $w $(basename "$(readlink "/proc/$pid/exe")") $pid $nb $(kb VmRSS) $(kb RssAnon) $(kb RssFile) $(kb VmHWM)"
  done | tee -a "$out/rss.txt"
done
$lab down
fi

if part fanout; then
echo "== EndpointSlice watches (real kube-apiserver)"
hack/build-kube-apiserver.sh
go test ./bench/agent -run "^$" -bench EndpointSliceFanout -benchtime 1x -count "$RUNS" -timeout 60m 2>&1 \
  | sed -E 's/\{"level":"error".*\}$//' \
  | grep -E '^(Benchmark.*op|goos|goarch|cpu|pkg|PASS|ok|FAIL|--- FAIL|    slices_test)' | tee "$out/fanout.txt"
fi
