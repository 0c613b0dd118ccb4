#!/usr/bin/env bash
# Checks a vigil release that hack/release.sh wrote, before anything in it
# is installed:
#   - SHA256SUMS is signed by the key given, and so is every file it lists;
#   - every signature carries the same trusted comment ("vigil <version>"),
#     so files from two releases cannot be mixed;
#   - every file's SHA-256 is the one SHA256SUMS lists;
#   - the directory holds nothing else, and lacks nothing SHA256SUMS lists.
# Exits 0 and prints the version when all hold; 1, naming the first file
# that fails, otherwise.
#
# Usage: hack/verify-release.sh DIR (--pub PUBLIC_KEY_FILE | -P PUBLIC_KEY)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
die() { echo "hack/verify-release.sh: $*" >&2; exit 2; }
fail() { echo "hack/verify-release.sh: FAILED: $*" >&2; exit 1; }

dir= pub=()
while [ $# -gt 0 ]; do
  case $1 in
    --pub) [ $# -ge 2 ] || die "--pub needs a file"; [ -r "$2" ] || die "--pub: cannot read $2"; pub=(-p "$(realpath "$2")"); shift 2 ;;
    -P) [ $# -ge 2 ] || die "-P needs a public key"; pub=(-P "$2"); shift 2 ;;
    -h | --help) sed -n '/^# Checks/,/^# Usage/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    -*) die "unknown flag $1 (--pub, -P)" ;;
    *) [ -z "$dir" ] || die "one directory only"; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || die "usage: hack/verify-release.sh DIR (--pub PUBLIC_KEY_FILE | -P PUBLIC_KEY)"
[ ${#pub[@]} -gt 0 ] || die "--pub or -P is required: the release key's public half, from a source you trust"
[ -d "$dir" ] || die "$dir is not a directory"
command -v minisign >/dev/null || source "$here/deps.sh" minisign
cd "$dir"
[ -f SHA256SUMS ] || fail "no SHA256SUMS in $dir"

# verify FILE: its signature, and its trusted comment.
comment=
verify() {
  local got
  [ -f "$1.minisig" ] || fail "$1: no signature ($1.minisig)"
  got=$(minisign -V -Q "${pub[@]}" -m "$1" 2>&1) || fail "$1: bad signature ($got)"
  if [ -z "$comment" ]; then
    comment=$got
  elif [ "$got" != "$comment" ]; then
    fail "$1: signed as \"$got\", SHA256SUMS as \"$comment\""
  fi
}
verify SHA256SUMS
# listed holds every file the release may contain. (A set, not a list piped
# to grep -q: grep exits at its first match, the writer can then die of
# SIGPIPE, and pipefail turns a match into a failure.)
declare -A listed=([SHA256SUMS]=1 [SHA256SUMS.minisig]=1)
while read -r sum name; do
  case $name in */* | .* | "") fail "SHA256SUMS lists \"$name\", not a file of this directory" ;; esac
  [ -f "$name" ] || fail "$name: listed in SHA256SUMS, missing"
  [ "$(sha256sum <"$name" | cut -d' ' -f1)" = "$sum" ] || fail "$name: SHA-256 differs from SHA256SUMS"
  verify "$name"
  listed[$name]=1 listed[$name.minisig]=1
done <SHA256SUMS
for f in * .*; do
  case $f in . | ..) continue ;; esac
  [ -e "$f" ] || continue
  [ -n "${listed[$f]:-}" ] || fail "$f: not part of the release (not in SHA256SUMS)"
done
echo "verified: $comment, $(($(wc -l <SHA256SUMS))) files"
