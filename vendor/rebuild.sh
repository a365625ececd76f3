#!/usr/bin/env bash
# vendor/<crate> is a crate as published on crates.io plus vendor/patches/<crate>-<version>.patch.
# This script is the only way those trees are made, checked and diffed (see vendor/README.md):
#
#   vendor/rebuild.sh [crate...]          rebuild vendor/<crate> from the published .crate + patch
#   vendor/rebuild.sh --check [crate...]  change nothing; fail unless vendor/<crate> is exactly
#                                         the published crate + patch (vendor/check.sh, CI)
#   vendor/rebuild.sh --diff crate...     write vendor/patches/<crate>-<version>.patch from the
#                                         published crate and today's vendor/<crate>
#
# With no crate named, every vendor/patches/*.patch is taken. A crate's version is the one in its
# patch file's name. The .crate file is fetched by cargo itself (a throwaway project that depends
# on exactly that version) and its sha256 is checked against the checksum cargo records in that
# project's Cargo.lock, which cargo took from the registry's index.
set -euo pipefail

vendor_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
patch_dir="$vendor_dir/patches"

# Files of a published crate that are not vendored, relative to the crate's root. Nothing
# builds a dependency's benches or examples (its manifest still names them; cargo needs the
# files only when that crate is the one being built), a dependency's Cargo.lock is ignored, and
# its CI files and .gitignore mean nothing here (a vendored .gitignore would hide files from
# our git). This is the one list: rebuild, check and diff all use it.
left_out=(.github .gitignore Cargo.lock benches examples)

# The line every hunk of a patch must add (so `grep -rn` over vendor/ shows each patched place).
marker='konnectivity-server patch'

die() {
  echo "vendor/rebuild.sh: $*" >&2
  exit 1
}

# A git that ignores the user's and the system's configuration, so patches come out byte for
# byte the same on every machine.
vgit() {
  GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 git -c core.quotePath=true \
    -c diff.noprefix=false -c diff.mnemonicPrefix=false -c diff.renames=false \
    -c user.name=vendor -c user.email=vendor@localhost -c commit.gpgSign=false "$@"
}

# <name>-<version>.patch -> "name version"; the version starts at the first "-<digit>".
split_patch_name() {
  local base="${1##*/}"
  base="${base%.patch}"
  local name="${base%%-[0-9]*}"
  [ "$name" != "$base" ] || die "$1: the name must be <crate>-<version>.patch"
  echo "$name ${base#"$name"-}"
}

patch_for() {
  local found=("$patch_dir/$1"-[0-9]*.patch)
  [ -e "${found[0]}" ] || die "no vendor/patches/$1-<version>.patch"
  [ "${#found[@]}" -eq 1 ] || die "more than one patch for $1: ${found[*]##*/}"
  echo "${found[0]}"
}

# fetch_crate NAME VERSION WORKDIR: prints the path of the verified .crate file, and writes its
# sha256 to WORKDIR/sha256.
fetch_crate() {
  local name="$1" version="$2" work="$3"
  local proj="$work/fetch"
  mkdir -p "$proj/src"
  : >"$proj/src/lib.rs"
  cat >"$proj/Cargo.toml" <<EOF
[package]
name = "vendor-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
$name = { version = "=$version", default-features = false }

[workspace]
EOF
  local host
  host="$(rustc -vV | sed -n 's/^host: //p')"
  # Offline first: a machine that already holds the crate needs no network for this.
  if ! (cd "$proj" && cargo generate-lockfile --offline -q && cargo fetch --offline -q --target "$host") \
    >"$work/fetch-offline.log" 2>&1; then
    (cd "$proj" && cargo generate-lockfile -q && cargo fetch -q --target "$host") >&2 \
      || die "cargo could not fetch $name $version from crates.io"
  fi
  local sum
  sum="$(awk -v n="$name" -v v="$version" '
    /^\[\[package\]\]/ { name = ""; ver = "" }
    /^name = /     { name = $3; gsub(/"/, "", name) }
    /^version = /  { ver = $3; gsub(/"/, "", ver) }
    /^checksum = / { if (name == n && ver == v) { c = $3; gsub(/"/, "", c); print c } }
  ' "$proj/Cargo.lock")"
  [[ "$sum" =~ ^[0-9a-f]{64}$ ]] || die "cargo recorded no checksum for $name $version"
  local cargo_home="${CARGO_HOME:-$HOME/.cargo}" file
  for file in "$cargo_home"/registry/cache/*/"$name-$version.crate"; do
    [ -f "$file" ] || continue
    if [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$sum" ]; then
      echo "$sum" >"$work/sha256"
      echo "$file"
      return 0
    fi
    echo "vendor/rebuild.sh: $file does not match the checksum cargo records ($sum); skipped" >&2
  done
  die "no $name-$version.crate under $cargo_home/registry/cache with sha256 $sum"
}

# published_tree NAME VERSION WORKDIR: WORKDIR/tree is the published crate less `left_out`.
published_tree() {
  local name="$1" version="$2" work="$3" crate
  crate="$(fetch_crate "$name" "$version" "$work")"
  mkdir -p "$work/unpack"
  tar -xzf "$crate" -C "$work/unpack" --no-same-owner --no-same-permissions
  [ -d "$work/unpack/$name-$version" ] || die "$crate does not unpack to $name-$version/"
  mv "$work/unpack/$name-$version" "$work/tree"
  local path
  for path in "${left_out[@]}"; do
    rm -rf "${work:?}/tree/$path"
  done
}

# apply_patch PATCH WORKDIR [--reject]: applies PATCH to WORKDIR/tree (no fuzz: any line of
# context that moved or changed is a conflict).
apply_patch() {
  local patch="$1" work="$2"
  shift 2
  (cd "$work/tree" && vgit --git-dir="$work/apply.git" init -q \
    && vgit --git-dir="$work/apply.git" apply --whitespace=nowarn "$@" "$patch")
}

# Every hunk of a patch adds at least one line with the marker.
check_markers() {
  local patch="$1"
  awk -v m="$marker" -v p="${patch##*/}" '
    function done_hunk() { if (inhunk && !seen) { print p ": hunk without the marker: " hdr; bad = 1 } }
    /^diff --git / { done_hunk(); inhunk = 0; file = $4; next }
    /^@@ /         { done_hunk(); inhunk = 1; seen = 0; hdr = file " " $0; next }
    inhunk && /^\+/ && index($0, m) { seen = 1 }
    END { done_hunk(); exit bad }
  ' "$patch" >&2 || die "${patch##*/}: every hunk must add a '$marker' comment saying why"
}

header_sha256() {
  sed -n 's/^Crate-SHA256: \([0-9a-f]\{64\}\)$/\1/p' "$1" | head -n 1
}

rebuild_one() {
  local name="$1" mode="$2" patch name_version version work
  if [ "$mode" = diff ] && ! compgen -G "$patch_dir/$name-[0-9]*.patch" >/dev/null; then
    # The first patch of a crate: its version is the vendored manifest's.
    version="$(sed -n '/^\[package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$vendor_dir/$name/Cargo.toml")"
    [ -n "$version" ] || die "vendor/$name/Cargo.toml names no version"
    mkdir -p "$patch_dir"
    patch="$patch_dir/$name-$version.patch"
  else
    patch="$(patch_for "$name")"
    name_version="$(split_patch_name "$patch")"
    version="${name_version#* }"
  fi
  work="$work_root/$name"
  mkdir "$work"
  published_tree "$name" "$version" "$work"
  local sum
  sum="$(cat "$work/sha256")"

  case "$mode" in
  check)
    [ "$(header_sha256 "$patch")" = "$sum" ] \
      || die "${patch##*/}: its Crate-SHA256 line is not $sum, the checksum cargo records for $name $version (regenerate it: vendor/rebuild.sh --diff $name)"
    if ! apply_patch "$patch" "$work" 2>"$work/apply.log"; then
      cat "$work/apply.log" >&2
      die "${patch##*/} does not apply to the published $name $version"
    fi
    check_markers "$patch"
    if ! diff -r --no-dereference "$work/tree" "$vendor_dir/$name" >"$work/diff.log" 2>&1; then
      head -n 60 "$work/diff.log" >&2
      die "vendor/$name is not the published $name $version + ${patch##*/}: change the patch, not vendor/$name alone (vendor/rebuild.sh --diff $name writes the patch from vendor/$name)"
    fi
    local modes_a modes_b
    modes_a="$(cd "$work/tree" && find . -type f -perm /111 | sort)"
    modes_b="$(cd "$vendor_dir/$name" && find . -type f -perm /111 | sort)"
    [ "$modes_a" = "$modes_b" ] || die "vendor/$name: executable bits differ from the published crate"
    echo "vendor/$name: the published $name $version (sha256 $sum) + ${patch##*/}, exactly"
    ;;
  rebuild)
    local failed=0
    apply_patch "$patch" "$work" --reject 2>"$work/apply.log" || failed=1
    rm -rf "${vendor_dir:?}/$name"
    cp -R "$work/tree" "$vendor_dir/$name"
    if [ "$failed" -ne 0 ]; then
      cat "$work/apply.log" >&2
      echo >&2
      echo "CONFLICT: ${patch##*/} does not apply cleanly to the published $name $version." >&2
      echo "vendor/$name now holds the published crate with every hunk that applied; the others" >&2
      echo "are in these files:" >&2
      (cd "$vendor_dir/$name" && find . -name '*.rej' | sed 's|^\./|  vendor/'"$name"'/|') >&2
      echo "Port each by hand, delete the .rej files, then: vendor/rebuild.sh --diff $name &&" >&2
      echo "vendor/check.sh $name   (to drop the attempt: git checkout -- vendor/$name)" >&2
      exit 1
    fi
    echo "vendor/$name: rebuilt from the published $name $version (sha256 $sum) + ${patch##*/}"
    ;;
  diff)
    local leftover
    leftover="$(cd "$vendor_dir/$name" && find . -name '*.rej' -print -quit)"
    [ -z "$leftover" ] || die "vendor/$name still holds $leftover: resolve the conflict first"
    local g=(vgit --git-dir="$work/diff.git")
    "${g[@]}" init -q
    "${g[@]}" --work-tree="$work/tree" add -A
    "${g[@]}" --work-tree="$work/tree" commit -q -m published
    "${g[@]}" --work-tree="$vendor_dir/$name" add -A
    {
      echo "Upstream: $name $version, as published on crates.io"
      echo "Crate-SHA256: $sum"
      echo
      echo "The changes konnectivity-server makes to it: vendor/$name is this crate less the files"
      echo "vendor/rebuild.sh leaves out, with this patch applied (git apply, or patch -p1). Written"
      echo "by vendor/rebuild.sh --diff $name; what each change is for: vendor/README.md."
      echo
      "${g[@]}" diff --cached --no-color --no-ext-diff --no-textconv --full-index \
        --diff-algorithm=myers -U3 --binary
    } >"$work/new.patch"
    grep -q '^diff --git ' "$work/new.patch" || die "vendor/$name is the published crate unchanged: no patch to write"
    mv "$work/new.patch" "$patch"
    check_markers "$patch"
    echo "wrote vendor/patches/${patch##*/}"
    ;;
  esac
}

mode=rebuild
case "${1:-}" in
--check) mode="check"; shift ;;
--diff) mode="diff"; shift ;;
-h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
-*) die "unknown option $1 (see --help)" ;;
esac

work_root="$(mktemp -d)"
trap 'rm -rf "$work_root"' EXIT

crates=("$@")
if [ "${#crates[@]}" -eq 0 ]; then
  [ "$mode" != diff ] || die "--diff needs the crate(s) to diff"
  for p in "$patch_dir"/*.patch; do
    [ -e "$p" ] || die "no patches in vendor/patches"
    n="$(split_patch_name "$p")"
    crates+=("${n%% *}")
  done
  if [ "$mode" = check ]; then
    # A directory under vendor/ without a patch would be a crate nobody can rebuild or check.
    for d in "$vendor_dir"/*/; do
      d="$(basename "$d")"
      [ "$d" = patches ] && continue
      printf '%s\n' "${crates[@]}" | grep -qx "$d" || die "vendor/$d has no vendor/patches/$d-<version>.patch"
    done
  fi
fi

for c in "${crates[@]}"; do
  rebuild_one "$c" "$mode"
done
