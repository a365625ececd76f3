#!/usr/bin/env bash
# kube-proxy's real-systemd stage: boots Debian 12 (systemd 252) with systemd-nspawn and a
# private network namespace (--private-network: kube-proxy never programs the host's), installs
# the kube-proxy .deb and runs it as the packaged service with the command line of an existing
# install unit, against the test API server (tests/kube, on the host's loopback, reached from
# the container through a Unix socket bind-mounted in and socat inside).
# packaging/nspawn-test.sh starts it beside its own container; it also runs alone.
#
#   packaging/nspawn-kube-proxy-test.sh [DEB_N [DEB_N1]]
#
#   DEB_N    the package under test (default: target/packages/kube-proxy_<ver>-1_<arch>.deb;
#            built with packaging/build.sh if missing)
#   DEB_N1   a higher version for the upgrade test (default: DEB_N's payload repacked as
#            <ver>+nspawn1-1)
#
# The node is the container's network namespace. The test gives it a client and a pod, each a
# network namespace of its own (`ip netns`, named kpn<pid>-*) on a veth into the container's:
#
#   client  10.12.51.2/24 -- eth0 10.12.51.171/24  node (the container)  vp1 10.254.1.1/32 -- 10.254.1.2/32  pod
#
# 10.12.51.171 is the reference unit's --bind-address and --hostname-override, so its flags
# are used as they are. The Service 10.96.0.80:80 has the pod's port 8080 as its endpoint
# (packaging/kube-proxy-traffic.py serves it, and drives the client's connections).
#
# Environment: KUBE_BIN_DIR (kube-apiserver and etcd; default: tests/kube/build.sh's cache,
# built there if missing, ~10 min cold), NSPAWN_CACHE, DEBIAN_MIRROR, KEEP_SCRATCH=1 (as
# packaging/nspawn-test.sh). Needs root, iproute2, python3, curl, jq.
#
# Every check is run (a failed check does not stop later ones); the exit code is non-zero if
# any failed, and then the container's journal is printed. Each step's duration is printed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UNIT=kube-proxy.service

# shellcheck source=packaging/nspawn/common.sh
. "$ROOT/packaging/nspawn/common.sh"
# shellcheck source=packaging/kube-proxy-cluster.sh
. "$ROOT/packaging/kube-proxy-cluster.sh"

[[ $EUID -eq 0 ]] || { echo "nspawn-kube-proxy-test.sh: must run as root" >&2; exit 2; }
trap 'exit 130' INT TERM

# The stages, in order, each in its own file: they share this shell and its variables.
for part in setup install start reload restart lifecycle; do
  # shellcheck source=/dev/null
  . "$ROOT/packaging/nspawn/kube-proxy/$part.sh"
done

# ------------------------------------------------------------------------------ report ------
if [[ $FAILS -gt 0 ]]; then
  echo; echo "=== container journal (journalctl -b, last 200 lines)"
  c journalctl -b --no-pager -n 200 2>&1
  echo; echo "=== journalctl -u $UNIT (last 150 lines)"
  c journalctl -u "$UNIT" --no-pager 2>&1 | tail -n 150
  for f in "$SCRATCH"/host/*.log; do [[ -f "$f" ]] && { echo; echo "=== $f"; tail -n 30 "$f"; }; done
fi

step_begin "poweroff"
c systemctl poweroff --no-block >/dev/null 2>&1
for _ in $(seq 1 150); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.1; done
wait "$NSPAWN_PID" 2>/dev/null; NSPAWN_RC=$?
kill -0 "$NSPAWN_PID" 2>/dev/null && fail "container did not power off" || NSPAWN_PID=""
step_end

echo; echo "=== timings"; printf '%s\n' "${TIMINGS[@]}"
printf '%8ss  total\n' "$(dur "$T_START")"
echo; echo "=== results"; printf '%s\n' "${RESULTS[@]}"
echo; echo "systemd-analyze security: ${SECURITY:-?}"
echo "boot ${BOOT_S:-?}s; systemctl start ${START_S:-?}s with the API server held back ${API_DELAY:-?}s; restart ${RESTART_S:-?}s; nspawn exit code ${NSPAWN_RC:-?}"
if [[ $FAILS -gt 0 ]]; then echo "nspawn-kube-proxy-test.sh: $FAILS check(s) FAILED"; exit 1; fi
echo "nspawn-kube-proxy-test.sh: all checks passed"
