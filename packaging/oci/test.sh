#!/usr/bin/env bash
# The OCI stage: builds the three images with packaging/oci/build.sh and runs them with podman.
#
#   packaging/oci/test.sh
#
#   1. images: size (printed; fails above 25 MB), user 65532:65532 (kube-proxy: root), labels,
#      the exact file list (binary, /usr/bin link, the libraries ldd names, passwd/group/nsswitch,
#      /tmp, home; kube-proxy: nft, its libraries and their copyright files), no shell
#   2. the server as the kubeadm static pod runs it (podman run, host network): certificates
#      from a test CA, the UDS frontend in a host directory, agent/health/admin ports; /healthz
#      200; an agent container from our agent image connects (/readyz 200 on both sides); the
#      upstream proxy-test-client makes a tunnel through the socket, the server and the agent
#      to http-test-server; SIGTERM exits 0; --dev works as uid 65532
#   3. a ConfigMap-style ..data symlink swap (the kubelet's atomic writer) reloads the
#      configuration in place (same process, reloads_total{result="success"} 1)
#   4. podman kube play: packaging/kubernetes/konnectivity-server.yaml (the image replaced),
#      its HA variant, its config-file variant (an edit of the host's server.toml is
#      reloaded), and the upstream-documented kubeadm manifest (packaging/oci/fixtures/, only
#      the image replaced)
#   5. the manifests against a real kube-apiserver (packaging/kubernetes/check.sh): server-side
#      dry run with strict field validation, the egress selector files loaded at start
#   6. kube-proxy: packaging/kubernetes/kube-proxy.yaml (kubeadm's manifest, only the image
#      replaced) under `podman kube play` as the DaemonSet's pod on a node: a network namespace
#      of its own with a client and a pod on veths, a real kube-apiserver; the pod programs that
#      namespace's nftables from the ConfigMap's configuration and a Service answers
#
# Everything runs in a private network namespace (only its loopback is up, so nothing is
# reachable from outside and the manifests' fixed ports 8132-8134 cannot collide) and a
# private mount namespace, where /etc is overlaid so /etc/kubernetes and /etc/konnectivity
# exist for the hostPath volumes without touching the host's /etc. Other ports are random in
# [1024, 49151] with a bind check. Every container and process started is stopped.
#
# Environment:
#   SERVER_BINARY, AGENT_BINARY, KUBE_PROXY_BINARY  the binaries for build.sh (default:
#                     <target dir>/release/konnectivity-server, konnectivity-agent, kube-proxy)
#   INTEROP_BIN_DIR   upstream proxy-agent, proxy-test-client, http-test-server (default: the last
#                     line of tests/interop/build.sh, which builds them on first use)
#   KUBE_BIN_DIR      kube-apiserver and etcd for steps 5 and 6 (default: tests/kube/build.sh's cache
#                     when complete; building it is ~10 min cold, so it is only done under CI)
#   CI=true           nothing may be skipped: a missing agent or kube-proxy binary, upstream
#                     binary or kube-apiserver is a failure
#   KEEP_SCRATCH=1    keep the scratch directory
# Needs root, podman, buildah, runc, openssl, curl, iproute2, nftables, python3, jq (.ci/run
# installs them).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/packaging/oci"
KUBE_DIR="$ROOT/packaging/kubernetes"
CI="${CI:-}"

# ------------------------------------------------------------------------------ outside -----
# Resolve what may need the network (Go module proxy), then re-run inside the namespaces.
if [[ "${1:-}" != --inside ]]; then
  [[ $EUID -eq 0 ]] || { echo "oci/test.sh: must run as root (namespaces, podman)" >&2; exit 2; }
  export OCI_T_START="${OCI_T_START:-$(date +%s.%N)}"
  missing=()
  for t in podman buildah runc openssl curl ip unshare tar strip ldd; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  [[ ${#missing[@]} -eq 0 ]] || { echo "oci/test.sh: missing tools: ${missing[*]} (apt-get install podman buildah runc openssl curl iproute2)" >&2; exit 1; }
  if [[ -z "${INTEROP_BIN_DIR:-}" ]]; then
    if out="$("$ROOT/tests/interop/build.sh")"; then
      INTEROP_BIN_DIR="$(printf '%s\n' "$out" | tail -n 1)"
    else
      echo "oci/test.sh: tests/interop/build.sh failed: the tunnel checks will fail" >&2
    fi
  fi
  export INTEROP_BIN_DIR="${INTEROP_BIN_DIR:-}"
  if [[ -z "${KUBE_BIN_DIR:-}" ]]; then
    if [[ "$CI" == true ]]; then
      # A cache hit once the interop tests (cargo test) have built it.
      if out="$("$ROOT/tests/kube/build.sh")"; then KUBE_BIN_DIR="$(printf '%s\n' "$out" | tail -n 1)"
      else echo "oci/test.sh: tests/kube/build.sh failed: the manifest check will fail" >&2; fi
    else
      # Not built here just for this (~10 min cold): the newest complete cache entry, if any.
      for d in $(ls -td "${XDG_CACHE_HOME:-$HOME/.cache}"/konnectivity-kube/*/ 2>/dev/null); do
        if [[ -f "$d/.complete" && -x "$d/kube-apiserver" && -x "$d/etcd" ]]; then KUBE_BIN_DIR="${d%/}"; break; fi
      done
    fi
  fi
  export KUBE_BIN_DIR="${KUBE_BIN_DIR:-}"
  OCI_OUTER_NS="$(readlink /proc/self/ns/mnt) $(readlink /proc/self/ns/net)"
  export OCI_OUTER_NS
  exec unshare --mount --net -- "$0" --inside
fi

# ------------------------------------------------------------------------------ inside ------
# /etc is overlaid and /etc/kubernetes rewritten below: only ever in namespaces of our own.
read -r OUTER_MNT OUTER_NET <<<"${OCI_OUTER_NS:-}"
if [[ -z "${OUTER_NET:-}" || "$(readlink /proc/self/ns/mnt)" == "$OUTER_MNT" ||
      "$(readlink /proc/self/ns/net)" == "$OUTER_NET" ]]; then
  echo "oci/test.sh: --inside runs only in the private namespaces test.sh makes; run it without arguments" >&2
  exit 2
fi
T_START="$OCI_T_START"
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[%6ss] %s\n' "$(secs "$T_START")" "$*"; }
declare -a TIMINGS=() RESULTS=()
FAILS=0 SKIPS=0
step_begin() { STEP="$1"; STEP_T=$(now); log "--- $STEP"; }
step_end() { local d; d=$(secs "$STEP_T"); TIMINGS+=("$(printf '%7ss  %s' "$d" "$STEP")"); log "    ($STEP: ${d}s)"; }
pass() { RESULTS+=("PASS  $*"); log "PASS  $*"; }
fail() { RESULTS+=("FAIL  $*"); log "FAIL  $*"; FAILS=$((FAILS + 1)); }
skip() { RESULTS+=("SKIP  $*"); log "SKIP  $*"; SKIPS=$((SKIPS + 1)); }
check() { local d="$1"; shift; if "$@"; then pass "$d"; else fail "$d"; fi; }
wait_for() { # <seconds> <command...>
  local end=$(( $(date +%s) + $1 )); shift
  until "$@"; do [[ $(date +%s) -ge $end ]] && return 1; sleep 0.2; done
}
http_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 3 "$1"; }
code_is() { [[ "$(http_code "$2")" == "$1" ]]; }   # <code> <url>

SCRATCH="$(mktemp -d /var/tmp/konnectivity-oci.XXXXXX)"
chmod 0755 "$SCRATCH"
TAG="oci$$"                      # container names of this run
declare -a HOST_PIDS=() CONTAINERS=() PODS=()
# Commands a stage adds for what it made besides containers and processes (eval'd, last first).
declare -a CLEANUP_HOOKS=()

cleanup() {
  local rc=$?
  local c p i
  for p in "${PODS[@]}"; do [[ -n "$p" ]] && podman kube play --down "$p" >/dev/null 2>&1; done
  for (( i = ${#CLEANUP_HOOKS[@]} - 1; i >= 0; i-- )); do eval "${CLEANUP_HOOKS[$i]}"; done
  for c in "${CONTAINERS[@]}"; do podman rm -f -t 2 "$c" >/dev/null 2>&1; done
  if [[ ${#HOST_PIDS[@]} -gt 0 ]]; then
    # The upstream agent drains on the first SIGTERM and stops on the second.
    kill -TERM "${HOST_PIDS[@]}" 2>/dev/null; sleep 0.2; kill -TERM "${HOST_PIDS[@]}" 2>/dev/null
    for _ in $(seq 1 20); do
      alive=0; for p in "${HOST_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      [[ $alive -eq 1 ]] || break; sleep 0.1
    done
    kill -KILL "${HOST_PIDS[@]}" 2>/dev/null
    wait "${HOST_PIDS[@]}" 2>/dev/null
  fi
  [[ -n "${KUBE_RUN_DIR:-}" ]] && "$ROOT/tests/kube/stop.sh" "$KUBE_RUN_DIR" >/dev/null 2>&1
  # Unmount before removing: the submount copies are bind mounts of the real files.
  if [[ ${OVERLAID:-0} -eq 1 ]]; then umount -R -l /etc 2>/dev/null; fi
  if [[ -d "$SCRATCH/etc-sub" ]]; then
    for m in "$SCRATCH"/etc-sub/*; do [[ -e "$m" ]] && umount -l "$m" 2>/dev/null; done
  fi
  if [[ "${KEEP_SCRATCH:-0}" == 1 ]]; then echo "scratch kept: $SCRATCH"; else rm -rf --one-file-system "$SCRATCH"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Upstream's test client, run so that it fails only for the tunnel's reasons.
# shellcheck source=/dev/null
. "$ROOT/packaging/upstream-test-client.sh"
# The stages, in order, each in its own file: they share this shell and its variables.
for part in setup run play kube-proxy; do
  # shellcheck source=/dev/null
  . "$HERE/test.d/$part.sh"
done

# ------------------------------------------------------------------------------ summary -----
echo
echo "=== image sizes"
declare -A IMAGE_NAME=([server]=konnectivity-server [agent]=konnectivity-agent [kube-proxy]=kube-proxy)
for p in server agent kube-proxy; do
  [[ -n "${SIZES[$p]:-}" ]] && printf '  %-20s %10s bytes  %5.1f MB  (limit 25 MB)\n' "${IMAGE_NAME[$p]}" "${SIZES[$p]}" "$(awk -v s="${SIZES[$p]}" 'BEGIN { print s / 1e6 }')"
done
echo "=== step timings"
printf '%s\n' "${TIMINGS[@]}"
echo "=== results"
printf '%s\n' "${RESULTS[@]}"
echo "=== $(grep -c '^PASS' <<<"$(printf '%s\n' "${RESULTS[@]}")") passed, $FAILS failed, $SKIPS skipped; total $(secs "$T_START") s"
[[ $FAILS -eq 0 ]]
