#!/usr/bin/env bash
# The lab demo: builds a 3-node control plane in network namespaces (real etcd
# and vigil on each node, a load balancer on the VIP, --prune-after 10s),
# runs every failover drill once, two load balancer drills and the
# replacement of a dead VIP holder, prints the outage each one caused and a
# summary, and removes the lab. Then 20 s of randomized chaos (pause, freeze, stray VIPs in every form, link
# down, etcd latency and loss, an impostor etcd, ...) on a fresh lab, with the
# one-holder invariant sampled on every node.
#
#   bash hack/demo.sh           about 5 minutes from a fresh machine
#   bash hack/demo.sh --full    every drill: failover drills 3 times, every
#                               membership and prune drill, 60 s of chaos
#
# Needs root. Other arguments go to vigil-lab demo (vigil-lab demo --help).
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/deps.sh ip nft
hack/build.sh
chaos=${CHAOS_DURATION:-20s}
for a in "$@"; do
  [ "$a" = --full ] && chaos=${CHAOS_DURATION:-60s}
done
bin/vigil-lab down >/dev/null 2>&1 || true
start=$SECONDS
bin/vigil-lab demo --prune-after 10s "$@"
bin/vigil-lab chaos --duration "$chaos" --seed "${CHAOS_SEED:-$RANDOM}" --logs "${TMPDIR:-/tmp}/vigil-chaos-logs"
echo "demo: drills and chaos took $((SECONDS - start)) s"
