#!/usr/bin/env bash
# Same HAProxy (bench-lb's kubeadm-recipe haproxy.cfg) twice in one lab, one
# started with setsid (its own scheduler autogroup, as the lab starts vigil
# and as bench-lb starts HAProxy), one without (in this script's session,
# with the load generator), and vigil; ROUNDS rounds rotating the order:
# throughput (4 streams, 5 s), conns (8 workers, 5 s), connect (2000).
# Usage, as root, from the repository: bash <this file> OUTDIR
set -euo pipefail
out=$1
lab=bin/vigil-lab
ROUNDS=${ROUNDS:-4}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; $lab down >/dev/null 2>&1 || true; }
trap cleanup EXIT
$lab down >/dev/null 2>&1 || true
$lab up --nodes 3 --lb-port 7443 --backend-port 7000 --health-port 6443 >/dev/null
holder=$($lab status --json | jq -r '.vipHolders[0]')
vip=10.250.0.100
conf() { # port
  cat <<CFG
defaults
    mode                    http
    option                  httplog
    option                  dontlognull
    option http-server-close
    option forwardfor       except 127.0.0.0/8
    option                  redispatch
    retries                 1
    timeout http-request    10s
    timeout queue           20s
    timeout connect         5s
    timeout client          20s
    timeout server          20s
    timeout http-keep-alive 10s
    timeout check           10s
frontend apiserver
    bind $vip:$1
    mode tcp
    option tcplog
    default_backend apiserverbackend
backend apiserverbackend
    option httpchk GET /healthz
    http-check expect status 200
    mode tcp
    option ssl-hello-chk
    balance     roundrobin
    server n1 10.250.0.11:7000 check port 6443
    server n2 10.250.0.12:7000 check port 6443
    server n3 10.250.0.13:7000 check port 6443
CFG
}
conf 8443 > "$out/own.cfg"
conf 8444 > "$out/shared.cfg"
setsid ip netns exec "vlab-$holder" haproxy -f "$out/own.cfg" -db >/dev/null 2>&1 < /dev/null &
pids+=($!)
ip netns exec "vlab-$holder" haproxy -f "$out/shared.cfg" -db >/dev/null 2>&1 &
pids+=($!)
sleep 5
{
  echo "vigil $(cat /proc/"$(jq -r ".nodes[$(( ${holder#n} - 1 ))].pids.vigil" /run/vigil-lab/state.json)"/autogroup)"
  for p in $(pgrep -x haproxy); do echo "haproxy $(tr '\0' ' ' < /proc/"$p"/cmdline) $(cat /proc/"$p"/autogroup)"; done
  echo "this script $(cat /proc/self/autogroup)"
} > "$out/autogroups"
targets=(vigil:7443 haproxy-own-group:8443 haproxy-shared-group:8444)
lg() { ip netns exec vlab-cl $lab loadgen "$@"; }
for round in $(seq 1 "$ROUNDS"); do
  for i in 0 1 2; do
    t=${targets[$(( (i + round) % 3 ))]}
    name=${t%%:*}; port=${t##*:}
    tp=$(lg --mode throughput --target "$vip:$port" --workers 4 --duration 5s | jq .perSecond)
    cs=$(lg --mode conns --target "$vip:$port" --workers 8 --duration 5s | jq .perSecond)
    cp=$(lg --mode connect --target "$vip:$port" --samples 2000 | jq .p50us)
    jq -nc --arg t "$name" --argjson r "$round" --argjson tp "$tp" --argjson cs "$cs" --argjson cp "$cp" \
      '{target: $t, round: $r, mibPerSecond: ($tp | round), connsPerSecond: ($cs | round), connectP50us: ($cp | round)}'
  done
done
