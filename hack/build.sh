#!/usr/bin/env bash
# Builds vigil, vigil-agent and vigil-lab into bin/. The etcd server module asks for a newer
# Go patch release than some machines have; GOTOOLCHAIN=local keeps the build
# on the installed toolchain instead of downloading another.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
mkdir -p bin
# Static binaries (no cgo): they run on any distribution, and vigil-agent on
# every worker does not map libc.
CGO_ENABLED=0 go build -trimpath -o bin/ ./cmd/vigil ./cmd/vigil-agent ./cmd/vigil-lab
