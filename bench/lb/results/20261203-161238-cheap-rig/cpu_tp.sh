#!/usr/bin/env bash
# CPU per GiB of each proxy in throughput mode
cd /work/main
lab=/tmp/vigil-lab2
holder=$($lab status --json | jq -r '.vipHolders[0]')
i=${holder#n}
vpid=$(jq -r ".nodes[$((i - 1))].pids.vigil" /run/vigil-lab/state.json)
vip=10.250.0.100
backends="10.250.0.11:7000 10.250.0.12:7000 10.250.0.13:7000"
pkill -f 'haproxy -f /tmp/haproxy.cfg'; pkill -x miniproxy
ip netns exec vlab-$holder haproxy -f /tmp/haproxy.cfg -db >/dev/null 2>&1 &
hpid=$!
ip netns exec vlab-$holder bin/miniproxy $vip:9443 $backends >/dev/null 2>&1 &
mpid=$!
sleep 2
hpid=$(pgrep -f 'haproxy -f /tmp/haproxy.cfg' | tail -1)
ticks() { awk '{print $14+$15}' /proc/$1/stat; }
for r in 1 2 3; do
for pair in "7443 $vpid" "8443 $hpid" "9443 $mpid"; do
  set -- $pair
  t0=$(ticks $2)
  mibs=$(ip netns exec vlab-cl $lab loadgen --mode throughput --workers ${STREAMS:-4} --duration 4s --target $vip:$1 | jq .perSecond)
  t1=$(ticks $2)
  awk -v p=$1 -v m=$mibs -v t=$((t1-t0)) 'BEGIN{printf "%s %.0f MiB/s  cpu %.2f s of 4 s  %.1f ms CPU per GiB\n", p, m, t/100, (t*10)/(m*4/1024)}'
done; done
pkill -f 'haproxy -f /tmp/haproxy.cfg'; pkill -x miniproxy
