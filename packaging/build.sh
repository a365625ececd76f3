#!/usr/bin/env bash
# Builds the release binaries and the .deb and .rpm packages of konnectivity-server,
# konnectivity-agent and kube-proxy into target/packages/.
#
#   packaging/build.sh [options] [VERSION]
#
#   VERSION             override the package version (default: Cargo.toml's). The .deb gets
#                       VERSION-1, the .rpm VERSION-1. Used for the N -> N+1 upgrade test.
#   --deb-only          build only the .debs (e.g. the N+1 packages for the upgrade test)
#   --no-build          do not run cargo build; package the existing release binaries in the
#                       target dir (the build CI ran before: `cargo build --release --bins`)
#   --target-dir DIR    where the release binaries are (DIR/release/...; default: cargo's
#                       target dir, which honours CARGO_TARGET_DIR)
#   --binary PATH       package PATH instead of <target-dir>/release/konnectivity-server
#   --agent-binary PATH package PATH instead of <target-dir>/release/konnectivity-agent
#   --kube-proxy-binary PATH  package PATH instead of <target-dir>/release/kube-proxy
#                       (any of the three implies --no-build; development only, e.g.
#                       target/debug/...)
#   --out DIR           output directory (default: <crate>/target/packages)
#
# The maintainer scripts are templates shared by the packages (packaging/deb/*,
# packaging/rpm/*.sh); the #@PACKAGE_VARS@ line of each is replaced with
# packaging/vars/<package>, into target/packaging-scripts/<package>/ (crate-relative, where
# Cargo.toml's package.metadata points).
# Tools: cargo-deb and cargo-generate-rpm are installed with `cargo install --locked` only if
# `command -v` does not find them; `rpm` (for packaging/inspect.sh) from apt only if missing.
# The last stdout lines are the package paths (server, agent, kube-proxy .deb; then the same
# three .rpm).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VERSION="" DEB_ONLY=0 NO_BUILD=0 OUT="$ROOT/target/packages" TARGET_DIR=""
declare -A BINARY=([konnectivity-server]="" [konnectivity-agent]="" [kube-proxy]="")
while [[ $# -gt 0 ]]; do
  case "$1" in
    --deb-only) DEB_ONLY=1 ;;
    --no-build) NO_BUILD=1 ;;
    --target-dir) TARGET_DIR="$(realpath "$2")"; shift ;;
    --target-dir=*) TARGET_DIR="$(realpath "${1#*=}")" ;;
    --binary) BINARY[konnectivity-server]="$(realpath "$2")"; NO_BUILD=1; shift ;;
    --binary=*) BINARY[konnectivity-server]="$(realpath "${1#*=}")"; NO_BUILD=1 ;;
    --agent-binary) BINARY[konnectivity-agent]="$(realpath "$2")"; NO_BUILD=1; shift ;;
    --agent-binary=*) BINARY[konnectivity-agent]="$(realpath "${1#*=}")"; NO_BUILD=1 ;;
    --kube-proxy-binary) BINARY[kube-proxy]="$(realpath "$2")"; NO_BUILD=1; shift ;;
    --kube-proxy-binary=*) BINARY[kube-proxy]="$(realpath "${1#*=}")"; NO_BUILD=1 ;;
    --out) OUT="$2"; shift ;;
    --out=*) OUT="${1#*=}" ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
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

PACKAGES=(konnectivity-server konnectivity-agent kube-proxy)
# The tools' variant for each package (Cargo.toml: the base tables, variants.agent and
# variants.kube-proxy).
declare -A VARIANT=([konnectivity-server]="" [konnectivity-agent]="agent" [kube-proxy]="kube-proxy")
DEB_SCRIPTS=(postinst prerm postrm)
RPM_SCRIPTS=(pre.sh post.sh preun.sh postun.sh)

# Everything the packages ship must exist (assets are listed in Cargo.toml).
missing=0
for f in README.md CHANGELOG.md packaging/README.md \
         config/server.toml config/server.toml.deploy \
         systemd/konnectivity-server.service systemd/konnectivity-server.socket \
         systemd/konnectivity-server.sysusers \
         systemd/konnectivity-server.service.d/10-notify-reload.conf \
         packaging/default/konnectivity-server packaging/vars/konnectivity-server \
         config/agent.toml config/agent.toml.deploy \
         systemd/konnectivity-agent.service systemd/konnectivity-agent.sysusers \
         packaging/default/konnectivity-agent packaging/vars/konnectivity-agent \
         config/kube-proxy.toml config/kube-proxy.toml.deploy \
         systemd/kube-proxy.service systemd/kube-proxy.tmpfiles \
         packaging/default/kube-proxy packaging/vars/kube-proxy \
         "${DEB_SCRIPTS[@]/#/packaging/deb/}" "${RPM_SCRIPTS[@]/#/packaging/rpm/}"; do
  [[ -f "$f" ]] || { log "missing $f (a package asset)"; missing=1; }
done
[[ $missing -eq 0 ]] || exit 1

# --- maintainer scripts: the shared templates with each package's variables -----------------
SCRIPTS="$ROOT/target/packaging-scripts"
render() { # <template> <vars file> <output>
  grep -qx '#@PACKAGE_VARS@' "$1" || { log "$1 has no #@PACKAGE_VARS@ line"; return 1; }
  sed -e "/^#@PACKAGE_VARS@\$/{r $2" -e 'd;}' "$1" >"$3"
  chmod 0755 "$3"
  sh -n "$3" || { log "$3: syntax error"; return 1; }
}
for pkg in "${PACKAGES[@]}"; do
  vars="packaging/vars/$pkg"
  # The scripts' user must be the one systemd/$pkg.sysusers declares (the .rpm %pre and the
  # .deb fallbacks create it without that file); a package that runs as root has no such file.
  # shellcheck disable=SC1090
  if [[ "$(. "./$vars"; echo "$USER")" == root ]]; then
    want="root" got="$(. "./$vars"; echo "$USER"; [[ "$PKG" == "$pkg" ]] || echo "PKG=$PKG")"
    [[ ! -e "systemd/$pkg.sysusers" ]] || { log "$vars runs $pkg as root, but systemd/$pkg.sysusers exists"; exit 1; }
  else
    want="$(grep -v '^#' "systemd/$pkg.sysusers" | grep .)"
    # shellcheck disable=SC1090
    got="$(. "./$vars"; echo "u $USER - \"$DESCRIPTION\" /var/lib/$PKG -"; [[ "$PKG" == "$pkg" ]] || echo "PKG=$PKG")"
  fi
  [[ "$got" == "$want" ]] || { log "$vars does not match systemd/$pkg.sysusers: '$got' vs '$want'"; exit 1; }
  rm -rf "${SCRIPTS:?}/$pkg"; mkdir -p "$SCRIPTS/$pkg/deb" "$SCRIPTS/$pkg/rpm"
  # The assignments only (the comments stay in packaging/vars/).
  { echo "# from packaging/vars/$pkg"; grep -v '^[[:space:]]*#' "$vars" | grep .; } >"$SCRIPTS/$pkg/vars"
  for s in "${DEB_SCRIPTS[@]}"; do render "packaging/deb/$s" "$SCRIPTS/$pkg/vars" "$SCRIPTS/$pkg/deb/$s" || exit 1; done
  for s in "${RPM_SCRIPTS[@]}"; do render "packaging/rpm/$s" "$SCRIPTS/$pkg/vars" "$SCRIPTS/$pkg/rpm/$s" || exit 1; done
done

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

# --- binaries ---------------------------------------------------------------------------------
if [[ -z "$TARGET_DIR" ]]; then
  TARGET_DIR="$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
fi
if [[ $NO_BUILD -eq 0 ]]; then
  T=$(now)
  # The same command as CI's (.ci/run), so either one leaves nothing for the other to build.
  log "cargo build --release --bins (target dir $TARGET_DIR)"
  # The flags every release build uses (--remap-path-prefix): CI's, benches/run's and this.
  # shellcheck source=packaging/release-env.sh
  (export CARGO_TARGET_DIR="$TARGET_DIR"; . "$ROOT/packaging/release-env.sh" && cargo build --release --bins >&2)
  log "release build done ($(since "$T"))"
fi
# Both packagers read <target-dir>/release/<binary>. Stage stripped copies there
# (cargo-generate-rpm does not strip; the build output and the release profile stay untouched).
STAGE="$OUT/.stage"
rm -rf "$STAGE"; mkdir -p "$STAGE/release"
trap 'rm -rf "$STAGE"' EXIT
for pkg in "${PACKAGES[@]}"; do
  bin="${BINARY[$pkg]}"
  if [[ -z "$bin" ]]; then bin="$TARGET_DIR/release/$pkg"
  else log "packaging $bin (development: not a release build)"; fi
  [[ -x "$bin" ]] || { log "no binary at $bin"; exit 1; }
  strip --strip-unneeded -o "$STAGE/release/$pkg" "$bin"
done

export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || date +%s)}"

# --- generated assets (target/packaging-generated/, crate-relative like the scripts) ---------
# Man pages and completions from konnectivity-gen (built by `cargo build --release --bins`
# beside the programs; with --binary, the one next to that binary), the DEP-5 copyright, the
# Debian changelog. The Cargo.toml asset lists point here.
T=$(now)
GEN="$ROOT/target/packaging-generated"
rm -rf "$GEN"; mkdir -p "$GEN"
GEN_BIN="$TARGET_DIR/release/konnectivity-gen"
for b in "${BINARY[@]}"; do
  [[ -n "$b" && -x "$(dirname "$b")/konnectivity-gen" ]] && GEN_BIN="$(dirname "$b")/konnectivity-gen"
done
[[ -x "$GEN_BIN" ]] || { log "no $GEN_BIN (cargo build --release --bins builds it)"; exit 1; }
"$GEN_BIN" "$GEN"
# Debian policy: man pages gzip -9, no name or time stamp (reproducible).
gzip -9n "$GEN"/man/*
"$ROOT/packaging/copyright.sh" >"$GEN/copyright"
MAINTAINER="$(sed -n 's/^maintainer *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)"
# One entry: this packaging of the version; the upstream changes are CHANGELOG.md, shipped as
# changelog.gz beside it.
cat >"$GEN/changelog.Debian" <<CHANGELOG
konnectivity-server ($DEB_VERSION) unstable; urgency=medium

  * Package konnectivity-server $VERSION (the programs' changes: changelog.gz).

 -- $MAINTAINER  $(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")
CHANGELOG
log "generated man pages, completions, copyright, changelog ($(since "$T")): $(find "$GEN" -type f | wc -l) files"

# --- packages: the three packages side by side (xz/zstd compress on one core each) ----------
build_deb() { # <package>
  local pkg="$1" T DEB; T=$(now)
  DEB="$OUT/${pkg}_${DEB_VERSION}_${ARCH_DEB}.deb"
  CARGO_TARGET_DIR="$STAGE" cargo deb --no-build ${VARIANT[$pkg]:+--variant="${VARIANT[$pkg]}"} \
    --deb-version "$DEB_VERSION" -o "$DEB" >/dev/null || return 1
  [[ "$(dpkg-deb -f "$DEB" Package)" == "$pkg" ]] || { log "$DEB is not package $pkg"; return 1; }
  log "deb built ($(since "$T")): $DEB $(stat -c %s "$DEB") bytes"
}
build_rpm() { # <package>
  local pkg="$1" T RPM_DIR RPM_FILE RPM; T=$(now)
  RPM_DIR="$OUT/.rpm.$pkg.$$"; rm -rf "$RPM_DIR"; mkdir -p "$RPM_DIR"
  cargo generate-rpm --target-dir "$STAGE" ${VARIANT[$pkg]:+--variant="${VARIANT[$pkg]}"} \
    -s "version = \"$VERSION\"" -o "$RPM_DIR/" >/dev/null || return 1
  RPM_FILE="$(ls "$RPM_DIR"/*.rpm)"
  RPM="$OUT/$(basename "$RPM_FILE")"
  [[ "$(basename "$RPM")" == "$pkg-$VERSION-"* ]] || { log "$RPM_FILE is not package $pkg"; return 1; }
  mv -f "$RPM_FILE" "$RPM"; rmdir "$RPM_DIR"
  echo "$RPM" >"$STAGE/$pkg.rpm-path"
  log "rpm built ($(since "$T")): $RPM $(stat -c %s "$RPM") bytes"
}
OUTPUTS=()
for kind in deb rpm; do
  [[ $kind == rpm && $DEB_ONLY -eq 1 ]] && continue
  pids=()
  for pkg in "${PACKAGES[@]}"; do "build_$kind" "$pkg" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || { log "a .$kind build failed"; exit 1; }; done
  for pkg in "${PACKAGES[@]}"; do
    if [[ $kind == deb ]]; then OUTPUTS+=("$OUT/${pkg}_${DEB_VERSION}_${ARCH_DEB}.deb")
    else OUTPUTS+=("$(cat "$STAGE/$pkg.rpm-path")"); fi
  done
done

printf '%s\n' "${OUTPUTS[@]}"
