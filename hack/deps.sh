#!/usr/bin/env bash
# Sourced by the other scripts: installs from Debian what they need. The lab
# and the tests need iproute2 (the ip command); callers name the commands they need, e.g.
#   source hack/deps.sh ip keepalived jq
# Go itself must already be installed (go.mod names the version); it is
# looked for in /usr/local/go/bin when not on PATH.
set -euo pipefail
need=()
for cmd in "$@"; do
  if [ "$cmd" = cni ]; then  # the CNI plugins the kubeadm lab's nodes use
    [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
    continue
  fi
  if [ "$cmd" = cgo ]; then  # a C toolchain, for go test -race
    command -v gcc >/dev/null || need+=(gcc)
    [ -e /usr/include/stdlib.h ] || need+=(libc6-dev)
    continue
  fi
  command -v "$cmd" >/dev/null && continue
  case $cmd in
    ip) need+=(iproute2) ;;
    nft) need+=(nftables) ;;
    bird) need+=(bird2) ;;
    promtool) need+=(prometheus) ;;  # the alert rules' tests
    systemd-analyze) need+=(systemd) ;;  # checks the units the packages install
    chrt | setsid) need+=(util-linux) ;;
    *) need+=("$cmd") ;;
  esac
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "hack/deps.sh: run as root to install ${need[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Packages that ship a service (prometheus, for promtool) must not start
  # it: the tests need the tools, not the daemons. policy-rc.d tells
  # Debian's maintainer scripts so, for this install only.
  policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
  fi
  rc=0
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || rc=$?
  [ -z "$policy" ] || rm -f "$policy"
  [ "$rc" = 0 ] || { echo "hack/deps.sh: apt-get install ${need[*]} failed" >&2; exit "$rc"; }
  if [[ " ${need[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
if ! command -v go >/dev/null; then
  for d in /usr/local/go/bin /usr/lib/go/bin; do
    if [ -x "$d/go" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
command -v go >/dev/null || { echo "hack/deps.sh: Go is not installed (go.mod names the version)" >&2; exit 1; }
