#!/usr/bin/env bash
# Builds a vigil release into dist/ (or --out DIR), from Go and Debian tools
# alone, reproducibly: the same commit gives the same bytes, run after run.
#
#   vigil_<v>_linux_<arch>, vigil-agent_<v>_linux_<arch>
#                          static binaries, amd64 and arm64
#   <name>_<v>_<arch>.deb  Debian packages: the binary in /usr/bin, its
#                          systemd unit, a default /etc/vigil/config.yaml
#                          (agent.yaml) and /etc/default/<name> (conffiles)
#   vigil-image_<v>.oci.tar
#                          the container image, both architectures in one
#                          index (hack/build-image.sh)
#   *.spdx.json            an SPDX 2.3 SBOM per binary and for the image,
#                          read from the module graph each binary records
#   SHA256SUMS             every file above
#   *.minisig              a minisign signature of every file above and of
#                          SHA256SUMS, trusted comment "vigil <v>"
#
# Usage: hack/release.sh VERSION --key SECRET_KEY [--out DIR] [--allow-dirty]
#   VERSION       must be what the VERSION file says (a release is of the
#                 tree as committed)
#   --key         a minisign secret key (minisign -G -p vigil.pub -s
#                 vigil.key); for a password-protected key, the password is
#                 read from VIGIL_RELEASE_KEY_PASSWORD, else minisign asks
#   --out         where to write (default dist); emptied first, and refused
#                 if it holds anything but an earlier release
#   --allow-dirty build from uncommitted changes (a trial, not a release:
#                 the binaries say <revision>-dirty)
# VIGIL_RELEASE_ARCHES (default "amd64 arm64") picks the architectures.
# Check a release with hack/verify-release.sh DIR --pub vigil.pub.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "hack/release.sh: $*" >&2; exit 2; }
usage() { sed -n '/^# Usage:/,/^# Check/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

version= key= out=dist allow_dirty=
while [ $# -gt 0 ]; do
  case $1 in
    --key) [ $# -ge 2 ] || die "--key needs a file"; key=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift 2 ;;
    --allow-dirty) allow_dirty=1; shift ;;
    -h | --help) usage ;;
    -*) die "unknown flag $1 (--key, --out, --allow-dirty)" ;;
    *) [ -z "$version" ] || die "one VERSION only (got $version and $1)"; version=$1; shift ;;
  esac
done
[ -n "$version" ] || usage
version=${version#v}
[ "$version" = "$(cat VERSION)" ] || die "VERSION says $(cat VERSION), not $version: set the VERSION file and commit it first"
[ -n "$key" ] || die "--key is required: a minisign secret key (minisign -G -p vigil.pub -s vigil.key makes a pair)"
[ -r "$key" ] || die "--key: cannot read $key"
head -c 64 "$key" | grep -q '^untrusted comment:' || die "--key: $key is not a minisign secret key"
git rev-parse HEAD >/dev/null 2>&1 || die "not a git checkout: a release is built from a commit"
if [ -n "$(git status --porcelain)" ] && [ -z "$allow_dirty" ]; then
  die "the tree has uncommitted changes (git status): commit them, or pass --allow-dirty for a trial"
fi
arches=${VIGIL_RELEASE_ARCHES:-amd64 arm64}
for arch in $arches; do
  case $arch in amd64 | arm64) ;; *) die "VIGIL_RELEASE_ARCHES: unknown architecture $arch (amd64, arm64)" ;; esac
done
if [ -e "$out" ]; then
  [ -d "$out" ] || die "--out $out is not a directory"
  if [ -n "$(ls -A "$out")" ] && [ ! -e "$out/SHA256SUMS" ]; then
    die "--out $out holds files that are not a release: refusing to empty it"
  fi
fi
key=$(realpath "$key")
source hack/deps.sh minisign

export GOTOOLCHAIN=local CGO_ENABLED=0
# Every time stamp in every artifact: the commit's time.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
export SOURCE_DATE_EPOCH
rm -rf "$out"
mkdir -p "$out"
out=$(realpath "$out")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The image, and with it the binaries: the released binaries are the
# image's own, byte for byte (-trimpath, no build id, no VCS stamp but the
# revision).
# In $tmp, not bin/: a lab may be reading bin/vigil-image.oci.tar.
VIGIL_IMAGE_ARCHES="$arches" VIGIL_IMAGE_OUT="$out/vigil-image_$version.oci.tar" VIGIL_IMAGE_BINDIR="$tmp/image" \
  bash hack/build-image.sh >"$tmp/image.log" || { cat "$tmp/image.log" >&2; die "hack/build-image.sh failed"; }
for arch in $arches; do
  for cmd in vigil vigil-agent; do
    cp "$tmp/image/$cmd-linux-$arch" "$out/${cmd}_${version}_linux_$arch"
  done
done

# What the packages and the chart take from vigil, printed by this tree's
# vigil: the configuration files (from its flags), the environment files,
# the agent's chart.
vigil=$tmp/image/vigil-linux-$(go env GOARCH)
[[ " $arches " == *" $(go env GOARCH) "* ]] || { go build -trimpath -gcflags=all=-dwarf=false -o "$tmp/vigil" ./cmd/vigil; vigil=$tmp/vigil; }
mkdir "$tmp/defaults"
for section in run agent; do
  name=vigil
  [ "$section" = agent ] && name=vigil-agent
  "$vigil" config print-defaults --section "$section" >"$tmp/defaults/$name.yaml"
  "$vigil" config print-env --section "$section" >"$tmp/defaults/$name.env"
done
"$vigil" manifest chart --out "$tmp/chart" 2>/dev/null

# Packages, SBOMs and SHA256SUMS.
(cd hack/release && go run -trimpath -gcflags=all=-dwarf=false . --dist "$out" --root "$(realpath ../..)" \
  --version "$version" --epoch "$SOURCE_DATE_EPOCH" --arches "$arches" \
  --defaults "$tmp/defaults" --chart "$tmp/chart" \
  --image "$out/vigil-image_$version.oci.tar" --image-binaries "$tmp/image")

# Signatures: Ed25519 is deterministic, and the trusted comment is fixed,
# so these too are the same bytes every run.
files=()
while read -r _ name; do files+=("$out/$name"); done <"$out/SHA256SUMS"
files+=("$out/SHA256SUMS")
if [ -n "${VIGIL_RELEASE_KEY_PASSWORD:-}" ]; then
  printf '%s\n' "$VIGIL_RELEASE_KEY_PASSWORD" | minisign -S -s "$key" -t "vigil $version" -m "${files[@]}" >/dev/null
else
  minisign -S -s "$key" -t "vigil $version" -m "${files[@]}" >/dev/null
fi

echo "vigil $version ($(git rev-parse HEAD)) -> $out"
(cd "$out" && ls -l --time-style=+ | awk 'NR > 1 { printf "  %10d  %s\n", $5, $NF }')
