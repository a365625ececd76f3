#!/usr/bin/env bash
# Writes the DEP-5 copyright file of both packages to stdout (packaging/build.sh installs it
# as /usr/share/doc/<package>/copyright):
#   packaging/copyright.d/00-header      our code and the two vendored crates
#   one paragraph per crates.io crate linked into the binaries (cargo tree over Cargo.lock,
#   normal dependencies of this platform), with the license expression from its Cargo.toml
#   packaging/copyright.d/licenses/<X>   the text of every license named, and only those
# Fails when a crate names no license, or one whose text is not in copyright.d/licenses/
# (add it there: a new dependency must not ship with a license nobody has looked at).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
D="$ROOT/packaging/copyright.d"
cd "$ROOT"

crates="$(cargo tree --locked -e normal --prefix none -f '{p}|{l}|{r}' | sed 's/ (\*)$//' | sort -u)"
cat "$D/00-header"
declare -A used=()
add_names() { # <DEP-5 license expression>
  local n
  while IFS= read -r n; do [[ -n "$n" ]] && used[$n]=1; done \
    < <(sed -e 's/[()]/ /g' -e 's/ \(and\|or\) /\n/g' <<<"$1" | sed 's/^ *//; s/ *$//')
}
add_names "Apache-2.0"; add_names "MIT"; add_names "Apache-2.0 or ISC or MIT"
while IFS='|' read -r pkg license repo; do
  name="${pkg%% *}" rest="${pkg#* v}"; version="${rest%% *}"
  # Our crate and the vendored ones (path sources) have their paragraphs in 00-header.
  [[ "$pkg" == *" (/"* || "$name" == konnectivity-server ]] && continue
  [[ -n "$license" ]] || { echo "copyright.sh: crate $name $version has no license expression" >&2; exit 1; }
  # SPDX to DEP-5: lower-case operators, "/" is an old spelling of OR, exceptions as "with X exception".
  dep5="$(sed -e 's# */ *# or #g' -e 's/ OR / or /g' -e 's/ AND / and /g' \
    -e 's/ WITH LLVM-exception/ with LLVM exception/g' <<<"$license")"
  add_names "$dep5"
  printf '\nFiles: cargo-registry/%s-%s/*\nCopyright: the %s authors%s\nLicense: %s\n' \
    "$name" "$version" "$name" "${repo:+ ($repo)}" "$dep5"
done <<<"$crates"
while IFS= read -r n; do
  [[ -f "$D/licenses/$n" ]] || { echo "copyright.sh: no text for license '$n' in $D/licenses/" >&2; exit 1; }
  printf '\nLicense: %s\n' "$n"
  sed -e 's/[[:space:]]*$//' -e 's/^$/./' -e 's/^/ /' "$D/licenses/$n"
done < <(printf '%s\n' "${!used[@]}" | LC_ALL=C sort)
