# shellcheck shell=bash
# packaging/nspawn-test.sh, sourced: the packages under test, the cached Debian 12 rootfs, the scratch overlay, and the boot.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# shellcheck source=packaging/nspawn/container.sh
. "$ROOT/packaging/nspawn/container.sh"

# ------------------------------------------------------------------------------ packages ----
VERSION="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)"
DEB_N="${1:-$ROOT/target/packages/konnectivity-server_${VERSION}-1_${ARCH}.deb}"
NEXT_VERSION="${VERSION}+nspawn1"
DEB_N1="${2:-}"
ADEB_N="${3:-$ROOT/target/packages/konnectivity-agent_${VERSION}-1_${ARCH}.deb}"
ADEB_N1="${4:-}"
if [[ ! -f "$DEB_N" || ! -f "$ADEB_N" ]]; then
  step_begin "build packages (packaging/build.sh)"
  "$ROOT/packaging/build.sh" >/dev/null || die "packaging/build.sh failed"
  step_end
fi
DEB_N_VER="$(dpkg-deb -f "$DEB_N" Version)" || die "not a .deb: $DEB_N"
ADEB_N_VER="$(dpkg-deb -f "$ADEB_N" Version)" || die "not a .deb: $ADEB_N"
[[ "$(dpkg-deb -f "$ADEB_N" Package)" == konnectivity-agent ]] || die "$ADEB_N is not the konnectivity-agent package"
log "package N: $DEB_N ($DEB_N_VER, $(stat -c %s "$DEB_N") bytes)"
log "agent package N: $ADEB_N ($ADEB_N_VER, $(stat -c %s "$ADEB_N") bytes)"

ensure_rootfs
# kube-proxy's stage (packaging/nspawn-kube-proxy-test.sh) boots a container of its own, with a
# private network namespace, beside this one: it starts once the rootfs is built, and its
# report is printed and counted at the end (kube_proxy_report).
kube_proxy_start
make_scratch konnectivity-nspawn
mkdir -p "$SCRATCH/certs"

# N+1: the N payload under a higher version (repack_n1); both packages side by side.
if [[ -z "$DEB_N1" || -z "$ADEB_N1" ]]; then
  step_begin "N+1 .debs: repack as ${NEXT_VERSION}-1"
  pids=()
  if [[ -z "$DEB_N1" ]]; then
    DEB_N1="$SCRATCH/konnectivity-server_${NEXT_VERSION}-1_${ARCH}.deb"; repack_n1 "$DEB_N" "$DEB_N1" & pids+=($!)
  fi
  if [[ -z "$ADEB_N1" ]]; then
    ADEB_N1="$SCRATCH/konnectivity-agent_${NEXT_VERSION}-1_${ARCH}.deb"; repack_n1 "$ADEB_N" "$ADEB_N1" & pids+=($!)
  fi
  for p in "${pids[@]}"; do wait "$p" || die "repacking the N+1 .debs failed"; done
  step_end
fi
DEB_N1_VER="$(dpkg-deb -f "$DEB_N1" Version)" || die "not a .deb: $DEB_N1"
dpkg --compare-versions "$DEB_N1_VER" gt "$DEB_N_VER" || die "DEB_N1 ($DEB_N1_VER) is not newer than DEB_N ($DEB_N_VER)"
ADEB_N1_VER="$(dpkg-deb -f "$ADEB_N1" Version)" || die "not a .deb: $ADEB_N1"
dpkg --compare-versions "$ADEB_N1_VER" gt "$ADEB_N_VER" || die "AGENT_DEB_N1 ($ADEB_N1_VER) is not newer than AGENT_DEB_N ($ADEB_N_VER)"
log "package N+1: $DEB_N1_VER, agent $ADEB_N1_VER"

# debootstrap writes no /etc/hosts; a real system has one (our agent resolves localhost).
printf '%s\n' "127.0.0.1	localhost" "::1		localhost ip6-localhost ip6-loopback" >"$MERGED/etc/hosts"

# ------------------------------------------------------------------------------ boot --------
boot_container "ktest$$"
