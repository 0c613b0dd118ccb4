#!/usr/bin/env bash
# Runs every test: unit tests, integration tests against embedded etcd, and,
# as root, end-to-end tests in network namespaces (VIP, gratuitous ARP, a
# failover drill against real etcd processes). Tests that need root skip with
# a message otherwise. Leaves no namespace behind.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/deps.sh ip nft containerd runc conntrack cni
export GOTOOLCHAIN=local
hack/build.sh
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
go test -count=1 -timeout 20m $(go list ./... | grep -v /internal/lab$) || status=$?
go test -count=1 -timeout 20m ./internal/lab/ || status=$?
# Whatever happened, remove lab namespaces a crashed test may have left.
bin/vigil-lab down >/dev/null 2>&1 || true
exit $status
