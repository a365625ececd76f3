# Sourced (`. packaging/release-env.sh`) before every release build: CI's (.ci/run),
# packaging/build.sh's and benches/run's. It exports CARGO_ENCODED_RUSTFLAGS with
# --remap-path-prefix for every absolute build-machine path that rustc would otherwise embed in
# the binaries (panic locations of the cargo registry's crates, of the vendored crates and of
# the generated protobuf code; rust-src's copy of the standard library): the packages must
# not carry the builder's home, checkout or toolchain paths.
#
# All release builds must use exactly these flags: rustflags are part of every artifact's
# fingerprint, so a build with other flags would rebuild everything (CI builds release once).
# Flags already set in RUSTFLAGS or CARGO_ENCODED_RUSTFLAGS are kept in front of ours;
# sourcing this twice changes nothing. packaging/inspect.sh checks the packaged binaries.
# shellcheck shell=bash

konnectivity_release_flags() {
  local root cargo_home sysroot hash target flags=()
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
  cargo_home="$(cd "${CARGO_HOME:-$HOME/.cargo}" 2>/dev/null && pwd -P || echo "${CARGO_HOME:-$HOME/.cargo}")"
  sysroot="$(rustc --print sysroot)"
  hash="$(rustc -vV | sed -n 's/^commit-hash: //p')"
  # rustc applies the last matching mapping: the general ones first.
  flags+=("--remap-path-prefix=$cargo_home=/cargo")
  flags+=("--remap-path-prefix=$sysroot/lib/rustlib/src/rust=/rustc/${hash:-unknown}")
  # A target dir outside the checkout (CARGO_TARGET_DIR): build scripts' OUT_DIR lives there.
  target="${CARGO_TARGET_DIR:-$root/target}"
  target="$(cd "$target" 2>/dev/null && pwd -P || echo "$target")"
  [[ "$target/" == "$root/"* ]] || flags+=("--remap-path-prefix=$target/=target/")
  # The checkout: sources become relative (vendor/h2/src/..., target/release/build/...).
  flags+=("--remap-path-prefix=$root/=")
  printf '%s\x1f' "${flags[@]}" | sed 's/\x1f$//'
}

KONNECTIVITY_RELEASE_RUSTFLAGS="$(konnectivity_release_flags)"
if [[ -z "${CARGO_ENCODED_RUSTFLAGS:-}" && -n "${RUSTFLAGS:-}" ]]; then
  # cargo ignores RUSTFLAGS once CARGO_ENCODED_RUSTFLAGS is set: carry them over.
  CARGO_ENCODED_RUSTFLAGS="$(printf '%s' "$RUSTFLAGS" | xargs printf '%s\x1f' | sed 's/\x1f$//')"
fi
case "${CARGO_ENCODED_RUSTFLAGS:-}" in
  *"$KONNECTIVITY_RELEASE_RUSTFLAGS"*) ;;
  "") CARGO_ENCODED_RUSTFLAGS="$KONNECTIVITY_RELEASE_RUSTFLAGS" ;;
  *) CARGO_ENCODED_RUSTFLAGS="$CARGO_ENCODED_RUSTFLAGS"$'\x1f'"$KONNECTIVITY_RELEASE_RUSTFLAGS" ;;
esac
export CARGO_ENCODED_RUSTFLAGS KONNECTIVITY_RELEASE_RUSTFLAGS
unset -f konnectivity_release_flags
