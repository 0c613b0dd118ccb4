#!/usr/bin/env bash
# Runs every test: unit tests, integration tests against embedded etcd, and,
# as root, end-to-end tests in network namespaces (VIP, gratuitous ARP, a
# failover drill against real etcd processes). Run it as root: tests that need
# root fail here (VIGIL_REQUIRE_ROOT=1) rather than skip. Every package but the
# lab runs with -race. Leaves no namespace behind.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/deps.sh ip nft containerd runc conntrack cni cgo bird
export GOTOOLCHAIN=local
# Root-only tests fail here instead of skipping: this script runs as root
# with every tool, so a skip would be a test that silently stopped running.
export VIGIL_REQUIRE_ROOT=1
hack/build.sh
# Lab namespaces left by a run that was killed would make the lab tests
# refuse to start.
bin/vigil-lab down >/dev/null 2>&1 || true
# vigil's image (both architectures), imported into a real containerd and run
# by TestImageRunsInContainerd.
hack/build-image.sh
export VIGIL_IMAGE_ARCHIVE="$PWD/bin/vigil-image.oci.tar"
# The real Kubernetes binaries (kube-apiserver for the Kubernetes tests;
# kubelet, kubeadm and the rest for the kubeadm lab) and the images kubeadm
# runs: about 25 minutes the first time on two cores, seconds afterwards
# (Go build cache, stamps in bin/).
hack/build-kube-images.sh
export VIGIL_REQUIRE_KUBE_APISERVER=1 VIGIL_REQUIRE_KUBEADM_LAB=1
# The lab test drives the binaries just built.
export VIGIL_BIN="$PWD/bin/vigil" VIGIL_LAB_BIN="$PWD/bin/vigil-lab"
status=0
# The lab package (real etcd processes, vigil in namespaces, minutes of
# chaos) runs after the others, not beside them: on two cores its load made
# the embedded-etcd membership tests of other packages miss their deadlines.
# Every package but the lab runs under the race detector (the vigil and
# vigil-lab binaries the tests start are built without it).
go test -race -count=1 -timeout 20m $(go list ./... | grep -v /internal/lab$) || status=$?
go test -count=1 -timeout 35m ./internal/lab/ || status=$?
# Whatever happened, remove lab namespaces a crashed test may have left.
bin/vigil-lab down >/dev/null 2>&1 || true
exit $status
