#!/usr/bin/env bash
# Builds vigil's container image, ghcr.io/vigil-ha/vigil:v$(cat VERSION), for
# linux/amd64 and linux/arm64 in one index, as an OCI image archive:
#   bin/vigil-image.oci.tar
# with no container daemon (hack/buildimage, go-containerregistry as a
# library). The binaries are static and built reproducibly (-trimpath, no
# build id, the commit's time as every time stamp), so the same commit gives
# the same archive, byte for byte; the script prints its sha256.
#
# Load it:   ctr -n k8s.io images import bin/vigil-image.oci.tar
#            podman load -i bin/vigil-image.oci.tar
# Push it:   skopeo copy --all oci-archive:bin/vigil-image.oci.tar \
#              docker://registry.example.com/vigil:v$(cat VERSION)
# Usage: bash hack/build-image.sh
# VIGIL_IMAGE_OUT (default bin/vigil-image.oci.tar) and VIGIL_IMAGE_BINDIR
# (default bin/image) say where the archive and the binaries go
# (hack/release.sh builds into its own directory, so that a lab reading
# bin/vigil-image.oci.tar meanwhile is not disturbed).
# VIGIL_IMAGE_ARCHES (default "amd64 arm64") picks the architectures: the
# tests (hack/test.sh) build only amd64, the one this machine runs, which
# saves a full arm64 compile (about 5 CPU-minutes) on a cold machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local CGO_ENABLED=0
version=$(cat VERSION)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
revision=$(git rev-parse HEAD 2>/dev/null || true)
if [ -n "$revision" ] && [ -n "$(git status --porcelain 2>/dev/null)" ]; then
  revision="$revision-dirty"
fi
# Every architecture is checked before anything is built.
arches=${VIGIL_IMAGE_ARCHES:-amd64 arm64}
for arch in $arches; do
  case $arch in amd64 | arm64) ;; *) echo "hack/build-image.sh: VIGIL_IMAGE_ARCHES: unknown architecture $arch (amd64, arm64)" >&2; exit 2 ;; esac
done
out=${VIGIL_IMAGE_OUT:-bin/vigil-image.oci.tar}
bindir=${VIGIL_IMAGE_BINDIR:-bin/image}
mkdir -p "$bindir" "$(dirname "$out")"
args=()
for arch in $arches; do
  for cmd in vigil vigil-agent; do
    GOOS=linux GOARCH=$arch go build -trimpath -gcflags=all=-dwarf=false -buildvcs=false -ldflags "-s -w -buildid= -X github.com/vigil-ha/vigil.revision=$revision" \
      -o "$bindir/$cmd-linux-$arch" ./cmd/$cmd
  done
  # vigil is the entrypoint; vigil-agent, the worker's smaller binary,
  # sits beside it (the agent DaemonSet runs it).
  args+=(--binary "linux/$arch=$bindir/vigil-linux-$arch")
  args+=(--extra "vigil-agent@linux/$arch=$bindir/vigil-agent-linux-$arch")
done
go run -trimpath -gcflags=all=-dwarf=false ./hack/buildimage --out "$out" --epoch "$epoch" --revision "$revision" "${args[@]}"
echo "ghcr.io/vigil-ha/vigil:v$version -> $out"
sha256sum "$out"
