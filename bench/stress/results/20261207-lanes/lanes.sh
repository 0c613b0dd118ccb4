#!/bin/bash
# The netns lab as hack/test.sh runs it (two lanes side by side, then the
# timed drills and the gray faults alone), verbose; $1 = output dir. Needs
# bin/ built (hack/build.sh) and root.
cd "$(dirname "$0")/../../../.."
out=$1; mkdir -p "$out"
export VIGIL_REQUIRE_ROOT=1 VIGIL_REQUIRE_PROMTOOL=1 VIGIL_BIN=$PWD/bin/vigil VIGIL_LAB_BIN=$PWD/bin/vigil-lab GOTOOLCHAIN=local
labflags="-trimpath -gcflags=all=-dwarf=false -ldflags=-w"
s=$SECONDS
CGO_ENABLED=0 go test -c -o /dev/null $labflags ./internal/lab/
(VIGIL_LAB_INSTANCE=b CGO_ENABLED=0 go test $labflags -count=1 -timeout 30m -v \
    -skip '^(TestKubeadmLab|TestKubeadmLabRefusesMissingInputs|TestLeaseLab|TestDrills|TestTimedDrills|TestGrayFaultsInTheLab)$' ./internal/lab/ >"$out/b.log" 2>&1; echo "rc=$?" >>"$out/b.log"; echo "b done $((SECONDS-s))" >> "$out/times") &
CGO_ENABLED=0 go test $labflags -count=1 -timeout 30m -v -run '^TestDrills$' ./internal/lab/ >"$out/a.log" 2>&1; echo "rc=$?" >>"$out/a.log"; echo "a done $((SECONDS-s))" >> "$out/times"
wait
echo "total $((SECONDS-s))" >> "$out/times"
s2=$SECONDS
CGO_ENABLED=0 go test $labflags -count=1 -timeout 30m -v -run '^(TestTimedDrills|TestGrayFaultsInTheLab)$' ./internal/lab/ >"$out/c.log" 2>&1; echo "rc=$?" >>"$out/c.log"; echo "c done $((SECONDS-s2))" >> "$out/times"
