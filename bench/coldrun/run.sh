#!/usr/bin/env bash
# Measures hack/test.sh (.ci/run) as a newcomer's first run: a fresh clone of
# HEAD, empty Go caches (GOCACHE, GOMODCACHE), and the Debian packages the
# tests install removed first, so that hack/deps.sh installs them again.
# Writes the run's log and its summary under bench/coldrun/results/<time>/.
#
# It purges containerd, runc, conntrack, containernetworking-plugins, bird2,
# nftables, prometheus (promtool) and minisign from this machine (the tests reinstall them): run it on a
# test machine, as root, with nothing else running. Go itself stays.
#
# Usage: bash bench/coldrun/run.sh [RUNS]   (RUNS consecutive runs, default 1)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "bench/coldrun/run.sh: run as root (it removes and reinstalls Debian packages)" >&2; exit 1; }
runs=${1:-1}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "usage: bench/coldrun/run.sh [RUNS]" >&2; exit 2; }
repo=$PWD
rev=$(git rev-parse HEAD)
out=$repo/bench/coldrun/results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
work=$(mktemp -d /tmp/vigil-coldrun.XXXXXX)
trap 'rm -rf "$work"' EXIT
for i in $(seq "$runs"); do
  d=$work/$i
  mkdir -p "$d"
  apt-get purge -y -qq containerd runc conntrack containernetworking-plugins bird2 nftables prometheus minisign >/dev/null 2>&1 || true
  git clone -q "$repo" "$d/src"
  git -C "$d/src" checkout -q "$rev"
  start=$SECONDS
  rc=0
  (cd "$d/src" && GOCACHE=$d/gocache GOMODCACHE=$d/gomod bash .ci/run) >"$out/run$i.log" 2>&1 || rc=$?
  took=$((SECONDS - start))
  # The module cache is read-only by design; let rm remove it.
  chmod -R u+w "$d" 2>/dev/null || true
  rm -rf "$d"
  {
    echo "## run $i: revision $rev, $(date -u +%Y-%m-%dT%H:%MZ), exit $rc, $took s ($((took / 60)) min $((took % 60)) s)"
    echo
    echo '```'
    sed -n '/^== hack\/test.sh summary/,$p' "$out/run$i.log"
    echo '```'
    echo
  } >>"$out/summary.md"
  echo "run $i: exit $rc, $took s" >&2
done
echo "results: $out/summary.md" >&2
