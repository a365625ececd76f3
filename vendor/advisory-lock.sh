#!/usr/bin/env bash
# vendor/advisory-lock.sh [OUT]: writes a copy of Cargo.lock (default: target/advisory/Cargo.lock)
# in which each vendored crate is listed as the crates.io release it was made from, with that
# release's `source` and `checksum`, for advisory tools:
#
#   vendor/advisory-lock.sh && cargo audit -f target/advisory/Cargo.lock
#
# Cargo.lock lists a crate replaced through [patch.crates-io] with a path source, i.e. with no
# source line at all, so an advisory tool that reads it cannot tell that we run h2 0.4.20 or
# rustls 0.23.46 and skips them. Our patches change when buffers are allocated, not what the
# crates parse or send, so an advisory for the published version applies to ours. The crates
# and versions come from the names of vendor/patches/<crate>-<version>.patch, the checksums from
# their Crate-SHA256 lines (which vendor/check.sh holds to what cargo records). Needs no network.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/target/advisory/Cargo.lock}"
crates_io='registry+https://github.com/rust-lang/crates.io-index'

die() {
  echo "vendor/advisory-lock.sh: $*" >&2
  exit 1
}

# "name version sha256" for each patch.
entries=()
for patch in "$root"/vendor/patches/*.patch; do
  [ -e "$patch" ] || die "no patches in vendor/patches"
  base="${patch##*/}"
  base="${base%.patch}"
  name="${base%%-[0-9]*}"
  version="${base#"$name"-}"
  sum="$(sed -n 's/^Crate-SHA256: \([0-9a-f]\{64\}\)$/\1/p' "$patch" | head -n 1)"
  [ -n "$sum" ] || die "${patch##*/} has no Crate-SHA256 line"
  entries+=("$name $version $sum")
done

mkdir -p "$(dirname "$out")"
tmp="$(mktemp "$out.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
# Inside the [[package]] entry whose name and version match and which has no source (the
# patched one), add source and checksum after the version line, where cargo puts them.
awk -v list="$(printf '%s\n' "${entries[@]}")" -v src="$crates_io" '
  BEGIN {
    n = split(list, lines, "\n")
    for (i = 1; i <= n; i++) {
      if (lines[i] == "") continue
      split(lines[i], f, " ")
      want[f[1] " " f[2]] = f[3]
    }
  }
  function flush(   key, i) {
    if (count == 0) return
    key = pname " " pver
    if ((key in want) && !has_source) {
      for (i = 1; i <= count; i++) {
        print buf[i]
        if (buf[i] ~ /^version = /) {
          print "source = \"" src "\""
          print "checksum = \"" want[key] "\""
        }
      }
      done[key] = 1
    } else {
      for (i = 1; i <= count; i++) print buf[i]
    }
    count = 0
  }
  /^\[\[package\]\]$/ { flush(); inpkg = 1; pname = ""; pver = ""; has_source = 0 }
  !inpkg { print; next }
  {
    buf[++count] = $0
    if ($0 ~ /^name = /) { pname = $3; gsub(/"/, "", pname) }
    if ($0 ~ /^version = /) { pver = $3; gsub(/"/, "", pver) }
    if ($0 ~ /^source = /) has_source = 1
  }
  END {
    flush()
    for (key in want) if (!(key in done)) { print "not in Cargo.lock as a patched crate: " key > "/dev/stderr"; bad = 1 }
    exit bad
  }
' "$root/Cargo.lock" >"$tmp" || die "Cargo.lock does not build every vendored crate from vendor/ at its patch's version"
mv "$tmp" "$out"
trap - EXIT
listed=""
for e in "${entries[@]}"; do
  listed="$listed${listed:+, }${e% *}"
done
echo "wrote $out: $listed listed as their crates.io releases"
