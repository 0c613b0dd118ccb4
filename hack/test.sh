#!/usr/bin/env bash
# Runs every test: unit tests, integration tests against embedded etcd and a
# real kube-apiserver, and, as root, end-to-end tests in network namespaces
# (the lab: real etcd processes, vigil, a kubeadm cluster). Run it as root:
# tests that need root fail here (VIGIL_REQUIRE_ROOT=1) rather than skip.
# Every package but the lab runs with -race. Leaves no namespace behind, and
# ends with each package's time and the total.
#
# The order is chosen for a cold machine, where compiling is most of the
# work: the tests' builds (vigil with the race detector, its image, then the Kubernetes
# binaries from source, then the images) run in the background at idle CPU
# priority (SCHED_IDLE: they only get CPU nothing else wants), beside the
# lab's own tests, which spend most of their time waiting for timers. Each
# later step waits only for the builds it needs. docs/testing.md has the
# table.
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/deps.sh ip nft containerd runc conntrack cni cgo bird chrt promtool minisign systemd-analyze
export GOTOOLCHAIN=local
# Root-only tests fail here instead of skipping: this script runs as root
# with every tool, so a skip would be a test that silently stopped running.
export VIGIL_REQUIRE_ROOT=1
# The alert rules' tests need promtool (installed above): fail, not skip.
export VIGIL_REQUIRE_PROMTOOL=1
begin=$SECONDS
log=$(mktemp -d)
buildpid= fetchpid= relpid= lanebpid=
cleanup() {
  [ -n "$buildpid" ] && kill -- "-$buildpid" 2>/dev/null || true
  [ -n "$lanebpid" ] && pkill -P "$lanebpid" 2>/dev/null || true
  [ -n "$relpid" ] && pkill -P "$relpid" 2>/dev/null || true
  [ -n "$fetchpid" ] && kill "$fetchpid" 2>/dev/null || true
  # Whatever happened, remove lab namespaces a crashed test may have left.
  bin/vigil-lab down >/dev/null 2>&1 || true
  bin/vigil-lab --instance b down >/dev/null 2>&1 || true
  rm -rf "$log"
}
trap cleanup EXIT
phases=()
# mark starts a phase; phase NAME records its time and how busy the two
# cores were meanwhile (the whole machine's, from /proc/stat: where it is
# below 100 %, something waited for a timer or the network, not for CPU).
cpustat() { awk '$1 == "cpu" {t = 0; for (i = 2; i <= 9; i++) t += $i; print t - $5 - $6, t; exit}' /proc/stat; }
mark() { t=$SECONDS; read -r cb ct < <(cpustat); }
phase() {
  local b tt
  read -r b tt < <(cpustat)
  phases+=("$(printf '%-50s %5d s  CPU %3d %%' "$1" $((SECONDS - t)) $((tt > ct ? 100 * (b - cb) / (tt - ct) : 0)))")
}

# The modules the Kubernetes build needs, fetched while hack/build.sh
# compiles: the download waits on the network, the compile on the CPU.
(cd hack/kube-apiserver && go list -deps k8s.io/kubernetes/cmd/{kube-apiserver,kubelet,kubeadm,kube-controller-manager,kube-scheduler} >/dev/null) &
fetchpid=$!
mark
read -r cb0 ct0 < <(cpustat)
buildstart=$SECONDS
hack/build.sh
buildsecs=$((SECONDS - buildstart))
# Lab namespaces left by a run that was killed would make the lab tests
# refuse to start.
bin/vigil-lab down >/dev/null 2>&1 || true
bin/vigil-lab --instance b down >/dev/null 2>&1 || true
# A failed fetch is not fatal here: the build below fetches again and says why.
wait "$fetchpid" || echo "hack/test.sh: fetching the Kubernetes modules failed; the build retries" >&2
fetchpid=
phase "vigil binaries (and the Kubernetes modules' download)"

# The builds the later steps need, in the background, at idle priority, in
# their own process group, in this order, each announced by a file in $log
# when done: vigil's packages with the race detector (race.done), vigil's
# image (image.done), the kube-apiserver (apiserver.done), then kubelet,
# kubeadm, the rest of the control plane and the images kubeadm runs
# (all.done), then the release tests with a real Helm (release.done).
# On two cores, cold, they are most of the run's CPU work; warm, seconds
# (Go build cache, stamps in bin/). Vigil's image is built for amd64 only
# here, the architecture the tests run (hack/build-image.sh builds both).
export VIGIL_IMAGE_ARCHIVE="$PWD/bin/vigil-image.oci.tar"
# The race build's flags, the same in step 4 so that it finds them cached
# (no DWARF: race reports do not need it, and it is 10 % of the compile).
# It compiles every package but the commands: `go build` of several
# packages links each command and throws the binary away (about 12
# CPU-seconds each with -race), and the tests compile and link their own.
race="-race -gcflags=all=-dwarf=false"
# GOGC=400: the compiler collects garbage less often (5 % less CPU,
# measured; each compile then peaks at about half a GiB).
GOGC=400 setsid chrt --idle 0 bash -c '
  set -euo pipefail
  log=$1 race=$2
  stage() { local s=$SECONDS; "${@:3}"; echo "$1: $((SECONDS - s)) s" >>"$log/stages"; touch "$log/$2.done"; }
  stage "vigil packages with -race" race go build $race $(go list -f "{{if and .GoFiles (ne .Name \"main\")}}{{.ImportPath}}{{end}}" ./...)
  stage "vigil image (amd64)" image env VIGIL_IMAGE_ARCHES=amd64 hack/build-image.sh
  stage "kube-apiserver" apiserver hack/build-kube.sh
  stage "kubelet, kubeadm, control plane, their images" all hack/build-kube-images.sh --no-vigil-image
  stage "release tests (hack/release) and Helm" release bash -c "go test -C hack/release -c -o /dev/null && hack/build-helm.sh"
' build "$log" "$race" >"$log/build.log" 2>&1 &
buildpid=$!
# await STAGE: wait until the background builds have done STAGE; fail with
# their log if they stopped without it.
await() {
  while [ ! -e "$log/$1.done" ]; do
    if ! kill -0 "$buildpid" 2>/dev/null; then
      wait "$buildpid" || true
      [ -e "$log/$1.done" ] && return 0
      cat "$log/build.log" >&2
      echo "hack/test.sh: the background build stopped before $1 was done" >&2
      exit 1
    fi
    sleep 1
  done
}

# The lab drives the binaries just built.
export VIGIL_BIN="$PWD/bin/vigil" VIGIL_LAB_BIN="$PWD/bin/vigil-lab"
status=0
# gotest NAME ARGS...: go test, its output kept for the summary.
runs=0
gotest() {
  local name=$1 rc=0
  shift
  runs=$((runs + 1))
  mark
  go test "$@" 2>&1 | tee "$log/$runs.out" || rc=${PIPESTATUS[0]}
  phase "$name"
  [ "$rc" = 0 ] || status=$rc
}

# Test binaries are linked without DWARF (-ldflags=-w): stack traces and
# race reports do not need it (the runtime's own tables name each line),
# and each link then costs about 1 CPU-second less of its 4 to 6 (30 test
# binaries).
# The lab package (real etcd processes, vigil in namespaces, minutes of
# chaos) runs with no other package beside it: on two cores its load made
# the embedded-etcd tests of other packages miss their deadlines. It is built as hack/build.sh builds
# the binaries it starts (no cgo, -trimpath, no DWARF, no race detector), so
# a cold run compiles those packages once, not twice.
labflags="-trimpath -gcflags=all=-dwarf=false -ldflags=-w"
labtest() { CGO_ENABLED=0 gotest "$@" $labflags -count=1 -timeout 30m ./internal/lab/; }
# The netns lab's tests run in two lanes side by side when the builds are
# warm (VIGIL_LAB_LANES=auto, the default: hack/build.sh took under a
# minute), one test at a time when they are cold (the background builds then
# compile for half an hour beside the lab; beside them, two labs starved
# each other's etcd in a cold run: requests timed out, holders fenced), and
# as VIGIL_LAB_LANES=1 or 0 says otherwise.
lanes=${VIGIL_LAB_LANES:-auto}
case $lanes in
  auto) if [ "$buildsecs" -lt 60 ]; then lanes=1; else lanes=0; fi ;;
  0 | 1) ;;
  *) echo "hack/test.sh: VIGIL_LAB_LANES=$lanes: want auto, 1 or 0" >&2; exit 2 ;;
esac
if [ "$lanes" = 1 ]; then
  # The netns lab's tests run in two lanes side by side, each in a lab
  # instance of its own (vigil-lab --instance: separate namespaces, the same
  # addresses inside them): TestDrills (the failovers and the membership
  # drills, about 360 s warm) in the default one, every other netns lab test
  # (TestChaos's 4 minutes, the IP-family, BGP and ECMP labs: about 430 s) in
  # instance "b" (the kubeadm lab's tests run in the default instance only).
  # Each lane is mostly timers (the whole lab used 37 % of the two cores
  # alone), so together they take about half the time. What the other
  # lane's load would eat the slack of runs later with no lab beside it:
  # TestTimedDrills (handover, API-server and reconnect-storm drills: the
  # storm keeps both cores busy, and beside another lab it starved the
  # holder's vigil past its renew deadline) and TestGrayFaultsInTheLab (its
  # no-move bound leaves vigil 100 ms) and TestECMPLab (it judges every
  # flow through the survivors after a node's power loss: beside another
  # lab, the router's BFD sessions to a survivor starved, the router dropped
  # that survivor's route too, and its flows moved: beside TestDrills it
  # failed 2 of 14 lane runs and 4 of 34 runs in a loop, alone none of
  # 20). The test binary is compiled
  # once first; both lanes then find it built.
  CGO_ENABLED=0 go test -c -o /dev/null $labflags ./internal/lab/
  runs=$((runs + 1))
  laneb="$log/$runs.out"
  (
    rc=0
    VIGIL_LAB_INSTANCE=b CGO_ENABLED=0 go test $labflags -count=1 -timeout 30m \
      -skip '^(TestKubeadmLab|TestKubeadmLabRefusesMissingInputs|TestLeaseLab|TestDrills|TestTimedDrills|TestGrayFaultsInTheLab|TestECMPLab)$' ./internal/lab/ >"$laneb" 2>&1 || rc=$?
    echo "$rc" >"$log/laneb.rc"
  ) &
  lanebpid=$!
  labtest "lab: TestDrills, beside the other netns labs" -run '^TestDrills$'
  mark
  wait "$lanebpid" || true
  lanebpid=
  cat "$laneb"
  read -r lanebrc <"$log/laneb.rc" || lanebrc=1
  phase "waiting for the other netns labs (instance b)"
  [ "$lanebrc" = 0 ] || status=$lanebrc
  later='^(TestTimedDrills|TestGrayFaultsInTheLab|TestECMPLab|TestLeaseLab)$'
  latername="lab: timed drills, gray faults, ECMP, Lease"
else
  labtest "lab (without Kubernetes binaries), one test at a time" -skip '^(TestKubeadmLab|TestKubeadmLabRefusesMissingInputs|TestLeaseLab)$'
  later='^TestLeaseLab$'
  latername="lab: Lease"
fi

# Every other package, with -race. Three packages at a time (-p 3, one more
# than the cores): their tests mostly wait for timers, and with two, a
# running test holds a slot that the next package's link could use. The
# slowest packages are named first, so that go test starts them first and
# the last minutes do not run one long package alone.
# If the kube-apiserver is built by the time the race build is (a warm run,
# or a machine fast enough to build it beside the lab), they all run in one
# go test; if not, in two groups, so that the tests start as soon as what
# they need is built: first those whose tests start no kube-apiserver,
# beside the background build of it; then those that do (they import
# internal/kubetest).
slowfirst() {
  local first="internal/daemon internal/membership internal/election cmd/vigil internal/lb internal/recovery internal/etcdcluster internal/agent"
  local p f
  for f in $first; do
    for p in "$@"; do [ "$p" = "github.com/vigil-ha/vigil/$f" ] && echo "$p"; done
  done
  for p in "$@"; do
    case " $first " in *" ${p#github.com/vigil-ha/vigil/} "*) ;; *) echo "$p" ;; esac
  done
}
all=$(go list ./... | grep -v /internal/lab$)
withkube=$(go list -test -f '{{with .ForTest}}{{.}}{{else}}{{.ImportPath}}{{end}} {{join .Deps " "}}' ./... |
  awk '/ github.com\/vigil-ha\/vigil\/internal\/kubetest( |$)/ {sub(/\.test$/, "", $1); print $1}' | sort -u)
withoutkube=$(comm -23 <(printf '%s\n' $all | sort) <(printf '%s\n' $withkube))
withkube=$(comm -12 <(printf '%s\n' $all | sort) <(printf '%s\n' $withkube))
export VIGIL_REQUIRE_KUBE_APISERVER=1
mark
await race
await image
phase "waiting for the -race build, image"
racetest() { gotest "$1" $race -ldflags=-w -p 3 -count=1 -timeout 20m $(slowfirst "${@:2}"); }
if [ -e "$log/apiserver.done" ]; then
  racetest "unit and integration (-race)" $all
else
  racetest "unit and integration (-race), no kube-apiserver" $withoutkube
  mark
  await apiserver
  phase "waiting for kube-apiserver"
  racetest "unit and integration (-race), kube-apiserver" $withkube
fi
# The Lease election against real kube-apiservers needs nothing more, so it
# runs while the background build finishes the kubeadm binaries and images.
labtest "$latername" -run "$later"
# The release: hack/release.sh twice (the same bytes), hack/verify-release.sh
# on it and on tampered copies, the packages installed and purged with dpkg,
# the agent's Helm chart linted and rendered by a real Helm. Its own module,
# so not in the go test runs above. It runs beside the kubeadm lab, whose
# step mostly waits on kubelets and containers, at lower CPU priority
# (nice 10), and touches nothing of the lab's (it builds in temporary
# directories and installs only its own packages).
# The last background build (the release tests and Helm) runs beside the
# kubeadm lab too, once kubeadm's binaries and images are done.
runs=$((runs + 1))
relout="$log/$runs.out"
(
  rc=0
  await release
  relbegin=$SECONDS
  VIGIL_REQUIRE_RELEASE=1 nice -n 10 go test -C hack/release -count=1 -timeout 10m . >"$relout" 2>&1 || rc=$?
  echo "$rc $((SECONDS - relbegin))" >"$log/release.rc"
) &
relpid=$!

mark
await all
phase "waiting for kubelet, kubeadm, images"
export VIGIL_REQUIRE_KUBEADM_LAB=1
labtest "lab: kubeadm" -run '^(TestKubeadmLab|TestKubeadmLabRefusesMissingInputs)$'
mark
wait "$relpid" || true
relpid=
wait "$buildpid" || true
buildpid=
cat "$relout" 2>/dev/null || true
read -r relrc relsecs <"$log/release.rc" || { relrc=1 relsecs=0; }
phase "waiting for the release tests (beside the kubeadm lab)"
phases+=("$(printf '%-50s %5d s' "  release (packages, SBOMs, signatures, Helm)" "$relsecs")")
[ "$relrc" = 0 ] || status=$relrc

echo
echo "== hack/test.sh summary"
# Each package's time, slowest first (the lab package twice: its two runs).
cat "$log"/*.out | awk '($1 == "ok" || $1 == "FAIL") && $2 ~ /^github.com\// {
    pkg = $2; sub(/^github.com\/vigil-ha\/vigil\//, "", pkg); t = $3; sub(/s$/, "", t)
    printf "%8.1f s  %-4s %s\n", t, $1, pkg
  }' | sort -rn
for p in "${phases[@]}"; do echo "$p"; done
echo "background builds (idle priority, beside the steps above):"
sed 's/^/  /' "$log/stages"
cb=$cb0 ct=$ct0 t=$begin
phase "total"
echo "${phases[-1]}"
[ "$status" = 0 ] && echo "PASS" || echo "FAIL"
exit $status
