#!/usr/bin/env bash
# The kubeadm lab, recorded (docs/kubeadm.md, "A real kubeadm cluster in the
# lab"): how long `vigil-lab up --kubeadm` takes (3 control-plane nodes and 1
# worker, from binaries and images already built), COUNT runs of
# kubeadm-vigil-killed (SIGKILL vigil's container process on the holder)
# and of kubeadm-vigil-oom (the OOM killer kills it), and of
# kubeadm-vigil-restart (a changed manifest: kubelet replaces the pod), one
# kubeadm-certs-renew (renew all, restart etcd and the API servers), then COUNT runs of kubeadm-replace without pruning and COUNT with vigil
# pruning (--prune-after PRUNE_AFTER), each on a fresh lab, and on the second
# lab COUNT runs of kubeadm-recover (2 of 3 machines lost, vigil members
# recover --kubeadm, 2 joins). Every run is kept
# in results/<timestamp>/ as JSON and as the text the drill printed.
# Then, COUNT times on a fresh lab: kubeadm-lease (the move to the Lease
# election) followed by COUNT runs of kubeadm-vigil-killed under the Lease.
# Usage, as root: bash bench/kubeadm/run.sh   (COUNT=3 by default;
# ONLY=lease runs the Lease part alone, ONLY=recover the recoveries)
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/deps.sh ip jq containerd runc conntrack cni
hack/build.sh
hack/build-kube-images.sh
COUNT=${COUNT:-3}
PRUNE_AFTER=${PRUNE_AFTER:-30s}
out=bench/kubeadm/results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
lab=bin/vigil-lab
trap '$lab down >/dev/null 2>&1 || true' EXIT
status=0
drill() { # name, then vigil-lab drill arguments
  local name=$1
  shift
  $lab drill "$@" --json > "$out/$name.json" || status=1
  jq -r '.results[] | "\(.drill) #\(.run): VIP \(.before) -> \(.after), client outage \(.outageMillis | round)ms, split brain \(.splitBrain)\n    phases: \([.phases[]? | "\(.name) \(.millis | round)ms"] | join(", "))\n    \(.kubeadm | "victim \(.victim), new node \(.newNode // "-"), VIP gone after the fault \(.vipGoneMillis // 0 | round)ms, kubelet says \(.terminated // "-"), join failed \(.joinFailed), dead member at join \(.etcdUnhealthyAtJoin), dead member left \(.deadMemberLeft), members after join \(.membersAfterJoin // "-"), Lease holder \(.leaseHolder // "-") (order \((.order // []) | join(","))), requests \(.requests), failed \(.failed) (\(.failedOutside) outside the \(.failoverMillis | round)ms failover window; late answers \(.lateAnswers // 0), while no server answered \(.noServer // 0), on a slow etcd \(.slowStore // 0))\(.recovery | if . then "\n    recovery on \(.survivor) after losing \(.lost | join(",")): keys back \(.keysBack)/\(.keys), API through the VIP \(.backMillis | round)ms after recover (bound \(.boundMillis | round)ms)" else "" end)")\n    \(.error // "ok")"' "$out/$name.json" | tee "$out/$name.txt"
}
up() { # extra vigil-lab up arguments
  $lab down >/dev/null 2>&1 || true
  local start=$SECONDS
  $lab up --kubeadm --nodes 3 --workers 1 "$@" 2>&1 | tee -a "$out/up.txt"
  echo "up $* took $((SECONDS - start)) s" | tee -a "$out/up.txt"
}
lease_runs() {
  for i in $(seq "$COUNT"); do
    up
    drill "lease-$i" kubeadm-lease --count 1
    drill "lease-$i-vigil-killed" kubeadm-vigil-killed --count "$COUNT"
  done
}
case ${ONLY:-all} in
all)
  up
  drill vigil-killed kubeadm-vigil-killed --count "$COUNT"
  drill vigil-oom kubeadm-vigil-oom --count "$COUNT"
  drill vigil-restart kubeadm-vigil-restart --count "$COUNT"
  drill certs-renew kubeadm-certs-renew --count 1
  drill replace-without-pruning kubeadm-replace --count "$COUNT"
  up --prune-after "$PRUNE_AFTER"
  drill replace-with-pruning kubeadm-replace --count "$COUNT"
  drill recover kubeadm-recover --count "$COUNT"
  lease_runs
  ;;
lease) lease_runs ;;
recover)
  up --prune-after "$PRUNE_AFTER"
  drill recover kubeadm-recover --count "$COUNT"
  ;;
*)
  echo "ONLY must be all, lease or recover, not $ONLY" >&2
  exit 2
  ;;
esac
$lab down
echo "ONLY=${ONLY:-all} COUNT=$COUNT PRUNE_AFTER=$PRUNE_AFTER bash bench/kubeadm/run.sh" > "$out/command"
{ uname -r; nproc; git rev-parse --short HEAD; } > "$out/machine"
exit $status
