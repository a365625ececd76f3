#!/usr/bin/env bash
# The real-systemd stage: boots Debian 12 (systemd 252) with systemd-nspawn, installs the
# konnectivity-server and konnectivity-agent .debs and drives both services with
# systemctl/journalctl. Run it on its own (the container shares the host's network namespace;
# the server and the agent inside listen on random ports in 20000-29999).
# kube-proxy's package is tested beside it, in a container of its own with a private network
# namespace: packaging/nspawn-kube-proxy-test.sh, started here once the rootfs is ready; its
# report comes before this one's summary, and its failures count here.
#
#   packaging/nspawn-test.sh [DEB_N [DEB_N1 [AGENT_DEB_N [AGENT_DEB_N1]]]]
#
#   DEB_N         server package under test (default:
#                 target/packages/konnectivity-server_<ver>-1_<arch>.deb; both packages are
#                 built with packaging/build.sh if either is missing)
#   DEB_N1        a higher version for the upgrade test (default: DEB_N's payload repacked as
#                 version <ver>+nspawn1-1; `packaging/build.sh --deb-only VERSION` builds a real one)
#   AGENT_DEB_N   agent package under test (default: target/packages/konnectivity-agent_<ver>-1_<arch>.deb)
#   AGENT_DEB_N1  its higher version (default: AGENT_DEB_N repacked as <ver>+nspawn1-1)
#
# Our agent runs in the container as the packaged service, beside an upstream agent on the
# host (with INTEROP_BIN_DIR): the server routes with destHost, so tunnels to 127.0.0.1 go
# through the upstream agent (ipv4=127.0.0.1) and tunnels to localhost through ours
# (host=localhost; it resolves the name with the container's /etc/hosts).
#
# Environment:
#   INTEROP_BIN_DIR   directory with upstream proxy-agent, http-test-server, proxy-test-client
#                     (last stdout line of tests/interop/build.sh). When set, an upstream agent
#                     on the host connects into the container and tunnels are checked,
#                     including a tunnel that stays up across a certificate reload.
#   REQUIRE_TUNNEL=1  (set by .ci/run; implied by CI=true) the tunnel checks are required: a
#                     missing INTEROP_BIN_DIR or binary is a failed check, not a silent skip.
#   NSPAWN_CACHE      rootfs cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/konnectivity-nspawn)
#   DEBIAN_MIRROR     mirror for debootstrap (default: first URI in /etc/apt/sources.list.d/debian.sources)
#   KEEP_SCRATCH=1    keep the scratch directory (overlay upper dir, logs) for debugging
#   NSPAWN_KUBE_PROXY=0  do not run packaging/nspawn-kube-proxy-test.sh (its own environment
#                     and arguments: see that script)
#
# Every check is run (a failed check does not stop later ones, but a check whose
# precondition failed fails too); the exit code is non-zero if any check failed, and then
# the container's journal is printed. Each step's duration is printed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UNIT=konnectivity-server.service
AUNIT=konnectivity-agent.service

# shellcheck source=packaging/nspawn/common.sh
. "$ROOT/packaging/nspawn/common.sh"

[[ $EUID -eq 0 ]] || { echo "nspawn-test.sh: must run as root" >&2; exit 2; }
trap 'exit 130' INT TERM

# kube-proxy's stage, in the background from when the rootfs is ready (setup.sh), with its
# output in a file: its container, namespaces and API server are its own, and so is its
# cleanup (a TERM from ours runs it).
KP_PID="" KP_LOG="" KP_RC=""
kube_proxy_start() {
  [[ "${NSPAWN_KUBE_PROXY:-1}" != 0 ]] || return 0
  KP_LOG="$(mktemp /var/tmp/kube-proxy-nspawn.XXXXXX.log)"
  "$ROOT/packaging/nspawn-kube-proxy-test.sh" >"$KP_LOG" 2>&1 &
  KP_PID=$!
  CLEANUP_HOOKS+=('kube_proxy_stop')
  log "kube-proxy stage started in the background (pid $KP_PID, log $KP_LOG)"
}
kube_proxy_stop() {
  if [[ -n "$KP_PID" ]] && kill -0 "$KP_PID" 2>/dev/null; then
    kill -TERM "$KP_PID" 2>/dev/null; wait "$KP_PID" 2>/dev/null
  fi
  [[ -n "$KP_LOG" ]] && rm -f "$KP_LOG"
}
kube_proxy_report() {
  [[ -n "$KP_PID" ]] || return 0
  step_begin "wait for the kube-proxy stage (packaging/nspawn-kube-proxy-test.sh)"
  wait "$KP_PID"; KP_RC=$?; KP_PID=""
  step_end
  echo; echo "=== packaging/nspawn-kube-proxy-test.sh (exit code $KP_RC)"
  cat "$KP_LOG"; echo "=== end of packaging/nspawn-kube-proxy-test.sh"; echo
  check "kube-proxy stage: packaging/nspawn-kube-proxy-test.sh passed (exit code $KP_RC)" test "$KP_RC" = 0
}

# Upstream's test client, run so that it fails only for the tunnel's reasons.
# shellcheck source=/dev/null
. "$ROOT/packaging/upstream-test-client.sh"
# The stages, in order, each in its own file: they share this shell and its variables.
for part in setup helpers install tunnel reload lifecycle upgrade; do
  # shellcheck source=/dev/null
  . "$ROOT/packaging/nspawn/$part.sh"
done

# ------------------------------------------------------------------------------ report ------
if [[ $FAILS -gt 0 ]]; then
  echo; echo "=== container journal (journalctl -b, last 300 lines)"
  c journalctl -b --no-pager -n 300 2>&1
  echo; echo "=== journalctl -u $UNIT"
  c journalctl -u "$UNIT" --no-pager 2>&1 | tail -n 100
  echo; echo "=== journalctl -u $AUNIT"
  c journalctl -u "$AUNIT" --no-pager 2>&1 | tail -n 100
  for f in "$SCRATCH"/host/*.log; do [[ -f "$f" ]] && { echo; echo "=== $f"; tail -n 40 "$f"; }; done
fi

step_begin "poweroff"
c systemctl poweroff --no-block >/dev/null 2>&1
for _ in $(seq 1 150); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.1; done
wait "$NSPAWN_PID" 2>/dev/null; NSPAWN_RC=$?
kill -0 "$NSPAWN_PID" 2>/dev/null && fail "container did not power off" || NSPAWN_PID=""
step_end

kube_proxy_report

echo; echo "=== timings"; printf '%s\n' "${TIMINGS[@]}"
printf '%8ss  total\n' "$(dur "$T_START")"
echo; echo "=== results"; printf '%s\n' "${RESULTS[@]}"
echo; echo "systemd-analyze security: $SECURITY"
echo "systemd-analyze security (agent): ${ASECURITY:-?}"
echo "boot to is-system-running: ${BOOT_S}s; stop: ${STOP_S:-?}s; agent start ${ASTART_S:-?}s, agent stop with a tunnel open ${ASTOP_S:-?}s; nspawn exit code ${NSPAWN_RC:-?}"
if [[ $FAILS -gt 0 ]]; then echo "nspawn-test.sh: $FAILS check(s) FAILED"; exit 1; fi
echo "nspawn-test.sh: all checks passed"
