#!/usr/bin/env bash
# Builds vigil, vigil-agent and vigil-lab into bin/. The etcd server module asks for a newer
# Go patch release than some machines have; GOTOOLCHAIN=local keeps the build
# on the installed toolchain instead of downloading another.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
mkdir -p bin
# Static binaries (no cgo): they run on any distribution, and vigil-agent on
# every worker does not map libc. No DWARF debug information, like the
# image's binaries: stack traces are unchanged, and a cold build compiles
# about 10 % faster (for a debugger, build with plain go build).
# hack/test.sh tests the lab with these same flags, so the two share the
# build cache: keep them in step.
# The revision `vigil --version` and vigil_build_info report; Go's own VCS
# stamp is often off (-buildvcs=false in GOFLAGS, or no .git).
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain 2>/dev/null)" ]; then
  revision="$revision-dirty"
fi
# GOGC=400 (the compiler's own garbage collector runs less often): 5 % less
# CPU, about half a GiB per compile at most.
CGO_ENABLED=0 GOGC=400 go build -trimpath -gcflags=all=-dwarf=false -ldflags "-w -X github.com/vigil-ha/vigil.revision=$revision" -o bin/ ./cmd/vigil ./cmd/vigil-agent ./cmd/vigil-lab
