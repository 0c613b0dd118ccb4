#!/usr/bin/env bash
# Builds a real Helm into bin/helm, for the agent chart's tests (hack/release:
# helm lint and helm template). Debian has no Helm package; this builds the
# version hack/kube-apiserver/go.mod pins (its tool line), in that module and
# with hack/build-kube.sh's flags, so that the Kubernetes packages Helm
# shares with the Kubernetes binaries compile once (Go's build cache): after
# hack/build-kube.sh --all, a cold build of Helm is its own packages only.
# A stamp beside the binary skips the build when the pinned module has not
# changed.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
[ $# -eq 0 ] || { echo "usage: hack/build-helm.sh" >&2; exit 2; }
mkdir -p bin
want=$(cat hack/kube-apiserver/go.mod hack/kube-apiserver/go.sum hack/build-helm.sh | sha256sum | cut -d' ' -f1)
if [[ -x bin/helm && -f bin/.helm.stamp && $(cat bin/.helm.stamp) == "$want" ]]; then
	exit 0
fi
version=$(awk '$1 == "helm.sh/helm/v4" {print $2}' hack/kube-apiserver/go.mod)
[ -n "$version" ] || { echo "hack/build-helm.sh: no helm.sh/helm/v4 in hack/kube-apiserver/go.mod" >&2; exit 1; }
start=$SECONDS
(cd hack/kube-apiserver && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false \
	-ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" -o ../../bin/helm helm.sh/helm/v4/cmd/helm)
echo "$want" >bin/.helm.stamp
echo "helm $version built in $((SECONDS - start)) s" >&2
