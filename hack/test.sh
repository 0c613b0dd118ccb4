#!/usr/bin/env bash
# Runs every test: unit tests, integration tests against embedded etcd and a
# real kube-apiserver, and, as root, end-to-end tests in network namespaces
# (the lab: real etcd processes, vigil, a kubeadm cluster). Run it as root:
# tests that need root fail here (VIGIL_REQUIRE_ROOT=1) rather than skip.
# Every package but the lab runs with -race. Leaves no namespace behind, and
# ends with each package's time and the total.
#
# The order is chosen for a cold machine, where building the Kubernetes
# binaries from source is most of the work: that build starts first, at
# idle CPU priority (SCHED_IDLE: it only gets CPU nothing else wants), and
# runs beside the lab's own tests, which spend most of their time waiting
# for timers. The tests that need those binaries run once it is done.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/deps.sh ip nft containerd runc conntrack cni cgo bird chrt
export GOTOOLCHAIN=local
# Root-only tests fail here instead of skipping: this script runs as root
# with every tool, so a skip would be a test that silently stopped running.
export VIGIL_REQUIRE_ROOT=1
begin=$SECONDS
log=$(mktemp -d)
kubepid=
cleanup() {
  [ -n "$kubepid" ] && kill -- "-$kubepid" 2>/dev/null || true
  # Whatever happened, remove lab namespaces a crashed test may have left.
  bin/vigil-lab down >/dev/null 2>&1 || true
  rm -rf "$log"
}
trap cleanup EXIT
phases=()
phase() { phases+=("$(printf '%-44s %5d s' "$1" "$2")"); }

t=$SECONDS
hack/build.sh
# Lab namespaces left by a run that was killed would make the lab tests
# refuse to start.
bin/vigil-lab down >/dev/null 2>&1 || true
phase "vigil binaries" $((SECONDS - t))

# The real Kubernetes binaries (kube-apiserver for the Kubernetes tests;
# kubelet, kubeadm and the rest for the kubeadm lab), the images kubeadm
# runs, and vigil's own image (both architectures; the kubeadm lab runs it,
# and TestImageRunsInContainerd imports it into a real containerd): about 21
# minutes beside the lab the first time on two cores, seconds afterwards
# (Go build cache, stamps in bin/). In the background, at idle priority, in
# its own process group; nothing that runs meanwhile needs them.
export VIGIL_IMAGE_ARCHIVE="$PWD/bin/vigil-image.oci.tar"
t=$SECONDS
setsid chrt --idle 0 hack/build-kube-images.sh >"$log/kube-build.log" 2>&1 &
kubepid=$!

# The lab drives the binaries just built.
export VIGIL_BIN="$PWD/bin/vigil" VIGIL_LAB_BIN="$PWD/bin/vigil-lab"
status=0
# gotest NAME ARGS...: go test, its output kept for the summary.
runs=0
gotest() {
  local name=$1 s=$SECONDS rc=0
  shift
  runs=$((runs + 1))
  go test "$@" 2>&1 | tee "$log/$runs.out" || rc=${PIPESTATUS[0]}
  phase "$name" $((SECONDS - s))
  [ "$rc" = 0 ] || status=$rc
}

# The lab package (real etcd processes, vigil in namespaces, minutes of
# chaos) runs alone: on two cores its load made the embedded-etcd tests of
# other packages miss their deadlines. It is built without the race
# detector, as are the vigil and vigil-lab binaries it starts.
gotest "lab (without Kubernetes binaries)" -count=1 -timeout 30m -skip '^(TestKubeadmLab|TestLeaseLab)$' ./internal/lab/

if ! wait "$kubepid"; then
  kubepid=
  cat "$log/kube-build.log" >&2
  echo "hack/test.sh: building the Kubernetes binaries failed" >&2
  exit 1
fi
kubepid=
phase "Kubernetes binaries, images (beside the lab)" $((SECONDS - t))
export VIGIL_REQUIRE_KUBE_APISERVER=1 VIGIL_REQUIRE_KUBEADM_LAB=1

gotest "unit and integration (-race)" -race -count=1 -timeout 20m $(go list ./... | grep -v /internal/lab$)
gotest "lab: kubeadm and Lease" -count=1 -timeout 20m -run '^(TestKubeadmLab|TestLeaseLab)$' ./internal/lab/

echo
echo "== hack/test.sh summary"
# Each package's time, slowest first (the lab package twice: its two runs).
cat "$log"/*.out | awk '($1 == "ok" || $1 == "FAIL") && $2 ~ /^github.com\// {
    pkg = $2; sub(/^github.com\/vigil-ha\/vigil\//, "", pkg); t = $3; sub(/s$/, "", t)
    printf "%8.1f s  %-4s %s\n", t, $1, pkg
  }' | sort -rn
for p in "${phases[@]}"; do echo "$p"; done
printf '%-44s %5d s\n' "total" $((SECONDS - begin))
[ "$status" = 0 ] && echo "PASS" || echo "FAIL"
exit $status
