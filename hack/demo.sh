#!/usr/bin/env bash
# The lab demo: builds a 3-node control plane in network namespaces (real etcd
# and vigil on each node), runs every failover drill a few times, prints the
# outage each one caused and a summary, and removes the lab. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/deps.sh ip
hack/build.sh
bin/vigil-lab down >/dev/null 2>&1 || true
exec bin/vigil-lab demo "$@"
