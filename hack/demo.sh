#!/usr/bin/env bash
# The lab demo: builds a 3-node control plane in network namespaces (real etcd
# and vigil on each node, --prune-after 10s), runs every failover drill a few
# times and every membership and prune drill once, prints the outage each one
# caused and a summary, and removes the lab. Then one minute
# of randomized chaos (every fault type: pause, freeze, stray VIP, link down,
# duplicate node name, ...) on a fresh lab, with the one-holder invariant
# sampled on every node. Needs root. Arguments go to vigil-lab demo.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/deps.sh ip nft
hack/build.sh
bin/vigil-lab down >/dev/null 2>&1 || true
bin/vigil-lab demo --prune-after 10s "$@"
bin/vigil-lab chaos --duration "${CHAOS_DURATION:-60s}" --seed "${CHAOS_SEED:-$RANDOM}" --logs "${TMPDIR:-/tmp}/vigil-chaos-logs"
