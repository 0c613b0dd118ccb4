#!/usr/bin/env bash
# Builds the container images a kubeadm control plane runs, for the kubeadm
# lab (vigil-lab up --kubeadm), where nothing can be pulled:
#   kube-apiserver, kube-controller-manager, kube-scheduler (bin/, from
#   hack/build-kube.sh --all), etcd (go.etcd.io/etcd/server, the version
#   vigil's go.mod pins) and pause (hack/kubeimages/pause),
# each a minimal single-binary image (hack/buildimage) for linux/amd64,
# named exactly as `kubeadm config images list` asks, into
#   bin/kube-images/<name>.oci.tar
# kube-proxy and CoreDNS are not built: the lab skips those kubeadm addons.
# It also builds vigil's own image (hack/build-image.sh), which the lab's
# static pods run.
# Usage: bash hack/build-kube-images.sh [--no-vigil-image]
# --no-vigil-image leaves vigil's image alone (hack/test.sh builds it first,
# on its own, because tests that run earlier need it).
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local CGO_ENABLED=0
vigil_image=true
case ${1:-} in
"") ;;
--no-vigil-image) vigil_image=false ;;
*) echo "usage: hack/build-kube-images.sh [--no-vigil-image]" >&2; exit 2 ;;
esac
hack/build-kube.sh --all
if $vigil_image; then
	bash hack/build-image.sh >/dev/null
fi
mkdir -p bin/kube-images bin/image
version=$(bin/kubeadm version -o short)
epoch=0
for cmd in etcd pause; do
	go build -trimpath -gcflags=all=-dwarf=false -buildvcs=false -ldflags "-s -w -buildid=" -o "bin/image/$cmd" "./hack/kubeimages/$cmd"
done
out=()
for ref in $(bin/kubeadm config images list --kubernetes-version "$version"); do
	name=${ref##*/}
	name=${name%%:*}
	case $name in
	kube-apiserver | kube-controller-manager | kube-scheduler) bin=bin/$name ;;
	etcd | pause) bin=bin/image/$name ;;
	kube-proxy | coredns) continue ;;
	*) echo "kubeadm asks for an image this script does not know: $ref" >&2; exit 1 ;;
	esac
	archive=bin/kube-images/$name.oci.tar
	if [[ -f $archive && $archive -nt $bin && $(cat "$archive.ref" 2>/dev/null) == "$ref" ]]; then
		out+=("$ref")
		continue
	fi
	go run -trimpath -gcflags=all=-dwarf=false ./hack/buildimage --out "$archive" --epoch "$epoch" --name "$name" --version "${ref##*:}" \
		--ref "$ref" --binary "linux/amd64=$bin"
	echo "$ref" >"$archive.ref"
	out+=("$ref")
done
printf '%s\n' "${out[@]}" >bin/kube-images/images.txt
echo "built into bin/kube-images: ${out[*]}" >&2
