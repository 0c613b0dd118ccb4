#!/usr/bin/env bash
# Where does a balancer spend per connection? In the bench lab, ROUNDS
# rounds (default 3), in turn for vigil's balancer (VIP:7443), a minimal Go
# proxy (bench/lb/miniproxy, VIP:9443), a minimal Go epoll event loop
# (bench/lb/eproxy, VIP:9543) and HAProxy with kubeadm's recipe (VIP:8443),
# all on the VIP holder over the same three backends: 8 clients
# open connections for 8 s (vigil-lab loadgen --mode conns), and the
# balancer's CPU time (utime+stime from /proc) and context switches (every
# thread's) are read before and after; then one client opens connections
# one after another for 3 s (--mode connect) for the new-connection
# latency; then 4 clients read bulk data for 5 s (--mode throughput), and
# the balancer's CPU time is read around it again. Prints and keeps, in
# results/<timestamp>-cpu/, connections per second, CPU µs and context
# switches per connection, connect p50, MiB/s and CPU ms per GiB moved.
# Each balancer runs in a session, so a scheduler autogroup, of its own, as
# the lab starts vigil and bench-lb starts HAProxy: where the kernel groups
# tasks by session, a balancer sharing the load generator's group gets more
# CPU than one alone (bench/lb/results/20261203-202022-autogroup/NOTE).
# Usage, as root: bash bench/lb/cpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh ip haproxy jq
hack/build.sh
GOTOOLCHAIN=local CGO_ENABLED=0 go build -o bin/miniproxy ./bench/lb/miniproxy
GOTOOLCHAIN=local CGO_ENABLED=0 go build -o bin/eproxy ./bench/lb/eproxy
ROUNDS=${ROUNDS:-3}
out=bench/lb/results/$(date -u +%Y%m%d-%H%M%S)-cpu
mkdir -p "$out"
lab=bin/vigil-lab
pids=()
tmp=""
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; $lab down >/dev/null 2>&1 || true; [ -z "$tmp" ] || rm -rf "$tmp"; }
trap cleanup EXIT
$lab down >/dev/null 2>&1 || true
$lab up --nodes 3 --lb-port 7443 --backend-port 7000 --health-port 6443 >/dev/null
holder=$($lab status --json | jq -r '.vipHolders[0]')
i=${holder#n}
vigil_pid=$(jq -r ".nodes[$((i - 1))].pids.vigil" /run/vigil-lab/state.json)
vip=10.250.0.100
backends="10.250.0.11:7000 10.250.0.12:7000 10.250.0.13:7000"
# The HAProxy configuration bench-lb runs (kubeadm's recipe), from the same file.
servers=""
for i in 1 2 3; do servers+="    server n$i 10.250.0.1$i:7000 check port 6443"$'\n'; done
tmp=$(mktemp -d)
awk -v sock="$tmp/haproxy.sock" -v bind="$vip:8443" -v servers="${servers%$'\n'}" \
  '{ gsub(/@STATS_SOCKET@/, sock); gsub(/@BIND@/, bind); gsub(/@SERVERS@/, servers); print }' \
  internal/lab/haproxy.cfg > "$out/haproxy.cfg"
setsid ip netns exec "vlab-$holder" haproxy -f "$out/haproxy.cfg" -db >/dev/null 2>&1 </dev/null &
pids+=($!)
haproxy_pid=$!
# shellcheck disable=SC2086
setsid ip netns exec "vlab-$holder" bin/miniproxy "$vip:9443" $backends >/dev/null 2>&1 </dev/null &
pids+=($!)
mini_pid=$!
# shellcheck disable=SC2086
setsid ip netns exec "vlab-$holder" bin/eproxy "$vip:9543" $backends >/dev/null 2>&1 </dev/null &
pids+=($!)
eproxy_pid=$!
sleep 3
# Every balancer must be the process whose CPU time is read, in a scheduler
# autogroup of its own, as the lab starts vigil (see the header).
for p in "$vigil_pid:vigil" "$haproxy_pid:haproxy" "$mini_pid:miniproxy" "$eproxy_pid:eproxy"; do
  pid=${p%%:*} want=${p#*:}
  [ "$(cat /proc/"$pid"/comm)" = "$want" ] || { echo "cpu.sh: pid $pid is $(cat /proc/"$pid"/comm), not $want" >&2; exit 1; }
  echo "$want $(cat /proc/"$pid"/autogroup 2>/dev/null || echo 'no autogroup')"
done > "$out/autogroups"
echo "load generator $(cat /proc/self/autogroup 2>/dev/null || echo 'no autogroup')" >> "$out/autogroups"
[ ! -r /proc/self/autogroup ] || [ "$(sort -u -k2,2 "$out/autogroups" | wc -l)" = 5 ] || { echo "cpu.sh: the balancers do not each have their own scheduler autogroup:" >&2; cat "$out/autogroups" >&2; exit 1; }
ctxsw() { cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ { s += $2 } END { print s }'; }
cpu() { awk '{ print $14 + $15 }' /proc/"$1"/stat; }
hz=$(getconf CLK_TCK)
measure() { # name pid port
  local c0 t0 c1 t1 n
  c0=$(ctxsw "$2"); t0=$(cpu "$2")
  ip netns exec vlab-cl $lab loadgen --mode conns --target "$vip:$3" --workers 8 --duration 8s > "$out/load.json"
  c1=$(ctxsw "$2"); t1=$(cpu "$2")
  n=$(jq .count "$out/load.json")
  ip netns exec vlab-cl $lab loadgen --mode connect --target "$vip:$3" --duration 3s > "$out/connect.json"
  t2=$(cpu "$2")
  ip netns exec vlab-cl $lab loadgen --mode throughput --target "$vip:$3" --workers 4 --duration 5s > "$out/bulk.json"
  t3=$(cpu "$2")
  jq -n --argjson p50 "$(jq '.p50us | round' "$out/connect.json")"  --arg name "$1" --argjson round "$round" --argjson n "$n" --argjson ps "$(jq .perSecond "$out/load.json")" \
    --argjson cpu "$(( (t1 - t0) * 1000000 / hz ))" --argjson cs "$((c1 - c0))" \
    --argjson mibs "$(jq .perSecond "$out/bulk.json")" --argjson bcpu "$(( (t3 - t2) * 1000 / hz ))" \
    '{target: $name, round: $round, conns: $n, perSecond: ($ps | round), cpuMicrosPerConn: ($cpu / $n | round), ctxSwitchesPerConn: ($cs / $n * 100 | round / 100), connectP50us: $p50,
      mibPerSecond: ($mibs | round), cpuMillisPerGiB: ($bcpu / ($mibs * 5 / 1024) | round)}'
}
for round in $(seq 1 "$ROUNDS"); do
  measure vigil "$vigil_pid" 7443
  measure miniproxy "$mini_pid" 9443
  measure eproxy "$eproxy_pid" 9543
  measure haproxy "$haproxy_pid" 8443
done | jq -s . > "$out/results.json"
rm -f "$out/load.json" "$out/connect.json" "$out/bulk.json"
echo "ROUNDS=$ROUNDS bash bench/lb/cpu.sh" > "$out/command"
{ uname -r; nproc; haproxy -v | sed -n 1p; git rev-parse --short HEAD; echo "sched_autogroup_enabled $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo absent)"; } > "$out/machine"
{
  echo "| target | round | conns/s | CPU µs per connection | context switches per connection | connect p50 µs | MiB/s | CPU ms per GiB |"
  echo "|---|---|---|---|---|---|---|---|"
  jq -r '.[] | "| \(.target) | \(.round) | \(.perSecond) | \(.cpuMicrosPerConn) | \(.ctxSwitchesPerConn) | \(.connectP50us) | \(.mibPerSecond) | \(.cpuMillisPerGiB) |"' "$out/results.json"
  echo
  echo "Medians:"
  echo
  echo "| target | conns/s | CPU µs per connection | context switches per connection | connect p50 µs | MiB/s | CPU ms per GiB |"
  echo "|---|---|---|---|---|---|---|"
  jq -r 'def median: sort | .[(length - 1) / 2 | floor];
    group_by(.target)[] | "| \(.[0].target) | \(map(.perSecond) | median) | \(map(.cpuMicrosPerConn) | median) | \(map(.ctxSwitchesPerConn) | median) | \(map(.connectP50us) | median) | \(map(.mibPerSecond) | median) | \(map(.cpuMillisPerGiB) | median) |"' "$out/results.json"
} > "$out/summary.md"
cat "$out/summary.md"
