#!/usr/bin/env bash
# Builds real Kubernetes binaries, pinned by hack/kube-apiserver/go.mod, into
# bin/: by default kube-apiserver (the Kubernetes tests and --apiserver kube),
# and with --all also kubelet, kubeadm, kube-controller-manager and
# kube-scheduler (the kubeadm lab, vigil-lab up --kubeadm).
#
# The version is stamped into each binary (v1.37.2, from go.mod): without it
# they report v0.0.0-master and kubeadm's kubelet version check fails.
#
# Cold, kube-apiserver takes 15-20 minutes on two cores, and the other four
# about 10 more; the Go build cache makes later runs take seconds. A stamp
# beside each binary skips its build when the pinned module has not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
mkdir -p bin

cmds=(kube-apiserver)
if [[ ${1:-} == --all ]]; then
	cmds+=(kubelet kubeadm kube-controller-manager kube-scheduler)
elif [[ $# -gt 0 ]]; then
	echo "usage: hack/build-kube.sh [--all]" >&2
	exit 2
fi

version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' hack/kube-apiserver/go.mod)
[[ $version =~ ^v([0-9]+)\.([0-9]+)\. ]] || { echo "cannot read the k8s.io/kubernetes version from hack/kube-apiserver/go.mod" >&2; exit 1; }
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=${BASH_REMATCH[1]} -X $pkg.gitMinor=${BASH_REMATCH[2]} -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
want=$(cat hack/kube-apiserver/go.mod hack/kube-apiserver/go.sum hack/build-kube.sh | sha256sum | cut -d' ' -f1)

# One go build for every binary due: the packages they share compile once,
# and both cores stay busy until the last link.
todo=()
for cmd in "${cmds[@]}"; do
	stamp=bin/.$cmd.stamp
	if [[ -x bin/$cmd && -f $stamp && $(cat "$stamp") == "$want" ]]; then
		continue
	fi
	todo+=("$cmd")
done
[ ${#todo[@]} -gt 0 ] || exit 0
echo "building ${todo[*]} $version (a cold build takes minutes on two cores)" >&2
start=$SECONDS
(cd hack/kube-apiserver && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "$ldflags" -o ../../bin/ "${todo[@]/#/k8s.io/kubernetes/cmd/}")
for cmd in "${todo[@]}"; do
	echo "$want" >"bin/.$cmd.stamp"
done
echo "${todo[*]} built in $((SECONDS - start)) s" >&2
