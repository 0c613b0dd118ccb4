#!/usr/bin/env bash
# Runs packages' tests many times to find flaky ones. Each package's test
# binary is built once (with -race, as hack/test.sh does, except for the
# lab package) and run RUNS times (default 20) from the package directory,
# one run after another: every run a fresh process, with its TestMain, leak
# check and watchdog. A test that fails once in twenty is a broken test.
#
#   hack/stress.sh [PKG...]
#
# Without PKG: every package whose tests start embedded etcd, a
# kube-apiserver or network namespaces (they import etcdtest, kubetest or
# nstest), except the lab package, whose full run takes 18 minutes: name
# ./internal/lab/ to include it, with RUN to pick tests.
#
#   RUNS=20        runs per package
#   RUN=REGEXP     only the tests that match (-test.run)
#   LOAD=N         N busy loops beside the tests, at normal priority, to
#                  find the tests that fail on a busy machine (0: none)
#   LOAD=lab       the lab package's drills (TestDrills) in a loop beside
#                  the tests, as on a machine that runs labs too
#   LANES=1        with ./internal/lab/: each run is the netns lab as
#                  hack/test.sh runs it on warm builds: TestDrills in the
#                  default lab instance beside every other netns lab test
#                  in instance b, then TestTimedDrills, TestGrayFaultsInTheLab,
#                  TestECMPLab and TestLeaseLab alone (the kubeadm lab not at all: name
#                  it with RUN='^TestKubeadmLab$' and LANES=0). RUN must be
#                  empty.
#
# Results go to bench/stress/results/<UTC time>/: summary.md (runs,
# passes, and the median and worst time per package) and failed-*.log, the
# output of every failed run. The script exits 1 if any run failed.
# Run as root (the namespace tests need it; VIGIL_REQUIRE_ROOT=1 makes them
# fail rather than skip).
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/deps.sh ip nft containerd runc conntrack cni cgo bird
export GOTOOLCHAIN=local VIGIL_REQUIRE_ROOT=1
RUNS=${RUNS:-20}
LOAD=${LOAD:-0}
RUN=${RUN:-}
LANES=${LANES:-0}
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "RUNS=$RUNS: want a positive number" >&2; exit 2; }
[[ $LOAD =~ ^([0-9]+|lab)$ ]] || { echo "LOAD=$LOAD: want a number of busy loops or lab" >&2; exit 2; }
[[ $LANES =~ ^[01]$ ]] || { echo "LANES=$LANES: want 0 or 1" >&2; exit 2; }
if [ "$LANES" = 1 ]; then
  source hack/deps.sh promtool
  export VIGIL_REQUIRE_PROMTOOL=1 # the prometheus drill runs, as in hack/test.sh
  [ -z "$RUN" ] || { echo "LANES=1 runs the netns lab's own split; RUN must be empty" >&2; exit 2; }
  [ "$LOAD" = 0 ] || { echo "LANES=1 runs two labs side by side already; LOAD must be 0" >&2; exit 2; }
  [ "$*" = ./internal/lab/ ] || [ "$*" = ./internal/lab ] || { echo "LANES=1 is for ./internal/lab/ alone" >&2; exit 2; }
fi

if [ $# -eq 0 ]; then
  mapfile -t pkgs < <(go list -f '{{.ImportPath}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./... |
    awk '$1 !~ /\/internal\/lab$/ && / github.com\/vigil-ha\/vigil\/internal\/(etcdtest|kubetest|nstest)( |$)/ {print $1}')
else
  mapfile -t pkgs < <(go list "$@")
fi
[ ${#pkgs[@]} -gt 0 ] || { echo "no packages to run" >&2; exit 2; }

# What the tests run: vigil's binaries, and the image and the real
# kube-apiserver when they were built (hack/build-image.sh,
# hack/build-kube.sh); tests that need one that is missing skip, or fail
# where hack/test.sh's variables say they must run.
hack/build.sh
export VIGIL_BIN="$PWD/bin/vigil" VIGIL_LAB_BIN="$PWD/bin/vigil-lab"
[ -f bin/vigil-image.oci.tar ] && export VIGIL_IMAGE_ARCHIVE="$PWD/bin/vigil-image.oci.tar"
[ -x bin/kube-apiserver ] && export VIGIL_REQUIRE_KUBE_APISERVER=1

out=bench/stress/results/$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$out"
work=$(mktemp -d)
loadpids=()
cleanup() {
  for p in "${loadpids[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  bin/vigil-lab down >/dev/null 2>&1 || true
  bin/vigil-lab --instance b down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if [ "$LOAD" = lab ]; then
  go test -c -o "$work/lab.test" ./internal/lab/
  setsid bash -c "cd internal/lab && while :; do '$work/lab.test' -test.count=1 -test.run '^TestDrills\$' >/dev/null 2>&1 || true; done" &
  loadpids+=($!)
else
  for ((i = 0; i < LOAD; i++)); do
    setsid bash -c 'while :; do :; done' &
    loadpids+=($!)
  done
fi

{
  echo "# hack/stress.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "Command: \`RUNS=$RUNS LOAD=$LOAD RUN='$RUN' LANES=$LANES hack/stress.sh ${*:-}\` at $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with local changes)'), on $(nproc) cores."
  echo
  echo "| package | runs | passed | median s | worst s |"
  echo "|---|---:|---:|---:|---:|"
} >"$out/summary.md"

run_plain() { "$@"; }
# run_lanes BIN ARGS...: the netns lab as hack/test.sh runs it on warm
# builds (its step 3); each part's output one after another.
run_lanes() {
  local bin=$1 rc=0 ra=0 rb=0
  shift
  VIGIL_LAB_INSTANCE=b "$bin" "$@" -test.v \
    -test.skip '^(TestKubeadmLab|TestKubeadmLabRefusesMissingInputs|TestLeaseLab|TestDrills|TestTimedDrills|TestGrayFaultsInTheLab|TestECMPLab)$' >"$work/lane-b.log" 2>&1 &
  local pb=$!
  "$bin" "$@" -test.v -test.run '^TestDrills$' >"$work/lane-a.log" 2>&1 || ra=$?
  wait "$pb" || rb=$?
  echo "== lane a (TestDrills, default instance): exit $ra"
  cat "$work/lane-a.log"
  echo "== lane b (the other netns labs, instance b): exit $rb"
  cat "$work/lane-b.log"
  echo "== alone (TestTimedDrills, TestGrayFaultsInTheLab, TestECMPLab, TestLeaseLab)"
  "$bin" "$@" -test.v -test.run '^(TestTimedDrills|TestGrayFaultsInTheLab|TestECMPLab|TestLeaseLab)$' || rc=$?
  [ "$ra" = 0 ] && [ "$rb" = 0 ] && [ "$rc" = 0 ]
}

failed=0
for pkg in "${pkgs[@]}"; do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  name=${pkg#github.com/vigil-ha/vigil/}
  bin="$work/$(echo "$name" | tr / _).test"
  race=-race
  [[ $name == internal/lab ]] && race=
  go test $race -c -o "$bin" "$pkg"
  if [ ! -x "$bin" ]; then
    echo "$name: no tests" >&2
    continue
  fi
  args=(-test.count=1 -test.timeout=30m)
  [ -n "$RUN" ] && args+=(-test.run "$RUN")
  pass=0
  times=()
  for ((r = 1; r <= RUNS; r++)); do
    start=$EPOCHREALTIME
    if [ "$LANES" = 1 ]; then
      runlab=lanes
    else
      runlab=plain
    fi
    if (cd "$dir" && run_$runlab "$bin" "${args[@]}" >"$work/run.log" 2>&1); then
      pass=$((pass + 1))
      verdict=ok
    else
      verdict=FAIL
      failed=1
      cp "$work/run.log" "$out/failed-$(echo "$name" | tr / _)-run$r.log"
    fi
    t=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {print b - a}')
    times+=("$t")
    printf '%s run %d/%d: %s in %.1f s\n' "$name" "$r" "$RUNS" "$verdict" "$t" >&2
  done
  read -r median worst < <(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.1f %.1f\n", a[int((NR+1)/2)], a[NR]}')
  echo "| $name | $RUNS | $pass | $median | $worst |" >>"$out/summary.md"
done
echo >>"$out/summary.md"
echo "Failed runs' output: failed-*.log beside this file." >>"$out/summary.md"
cat "$out/summary.md"
echo "results: $out" >&2
exit $failed
