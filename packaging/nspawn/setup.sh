# shellcheck shell=bash
# packaging/nspawn-test.sh, sourced: the host tools, the packages under test, the cached Debian 12 rootfs, the scratch overlay, and the boot.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# ------------------------------------------------------------------------------ tools -------
need_apt=()
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v systemd-nspawn >/dev/null || need_apt+=(systemd-container)
command -v openssl >/dev/null || need_apt+=(openssl)
command -v curl >/dev/null || need_apt+=(curl)
command -v jq >/dev/null || need_apt+=(jq)
if [[ ${#need_apt[@]} -gt 0 ]]; then
  step_begin "apt-get install ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null \
    || die "apt-get install ${need_apt[*]} failed"
  step_end
fi

# ------------------------------------------------------------------------------ packages ----
VERSION="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)"
ARCH="$(dpkg --print-architecture)"
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

# ------------------------------------------------------------------------------ rootfs ------
MIRROR="${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
KEY="$(printf '%s\n' "$SUITE" minbase "${PKGS[@]}" "setup=$ROOTFS_SETUP_VERSION" "$ARCH" | sha256sum | cut -c1-12)"
CACHE_ROOT="${NSPAWN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/konnectivity-nspawn}"
ROOTFS="$CACHE_ROOT/$SUITE-$KEY"
mkdir -p "$CACHE_ROOT"
if [[ -f "$ROOTFS/.complete" ]]; then
  step_begin "rootfs (warm cache: $ROOTFS)"
  step_end
else
  step_begin "rootfs (cold: debootstrap $SUITE minbase + ${PKGS[*]} from $MIRROR)"
  BUILD="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
  # Interrupted or failed: unmount whatever debootstrap left mounted inside, then remove the
  # temp dir (it never has the final name, so it could not be reused anyway).
  drop_build() {
    awk -v b="$BUILD/" 'index($2, b) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
    rm -rf --one-file-system "$BUILD"
  }
  trap 'drop_build' EXIT
  if ! debootstrap --variant=minbase --include="$(IFS=,; echo "${PKGS[*]}")" "$SUITE" "$BUILD/rootfs" "$MIRROR" \
       >"$BUILD/debootstrap.log" 2>&1; then
    tail -n 30 "$BUILD/debootstrap.log"; die "debootstrap failed"
  fi
  R="$BUILD/rootfs"
  echo konnectivity-test >"$R/etc/hostname"
  # Quiet, fast, non-interactive boots: no console getty or first-boot prompts, no apt timers.
  for u in console-getty.service getty@.service systemd-firstboot.service apt-daily.timer \
           apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service; do
    ln -sf /dev/null "$R/etc/systemd/system/$u"
  done
  rm -f "$R/var/cache/apt/archives/"*.deb
  printf '%s\n' "suite=$SUITE" "packages=${PKGS[*]}" "mirror=$MIRROR" "built=$(date -u +%FT%TZ)" >"$R/.konnectivity-rootfs"
  touch "$R/.complete"
  rm -rf "$ROOTFS"
  mv "$R" "$ROOTFS"          # atomic: a half-built rootfs is never under the final name
  rm -rf "$BUILD"
  trap - EXIT
  step_end
fi
log "rootfs: $ROOTFS ($(du -sh "$ROOTFS" 2>/dev/null | cut -f1))"

# ------------------------------------------------------------------------------ scratch -----
SCRATCH="$(mktemp -d /var/tmp/konnectivity-nspawn.XXXXXX)"
MERGED="$SCRATCH/root"; mkdir -p "$MERGED" "$SCRATCH/upper" "$SCRATCH/work" "$SCRATCH/certs" "$SCRATCH/host"
NSPAWN_PID="" LEADER="" OVERLAY=0
declare -a HOST_PIDS=()

cleanup() {
  local rc=$?
  # Host processes started by this script (by PID). The upstream agent drains on the first
  # SIGTERM and stops on the second; anything left after 2 s gets SIGKILL.
  if [[ ${#HOST_PIDS[@]} -gt 0 ]]; then
    kill -TERM "${HOST_PIDS[@]}" 2>/dev/null; sleep 0.2; kill -TERM "${HOST_PIDS[@]}" 2>/dev/null
    for _ in $(seq 1 20); do
      alive=0; for p in "${HOST_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      [[ $alive -eq 1 ]] || break; sleep 0.1
    done
    kill -KILL "${HOST_PIDS[@]}" 2>/dev/null
    wait "${HOST_PIDS[@]}" 2>/dev/null
  fi
  if [[ -n "$NSPAWN_PID" ]] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
    [[ -n "$LEADER" ]] && nsenter -t "$LEADER" -a -- /bin/systemctl poweroff --no-block >/dev/null 2>&1
    for _ in $(seq 1 100); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$NSPAWN_PID" 2>/dev/null; then
      kill -TERM "$NSPAWN_PID" 2>/dev/null; sleep 3; kill -KILL "$NSPAWN_PID" 2>/dev/null
    fi
    wait "$NSPAWN_PID" 2>/dev/null
  fi
  if [[ $OVERLAY -eq 1 ]]; then umount "$MERGED" 2>/dev/null || umount -l "$MERGED" 2>/dev/null; fi
  if [[ "${KEEP_SCRATCH:-0}" == 1 ]]; then echo "scratch kept: $SCRATCH"; else rm -rf "$SCRATCH"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step_begin "scratch root (overlay on the cached rootfs, or a copy)"
if mount -t overlay overlay -o "lowerdir=$ROOTFS,upperdir=$SCRATCH/upper,workdir=$SCRATCH/work" "$MERGED" 2>/dev/null; then
  OVERLAY=1; log "overlayfs: $MERGED"
else
  cp -a --reflink=auto "$ROOTFS/." "$MERGED/" || die "copy rootfs"
  log "overlayfs unavailable, copied the rootfs"
fi
step_end

# N+1: the N payload under a higher version (tests the upgrade path, not new code). Rebuilt
# every run so it can never be stale; both packages side by side.
repack_n1() { # <deb> <out>
  local d; d="$(mktemp -d "$SCRATCH/n1.XXXXXX")"
  dpkg-deb -R "$1" "$d/p" && sed -i "s/^Version: .*/Version: ${NEXT_VERSION}-1/" "$d/p/DEBIAN/control" \
    && dpkg-deb --root-owner-group -Zgzip -z1 -b "$d/p" "$2" >/dev/null
  local rc=$?; rm -rf "$d"; return $rc
}
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
step_begin "boot (systemd-nspawn -b, until is-system-running)"
systemd-nspawn --register=no --keep-unit -q -D "$MERGED" -M "ktest$$" -b --console=pipe \
  </dev/null >"$SCRATCH/console.log" 2>&1 &
NSPAWN_PID=$!
for _ in $(seq 1 100); do
  LEADER="$(pgrep -P "$NSPAWN_PID" | head -n1)"
  [[ -n "$LEADER" ]] && [[ "$(cat "/proc/$LEADER/comm" 2>/dev/null)" == systemd ]] && break
  LEADER=""; sleep 0.1
done
[[ -n "$LEADER" ]] || { cat "$SCRATCH/console.log"; die "container did not start"; }
CROOT="/proc/$LEADER/root"

# Run a command inside the container (all its namespaces, clean environment).
c() { nsenter -t "$LEADER" -a -- /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        SYSTEMD_PAGER=cat SYSTEMD_COLORS=0 "$@"; }
# PID 1 may not accept bus connections yet ("Failed to connect to bus"), or not yet be the
# manager systemctl can talk to ("offline", seen once in a few runs right after the start):
# retry until it answers.
BOOT_DEADLINE=$(( $(date +%s) + 60 ))
while :; do
  STATE="$(c timeout 60 systemctl is-system-running --wait 2>&1)"
  [[ ( "$STATE" == *"Failed to connect to bus"* || "$STATE" == offline ) && $(date +%s) -lt $BOOT_DEADLINE ]] || break
  sleep 0.1
done
log "system state: $STATE (container PID 1 = host pid $LEADER)"
[[ "$STATE" == running || "$STATE" == degraded ]] || { cat "$SCRATCH/console.log"; die "boot did not finish ($STATE)"; }
[[ "$STATE" == degraded ]] && c systemctl --failed --no-legend
BOOT_S=$(dur "$STEP_T")
step_end
