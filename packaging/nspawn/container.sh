# shellcheck shell=bash
# packaging/nspawn-test.sh and packaging/nspawn-kube-proxy-test.sh, sourced: the host tools, the
# cached Debian 12 rootfs, the scratch overlay on it, the cleanup, and the boot. Defines
# functions and sets the tools up; each entry script calls ensure_rootfs, make_scratch and
# boot_container in its own order.

SUITE=bookworm
# Packages in the rootfs (the cache key is derived from this list). nftables and iptables:
# kube-proxy's package depends on nftables (dpkg -i resolves nothing), and its test plants
# upstream's iptables leftovers; socat: its relay to the API server.
PKGS=(systemd systemd-sysv dbus procps nftables iptables socat)
ROOTFS_SETUP_VERSION=2   # bump when the post-debootstrap setup below changes
ARCH="$(dpkg --print-architecture)"

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

# ------------------------------------------------------------------------------ rootfs ------
MIRROR="${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
KEY="$(printf '%s\n' "$SUITE" minbase "${PKGS[@]}" "setup=$ROOTFS_SETUP_VERSION" "$ARCH" | sha256sum | cut -c1-12)"
CACHE_ROOT="${NSPAWN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/konnectivity-nspawn}"
ROOTFS="$CACHE_ROOT/$SUITE-$KEY"

# The cached rootfs: built once (debootstrap), renamed into place only when complete. Two
# entry scripts may ask at once: the second waits on the lock and finds it built.
ensure_rootfs() {
  mkdir -p "$CACHE_ROOT"
  exec {ROOTFS_LOCK}>"$CACHE_ROOT/.lock"
  flock "$ROOTFS_LOCK"
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
    local R="$BUILD/rootfs" u
    echo konnectivity-test >"$R/etc/hostname"
    # Quiet, fast, non-interactive boots: no console getty or first-boot prompts, no apt timers.
    # nftables.service loads /etc/nftables.conf, which begins with `flush ruleset`: never in a
    # container (in one that shares the host's network namespace it would aim at the host's).
    for u in console-getty.service getty@.service systemd-firstboot.service apt-daily.timer \
             apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service nftables.service; do
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
  flock -u "$ROOTFS_LOCK"
  log "rootfs: $ROOTFS ($(du -sh "$ROOTFS" 2>/dev/null | cut -f1))"
}

# ------------------------------------------------------------------------------ scratch -----
NSPAWN_PID="" LEADER="" OVERLAY=0 SCRATCH="" MERGED=""
declare -a HOST_PIDS=()
# Commands the entry script adds (eval'd first by cleanup, last added first): what it made
# on the host besides processes, such as network namespaces.
declare -a CLEANUP_HOOKS=()

cleanup() {
  local rc=$? i alive p
  for (( i = ${#CLEANUP_HOOKS[@]} - 1; i >= 0; i-- )); do eval "${CLEANUP_HOOKS[$i]}"; done
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
  # The container's PID 1 may outlive systemd-nspawn (killed): power it off through its own pid.
  if [[ -n "$LEADER" ]] && kill -0 "$LEADER" 2>/dev/null && [[ "$(cat "/proc/$LEADER/comm" 2>/dev/null)" == systemd ]]; then
    nsenter -t "$LEADER" -a -- /bin/systemctl poweroff --no-block >/dev/null 2>&1
  fi
  if [[ -n "$NSPAWN_PID" ]] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
    for _ in $(seq 1 100); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$NSPAWN_PID" 2>/dev/null; then
      kill -TERM "$NSPAWN_PID" 2>/dev/null; sleep 3; kill -KILL "$NSPAWN_PID" 2>/dev/null
    fi
    wait "$NSPAWN_PID" 2>/dev/null
  fi
  if [[ -n "$LEADER" ]]; then
    for _ in $(seq 1 50); do [[ "$(cat "/proc/$LEADER/comm" 2>/dev/null)" == systemd ]] || break; sleep 0.2; done
  fi
  if [[ $OVERLAY -eq 1 ]]; then umount "$MERGED" 2>/dev/null || umount -l "$MERGED" 2>/dev/null; fi
  if [[ -n "$SCRATCH" ]]; then
    if [[ "${KEEP_SCRATCH:-0}" == 1 ]]; then echo "scratch kept: $SCRATCH"; else rm -rf "$SCRATCH"; fi
  fi
  exit $rc
}

make_scratch() { # <name prefix>: SCRATCH (under /var/tmp), MERGED (the overlay on the rootfs)
  SCRATCH="$(mktemp -d "/var/tmp/$1.XXXXXX")"
  MERGED="$SCRATCH/root"; mkdir -p "$MERGED" "$SCRATCH/upper" "$SCRATCH/work" "$SCRATCH/host"
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
}

# N+1 for an upgrade test: the N payload under a higher version (tests the upgrade path, not
# new code). Rebuilt every run, so it can never be stale.
repack_n1() { # <deb> <out>: version $NEXT_VERSION-1
  local d; d="$(mktemp -d "$SCRATCH/n1.XXXXXX")"
  dpkg-deb -R "$1" "$d/p" && sed -i "s/^Version: .*/Version: ${NEXT_VERSION}-1/" "$d/p/DEBIAN/control" \
    && dpkg-deb --root-owner-group -Zgzip -z1 -b "$d/p" "$2" >/dev/null
  local rc=$?; rm -rf "$d"; return $rc
}

# ------------------------------------------------------------------------------ boot --------
# Run a command inside the container (all its namespaces, clean environment).
c() { nsenter -t "$LEADER" -a -- /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        SYSTEMD_PAGER=cat SYSTEMD_COLORS=0 "$@"; }

boot_container() { # <machine name> [more systemd-nspawn options]: NSPAWN_PID, LEADER, CROOT, BOOT_S
  local name="$1" state deadline; shift
  step_begin "boot (systemd-nspawn -b${*:+ $*}, until is-system-running)"
  systemd-nspawn --register=no --keep-unit -q -D "$MERGED" -M "$name" "$@" -b --console=pipe \
    </dev/null >"$SCRATCH/console.log" 2>&1 &
  NSPAWN_PID=$!
  for _ in $(seq 1 100); do
    LEADER="$(pgrep -P "$NSPAWN_PID" | head -n1)"
    [[ -n "$LEADER" ]] && [[ "$(cat "/proc/$LEADER/comm" 2>/dev/null)" == systemd ]] && break
    LEADER=""; sleep 0.1
  done
  [[ -n "$LEADER" ]] || { cat "$SCRATCH/console.log"; die "container did not start"; }
  CROOT="/proc/$LEADER/root"
  # PID 1 may not accept bus connections yet ("Failed to connect to bus"), or not yet be the
  # manager systemctl can talk to ("offline", seen once in a few runs right after the start):
  # retry until it answers.
  deadline=$(( $(date +%s) + 60 ))
  while :; do
    state="$(c timeout 60 systemctl is-system-running --wait 2>&1)"
    [[ ( "$state" == *"Failed to connect to bus"* || "$state" == offline ) && $(date +%s) -lt $deadline ]] || break
    sleep 0.1
  done
  log "system state: $state (container PID 1 = host pid $LEADER)"
  [[ "$state" == running || "$state" == degraded ]] || { cat "$SCRATCH/console.log"; die "boot did not finish ($state)"; }
  [[ "$state" == degraded ]] && c systemctl --failed --no-legend
  BOOT_S=$(dur "$STEP_T")
  step_end
}
