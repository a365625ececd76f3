#!/usr/bin/env bash
# Builds the release binary and the .deb and .rpm packages into target/packages/.
#
#   packaging/build.sh [options] [VERSION]
#
#   VERSION           override the package version (default: Cargo.toml's). The .deb gets
#                     VERSION-1, the .rpm VERSION-1. Used for the N -> N+1 upgrade test.
#   --deb-only        build only the .deb (e.g. the N+1 package for the upgrade test)
#   --no-build        do not run cargo build; package the existing target/release binary
#   --binary PATH     package PATH instead of target/release/konnectivity-server (implies
#                     --no-build; development only, e.g. target/debug/konnectivity-server)
#   --out DIR         output directory (default: <crate>/target/packages)
#
# Tools: cargo-deb and cargo-generate-rpm are installed with `cargo install --locked` only if
# `command -v` does not find them; `rpm` (for packaging/inspect.sh) from apt only if missing.
# The last stdout lines are the package paths.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VERSION="" DEB_ONLY=0 NO_BUILD=0 BINARY="" OUT="$ROOT/target/packages"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --deb-only) DEB_ONLY=1 ;;
    --no-build) NO_BUILD=1 ;;
    --binary) BINARY="$(realpath "$2")"; NO_BUILD=1; shift ;;
    --binary=*) BINARY="$(realpath "${1#*=}")"; NO_BUILD=1 ;;
    --out) OUT="$2"; shift ;;
    --out=*) OUT="${1#*=}" ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "build.sh: unknown option $1" >&2; exit 2 ;;
    *) VERSION="$1" ;;
  esac
  shift
done

log() { printf 'build.sh: %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { printf '%.1fs' "$(echo "$(now) - $1" | bc)"; }

CRATE_VERSION="$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)"
VERSION="${VERSION:-$CRATE_VERSION}"
DEB_VERSION="${VERSION}-1"
ARCH_DEB="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
mkdir -p "$OUT"

# Everything the packages ship must exist (assets are listed in Cargo.toml).
missing=0
for f in README.md CHANGELOG.md config/server.toml config/server.toml.deploy \
         systemd/konnectivity-server.service systemd/konnectivity-server.socket \
         systemd/konnectivity-server.sysusers \
         systemd/konnectivity-server.service.d/10-notify-reload.conf \
         packaging/default/konnectivity-server packaging/README.md \
         packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm \
         packaging/rpm/pre.sh packaging/rpm/post.sh packaging/rpm/preun.sh packaging/rpm/postun.sh; do
  [[ -f "$f" ]] || { log "missing $f (a package asset)"; missing=1; }
done
[[ $missing -eq 0 ]] || exit 1

# --- tools, only when missing ---------------------------------------------------------------
T=$(now)
if ! command -v cargo-deb >/dev/null 2>&1; then
  log "installing cargo-deb"; cargo install --locked cargo-deb >&2
fi
if [[ $DEB_ONLY -eq 0 ]] && ! command -v cargo-generate-rpm >/dev/null 2>&1; then
  log "installing cargo-generate-rpm"; cargo install --locked cargo-generate-rpm >&2
fi
if [[ $DEB_ONLY -eq 0 ]] && ! command -v rpm >/dev/null 2>&1; then
  log "installing rpm (apt)"
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rpm >&2
fi
log "tools ready ($(since "$T")): $(cargo deb --version 2>/dev/null)$( [[ $DEB_ONLY -eq 1 ]] || echo ", $(cargo generate-rpm --version 2>/dev/null)")"

# --- binary -----------------------------------------------------------------------------------
TARGET_DIR="$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
if [[ -z "$BINARY" ]]; then
  if [[ $NO_BUILD -eq 0 ]]; then
    T=$(now)
    log "cargo build --release --bin konnectivity-server"
    cargo build --release --bin konnectivity-server >&2
    log "release build done ($(since "$T"))"
  fi
  BINARY="$TARGET_DIR/release/konnectivity-server"
else
  log "packaging $BINARY (development: not a release build)"
fi
[[ -x "$BINARY" ]] || { log "no binary at $BINARY"; exit 1; }
# Both packagers read <target-dir>/release/konnectivity-server. Stage a stripped copy there
# (cargo-generate-rpm does not strip; the build output and the release profile stay untouched).
STAGE="$OUT/.stage"
rm -rf "$STAGE"; mkdir -p "$STAGE/release"
strip --strip-unneeded -o "$STAGE/release/konnectivity-server" "$BINARY"
trap 'rm -rf "$STAGE"' EXIT

export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || date +%s)}"

# --- .deb -------------------------------------------------------------------------------------
T=$(now)
DEB="$OUT/konnectivity-server_${DEB_VERSION}_${ARCH_DEB}.deb"
CARGO_TARGET_DIR="$STAGE" cargo deb --no-build --deb-version "$DEB_VERSION" -o "$DEB" >/dev/null
log "deb built ($(since "$T")): $DEB $(stat -c %s "$DEB") bytes"
OUTPUTS=("$DEB")

# --- .rpm -------------------------------------------------------------------------------------
if [[ $DEB_ONLY -eq 0 ]]; then
  T=$(now)
  RPM_DIR="$OUT/.rpm.$$"; mkdir -p "$RPM_DIR"
  cargo generate-rpm --target-dir "$STAGE" -s "version = \"$VERSION\"" -o "$RPM_DIR/" >/dev/null
  RPM_FILE="$(ls "$RPM_DIR"/*.rpm)"
  RPM="$OUT/$(basename "$RPM_FILE")"
  mv -f "$RPM_FILE" "$RPM"; rmdir "$RPM_DIR"
  log "rpm built ($(since "$T")): $RPM $(stat -c %s "$RPM") bytes"
  OUTPUTS+=("$RPM")
fi

printf '%s\n' "${OUTPUTS[@]}"
