#!/usr/bin/env bash
# Installs what vigil's lab, tests and benchmarks need on Debian: iproute2
# (namespaces), keepalived (the comparison baseline) and jq (bench summaries).
# Go itself must already be installed (go.mod names the version).
set -euo pipefail
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v keepalived >/dev/null || need+=(keepalived)
command -v jq >/dev/null || need+=(jq)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "hack/deps.sh: need root to install ${need[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v go >/dev/null; then
  for d in /usr/local/go/bin /usr/lib/go/bin; do [ -x "$d/go" ] && export PATH="$d:$PATH" && break; done
fi
command -v go >/dev/null || { echo "hack/deps.sh: Go is not installed (see go.mod for the version)" >&2; exit 1; }
