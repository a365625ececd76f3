#!/usr/bin/env bash
# The OCI stage: builds both images with packaging/oci/build.sh and runs them with podman.
#
#   packaging/oci/test.sh
#
#   1. images: size (printed; fails above 25 MB), user 65532:65532, labels, the exact file list
#      (binary, /usr/bin link, the libraries ldd names, passwd/group/nsswitch, /tmp, home), no shell
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
#
# Everything runs in a private network namespace (only its loopback is up, so nothing is
# reachable from outside and the manifests' fixed ports 8132-8134 cannot collide) and a
# private mount namespace, where /etc is overlaid so /etc/kubernetes and /etc/konnectivity
# exist for the hostPath volumes without touching the host's /etc. Other ports are random in
# [1024, 49151] with a bind check. Every container and process started is stopped.
#
# Environment:
#   SERVER_BINARY, AGENT_BINARY  the binaries for build.sh
#                     (default: <target dir>/release/konnectivity-server, konnectivity-agent)
#   INTEROP_BIN_DIR   upstream proxy-agent, proxy-test-client, http-test-server (default: the last
#                     line of tests/interop/build.sh, which builds them on first use)
#   KUBE_BIN_DIR      kube-apiserver and etcd for step 5 (default: tests/kube/build.sh's cache
#                     when complete; building it is ~10 min cold, so it is only done under CI)
#   CI=true           nothing may be skipped: a missing agent binary, upstream binary or
#                     kube-apiserver is a failure
#   KEEP_SCRATCH=1    keep the scratch directory
# Needs root, podman, buildah, runc, openssl, curl, iproute2 (.ci/run installs them).
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

cleanup() {
  local rc=$?
  local c p
  for p in "${PODS[@]}"; do [[ -n "$p" ]] && podman kube play --down "$p" >/dev/null 2>&1; done
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

# ------------------------------------------------------------------------------ namespaces --
step_begin "namespaces: private network (loopback only), private mounts with /etc overlaid"
ip link set lo up || { fail "ip link set lo up"; exit 1; }
# Submounts under /etc (a container's resolv.conf, say) are hidden by the overlay: keep them.
mapfile -t ETC_SUBMOUNTS < <(awk '$5 ~ "^/etc/" { print $5 }' /proc/self/mountinfo)
mkdir -p "$SCRATCH/etc-upper" "$SCRATCH/etc-work" "$SCRATCH/etc-sub"
i=0; for m in "${ETC_SUBMOUNTS[@]}"; do
  touch "$SCRATCH/etc-sub/$i"; mount --bind "$m" "$SCRATCH/etc-sub/$i"; i=$((i + 1))
done
if mount -t overlay overlay -o "lowerdir=/etc,upperdir=$SCRATCH/etc-upper,workdir=$SCRATCH/etc-work" /etc; then
  OVERLAID=1
  i=0; for m in "${ETC_SUBMOUNTS[@]}"; do mount --bind "$SCRATCH/etc-sub/$i" "$m"; i=$((i + 1)); done
  pass "loopback up, /etc overlaid (the host's /etc is not written)"
else
  fail "overlay mount on /etc"; exit 1
fi
for d in /etc/kubernetes /etc/konnectivity; do
  rm -rf "$d"; mkdir -p "$d"     # in the overlay: the host's own copies (if any) are not used
done
# podman's defaults fail here (rlimits, crun and hybrid cgroups): runc, no ulimits, cgroupfs.
if [[ -z "${CONTAINERS_CONF:-}" ]]; then
  export CONTAINERS_CONF="$SCRATCH/containers.conf"
  printf '%s\n' '[containers]' 'default_ulimits = []' '' '[engine]' 'cgroup_manager = "cgroupfs"' 'runtime = "runc"' >"$CONTAINERS_CONF"
fi
log "CONTAINERS_CONF=$CONTAINERS_CONF; $(podman --version), $(buildah --version | cut -d' ' -f1-3), $(runc --version | head -n1)"
step_end

# ------------------------------------------------------------------------------ ports -------
# Random ports in [1024, 49151], each free by a bind check on 127.0.0.1 (python3 when present,
# else: no socket on it), none of the manifests' fixed 8132-8134, no two alike.
PORT_VARS=(AGENT_PORT HEALTH_PORT ADMIN_PORT A_HEALTH_PORT A_ADMIN_PORT TEST_SERVER_PORT
  DEV_AGENT_PORT DEV_HEALTH_PORT DEV_ADMIN_PORT CM_AGENT_PORT CM_HEALTH_PORT CM_ADMIN_PORT)
if command -v python3 >/dev/null 2>&1; then
  PORTS="$(python3 - "${#PORT_VARS[@]}" <<'PY'
import random, socket, sys
got = []
while len(got) < int(sys.argv[1]):
    p = random.randint(1024, 49151)
    if p in got or p in (8132, 8133, 8134):
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    got.append(p)
print(" ".join(map(str, got)))
PY
)"
else
  PORTS=""; n=0
  while [[ $n -lt ${#PORT_VARS[@]} ]]; do
    p=$(( 1024 + (RANDOM * 32768 + RANDOM) % (49151 - 1024 + 1) ))
    case " $PORTS 8132 8133 8134 " in *" $p "*) continue ;; esac
    ss -Htan "( sport = :$p )" 2>/dev/null | grep -q . && continue
    PORTS="$PORTS $p"; n=$((n + 1))
  done
fi
read -r -a PORT_LIST <<<"$PORTS"
[[ ${#PORT_LIST[@]} -eq ${#PORT_VARS[@]} ]] || { fail "no free ports"; exit 1; }
for i in "${!PORT_VARS[@]}"; do printf -v "${PORT_VARS[$i]}" '%s' "${PORT_LIST[$i]}"; done
log "ports: server agent=$AGENT_PORT health=$HEALTH_PORT admin=$ADMIN_PORT; agent health=$A_HEALTH_PORT admin=$A_ADMIN_PORT; test server=$TEST_SERVER_PORT"

# ------------------------------------------------------------------------------ build -------
VERSION="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
SERVER_BINARY="${SERVER_BINARY:-$TARGET_DIR/release/konnectivity-server}"
AGENT_BINARY="${AGENT_BINARY:-$TARGET_DIR/release/konnectivity-agent}"
SERVER_IMAGE="localhost/konnectivity-server:$VERSION"
AGENT_IMAGE="localhost/konnectivity-agent:$VERSION"

step_begin "build images (packaging/oci/build.sh)"
PROGRAMS=(server) HAVE_AGENT=0
if [[ -x "$AGENT_BINARY" ]]; then
  PROGRAMS+=(agent); HAVE_AGENT=1
elif [[ "$CI" == true ]]; then
  fail "no agent binary at $AGENT_BINARY (CI=true: the agent image must be built and tested)"
else
  skip "agent image: no agent binary at $AGENT_BINARY (built and tested once it exists; CI requires it)"
fi
T=$(now)
if "$HERE/build.sh" --server-binary "$SERVER_BINARY" --agent-binary "$AGENT_BINARY" "${PROGRAMS[@]}"; then
  pass "build.sh ${PROGRAMS[*]} ($(secs "$T") s)"
else
  fail "build.sh ${PROGRAMS[*]}"; exit 1
fi
step_end

# ------------------------------------------------------------------------------ images ------
declare -A SIZES=()
image_checks() { # <program> <image> <entry> <binary>
  local p="$1" img="$2" entry="$3" bin="$4" size user labels ctr
  size="$(podman image inspect --format '{{.Size}}' "$img")"
  SIZES[$p]="$size"
  log "      image $img: $size bytes ($(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1e6 }') MB)"
  check "$p image under 25 MB ($size bytes)" test "$size" -lt 25000000
  user="$(podman image inspect --format '{{.User}}' "$img")"
  check "$p image user is 65532:65532 (got '$user')" test "$user" = 65532:65532
  check "$p image entrypoint is [/$entry]" test "$(podman image inspect --format '{{.Config.Entrypoint}}' "$img")" = "[/$entry]"
  labels="$(podman image inspect --format '{{json .Labels}}' "$img")"
  label() { jq -r --arg k "org.opencontainers.image.$1" '.[$k] // ""' <<<"$labels"; }
  check "$p label version = $VERSION" test "$(label version)" = "$VERSION"
  check "$p label revision = git HEAD" test "$(label revision)" = "$(git -C "$ROOT" rev-parse HEAD)"
  check "$p label licenses = Apache-2.0" test "$(label licenses)" = Apache-2.0
  check "$p label source set ($(label source))" test -n "$(label source)"
  # The file list: exactly the binary, its /usr/bin link, the libraries ldd names, the user
  # database, nsswitch.conf, /tmp and the home directory (plus the directories above them).
  ctr="$(podman create "$img")"
  podman export "$ctr" | tar -t | sed 's#/$##' | sort >"$SCRATCH/$p.files"
  podman rm "$ctr" >/dev/null
  {
    printf '%s\n' etc etc/group etc/nsswitch.conf etc/passwd home home/nonroot tmp usr usr/bin \
      "$entry" "usr/bin/$entry"
    ldd "$bin" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
      while read -r lib; do
        lib="${lib#/}"; while [[ "$lib" == */* ]]; do echo "$lib"; lib="${lib%/*}"; done; echo "$lib"
      done
  } | sort -u >"$SCRATCH/$p.expected"
  # podman export adds the runtime's mount points (dev, proc, sys, etc/hosts, ...) when present.
  grep -vxE 'dev|proc|sys|run|etc/hosts|etc/hostname|etc/resolv.conf|\.' "$SCRATCH/$p.files" >"$SCRATCH/$p.files.clean"
  if diff "$SCRATCH/$p.expected" "$SCRATCH/$p.files.clean" >"$SCRATCH/$p.diff"; then
    pass "$p image holds exactly: $(grep -c . "$SCRATCH/$p.expected") paths (binary, /usr/bin/$entry, $(ldd "$bin" | grep -c '/') ldd libraries, passwd/group/nsswitch, /tmp, /home/nonroot)"
  else
    fail "$p image file list differs from the expected one:"; sed 's/^/      | /' "$SCRATCH/$p.diff"
  fi
  log "      files: $(grep -v '/$' "$SCRATCH/$p.files.clean" | tr '\n' ' ')"
  check "$p image has no shell (no bin/sh, sh, bash, busybox)" eval "! grep -qE '(^|/)(sh|bash|dash|ash|busybox)\$' '$SCRATCH/$p.files'"
  local out
  if out="$(podman run --rm --network none --entrypoint /bin/sh "$img" -c true 2>&1)"; then
    fail "$p: podman run --entrypoint /bin/sh succeeded"
  else
    check "$p: podman run --entrypoint /bin/sh fails (no such file)" grep -q 'no such file' <<<"$out"
  fi
  out="$(podman run --rm --network none --entrypoint "/usr/bin/$entry" "$img" --help 2>&1 | head -n 3)"
  check "$p: /usr/bin/$entry runs (--help)" test -n "$out"
}
step_begin "image checks"
image_checks server "$SERVER_IMAGE" proxy-server "$SERVER_BINARY"
if [[ $HAVE_AGENT -eq 1 ]]; then image_checks agent "$AGENT_IMAGE" proxy-agent "$AGENT_BINARY"; fi
podman images --filter reference='localhost/konnectivity-*' | sed 's/^/      | /'
step_end

# ------------------------------------------------------------------------------ certificates
step_begin "test CA and certificates (openssl)"
PKI="$SCRATCH/pki"; mkdir -p "$PKI"
gen_certs() {
  local d="$PKI"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -days 2 -subj "/CN=oci-test-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null || return 1
  # The agent port's certificate: kube-apiserver's serving certificate in kubeadm's layout.
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$d/apiserver.key" -out "$d/apiserver.csr" 2>/dev/null || return 1
  printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "extendedKeyUsage=serverAuth" \
    "keyUsage=critical,digitalSignature" >"$d/server.ext"
  openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -set_serial 0x1001 \
    -days 2 -sha256 -extfile "$d/server.ext" -out "$d/apiserver.crt" 2>/dev/null || return 1
  # Client certificates: the agent (mTLS on the agent port) and the server's kubeconfig user.
  local cn name
  for name in agent konnectivity-server-client; do
    case $name in agent) cn=system:konnectivity-agent ;; *) cn=system:konnectivity-server ;; esac
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$cn" -keyout "$d/$name.key" -out "$d/$name.csr" 2>/dev/null || return 1
    printf '%s\n' "extendedKeyUsage=clientAuth" "keyUsage=critical,digitalSignature" >"$d/client.ext"
    openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -set_serial "0x$RANDOM" \
      -days 2 -sha256 -extfile "$d/client.ext" -out "$d/$name.crt" 2>/dev/null || return 1
  done
  rm -f "$d"/*.csr "$d"/*.ext
}
check "CA, kube-apiserver serving certificate (SAN 127.0.0.1, localhost), agent and kubeconfig client certificates" gen_certs
# The server's kubeconfig, as the kubeadm setup generates it (client certificate, cluster CA).
kubeconfig() { # <file>
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: kubernetes
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: system:konnectivity-server
  user:
    client-certificate-data: $(base64 -w0 "$PKI/konnectivity-server-client.crt")
    client-key-data: $(base64 -w0 "$PKI/konnectivity-server-client.key")
contexts:
- name: system:konnectivity-server@kubernetes
  context: {cluster: kubernetes, user: system:konnectivity-server}
current-context: system:konnectivity-server@kubernetes
KC
}
step_end

# ------------------------------------------------------------------------------ podman run --
cname() { echo "konn-$TAG-$1"; }
run_ctr() { # <name> <podman run args...>: detached, tracked for cleanup
  local n; n="$(cname "$1")"; shift
  CONTAINERS+=("$n")
  podman run -d --name "$n" "$@" >/dev/null
}
ctr_logs() { podman logs "$(cname "$1")" 2>&1 | tail -n "${2:-20}" | sed 's/^/      | /'; }
ctr_pid() { podman inspect --format '{{.State.Pid}}' "$(cname "$1")" 2>/dev/null; }
ctr_uid() { awk '/^Uid:/ { print $2 }' "/proc/$(ctr_pid "$1")/status" 2>/dev/null; }

step_begin "server container as in the kubeadm static pod (podman run, host network)"
# The kubeadm layout in host directories; uid 65532 (the image's user) is given read access
# to the key and owns the socket directory (kubeadm's own files are root's: see the manifests).
K="$SCRATCH/run"; mkdir -p "$K/pki" "$K/konnectivity-server"
cp "$PKI/ca.crt" "$PKI/apiserver.crt" "$PKI/apiserver.key" "$K/pki/"
chown root:65532 "$K/pki/apiserver.key"; chmod 0640 "$K/pki/apiserver.key"
chown 65532:65532 "$K/konnectivity-server"; chmod 0750 "$K/konnectivity-server"
UDS="$K/konnectivity-server/konnectivity-server.socket"
# The static pod's arguments, with random loopback ports, and client certificates for the
# agent in place of token authentication (which needs a kube-apiserver; step 5 has one).
run_ctr server --network host \
  -v "$K/pki:/etc/kubernetes/pki:ro" -v "$K/konnectivity-server:/etc/kubernetes/konnectivity-server" \
  "$SERVER_IMAGE" \
  --logtostderr=true \
  --uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket --delete-existing-uds-file \
  --cluster-cert=/etc/kubernetes/pki/apiserver.crt --cluster-key=/etc/kubernetes/pki/apiserver.key \
  --cluster-ca-cert=/etc/kubernetes/pki/ca.crt \
  --mode=grpc --server-port=0 \
  --agent-port="$AGENT_PORT" --agent-bind-address=127.0.0.1 \
  --health-port="$HEALTH_PORT" --health-bind-address=127.0.0.1 \
  --admin-port="$ADMIN_PORT" --admin-bind-address=127.0.0.1 \
  --graceful-shutdown-timeout=5s --server-id=oci-test \
  || fail "podman run server"
check "server /healthz 200" wait_for 15 code_is 200 "http://127.0.0.1:$HEALTH_PORT/healthz"
check "server runs as uid 65532 (/proc/<pid>/status)" test "$(ctr_uid server)" = 65532
check "frontend socket in the host directory ($UDS)" test -S "$UDS"
check "server /readyz 500 before any agent" code_is 500 "http://127.0.0.1:$HEALTH_PORT/readyz"
step_end

step_begin "agent, then a tunnel: proxy-test-client -> UDS -> server -> agent -> http-test-server"
B="${INTEROP_BIN_DIR:-}"
HAVE_INTEROP=1
for b in proxy-agent proxy-test-client http-test-server; do
  [[ -n "$B" && -x "$B/$b" ]] || HAVE_INTEROP=0
done
if [[ $HAVE_INTEROP -eq 0 ]]; then
  if [[ "$CI" == true ]]; then fail "upstream binaries missing (INTEROP_BIN_DIR='$B'): tunnel checks cannot run"
  else skip "tunnel: upstream binaries missing (INTEROP_BIN_DIR='$B'; tests/interop/build.sh builds them)"; fi
fi
AGENT_PKI="$SCRATCH/agent-pki"; mkdir -p "$AGENT_PKI"
cp "$PKI/ca.crt" "$PKI/agent.crt" "$PKI/agent.key" "$AGENT_PKI/"
chown root:65532 "$AGENT_PKI/agent.key"; chmod 0640 "$AGENT_PKI/agent.key"
AGENT_ARGS=(--proxy-server-host=127.0.0.1 --proxy-server-port="$AGENT_PORT"
  --agent-id=oci-agent "--agent-identifiers=host=localhost&ipv4=127.0.0.1"
  --health-server-host=127.0.0.1 --health-server-port="$A_HEALTH_PORT"
  --admin-bind-address=127.0.0.1 --admin-server-port="$A_ADMIN_PORT")
AGENT_KIND=""
if [[ $HAVE_AGENT -eq 1 ]]; then
  AGENT_KIND="our agent image"
  run_ctr agent --network host -v "$AGENT_PKI:/pki:ro" "$AGENT_IMAGE" \
    --ca-cert=/pki/ca.crt --agent-cert=/pki/agent.crt --agent-key=/pki/agent.key "${AGENT_ARGS[@]}" \
    || fail "podman run agent"
elif [[ $HAVE_INTEROP -eq 1 ]]; then
  # Only while our agent binary does not exist (never under CI): upstream's agent on the host.
  AGENT_KIND="upstream proxy-agent on the host (no agent binary yet)"
  "$B/proxy-agent" --ca-cert="$AGENT_PKI/ca.crt" --agent-cert="$AGENT_PKI/agent.crt" --agent-key="$AGENT_PKI/agent.key" \
    "${AGENT_ARGS[@]}" >"$SCRATCH/proxy-agent.log" 2>&1 &
  HOST_PIDS+=($!)
fi
if [[ -n "$AGENT_KIND" ]]; then
  log "      agent: $AGENT_KIND"
  check "agent /readyz 200 ($AGENT_KIND)" wait_for 20 code_is 200 "http://127.0.0.1:$A_HEALTH_PORT/readyz"
  check "server /readyz 200 (agent connected)" wait_for 20 code_is 200 "http://127.0.0.1:$HEALTH_PORT/readyz"
fi
if [[ -n "$AGENT_KIND" && $HAVE_INTEROP -eq 1 ]]; then
  "$B/http-test-server" --server-port="$TEST_SERVER_PORT" >"$SCRATCH/http-test-server.log" 2>&1 &
  HOST_PIDS+=($!)
  wait_for 10 code_is 200 "http://127.0.0.1:$TEST_SERVER_PORT/success" || fail "http-test-server did not start"
  tunnel_get() {
    "$B/proxy-test-client" --mode=grpc --proxy-host= --proxy-port=0 --proxy-uds="$UDS" \
      --request-host=127.0.0.1 --request-port="$TEST_SERVER_PORT" --request-path=success \
      >"$SCRATCH/proxy-test-client.log" 2>&1 && grep -q 'The success test page' "$SCRATCH/proxy-test-client.log"
  }
  check "proxy-test-client GET /success through the socket, the server container and the agent" tunnel_get
  dials() { curl -s --max-time 3 "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '$1 == "konnectivity_network_proxy_server_dial_duration_seconds_count" { print $2 }'; }
  check "the server counted the tunnel (dial_duration_seconds_count 1, got '$(wait_for 5 eval '[[ "$(dials)" == 1 ]]'; dials)')" \
    test "$(dials)" = 1
fi
[[ $FAILS -eq 0 ]] || { ctr_logs server 30; [[ $HAVE_AGENT -eq 1 ]] && ctr_logs agent 30; }
if [[ $HAVE_AGENT -eq 1 ]]; then
  check "agent runs as uid 65532" test "$(ctr_uid agent)" = 65532
  # What an agent does on SIGTERM is the agent's own contract (upstream's drains and waits for
  # a second signal); it is reported, not checked.
  T=$(now); podman stop -t 2 "$(cname agent)" >/dev/null 2>&1
  log "      agent container after SIGTERM (2 s grace): exit code $(podman inspect --format '{{.State.ExitCode}}' "$(cname agent)") after $(secs "$T") s"
fi
T=$(now); podman stop -t 20 "$(cname server)" >/dev/null 2>&1
code="$(podman inspect --format '{{.State.ExitCode}}' "$(cname server)")"
check "server container: SIGTERM -> exit code 0 (got $code, after $(secs "$T") s)" test "$code" = 0
step_end

step_begin "--dev inside the image (uid 65532, HOME=/home/nonroot)"
run_ctr dev --network host "$SERVER_IMAGE" --dev \
  --agent-port="$DEV_AGENT_PORT" --agent-bind-address=127.0.0.1 \
  --health-port="$DEV_HEALTH_PORT" --health-bind-address=127.0.0.1 \
  --admin-port="$DEV_ADMIN_PORT" || fail "podman run --dev"
check "--dev: /healthz 200" wait_for 15 code_is 200 "http://127.0.0.1:$DEV_HEALTH_PORT/healthz"
DEV_LOG="$(podman logs "$(cname dev)" 2>&1)"
check "--dev: CA generated under /home/nonroot/.local/state/konnectivity-server" grep -q '/home/nonroot/.local/state/konnectivity-server' <<<"$DEV_LOG"
check "--dev: socket under /tmp/konnectivity-server-65532" grep -q '/tmp/konnectivity-server-65532/konnectivity-server.socket' <<<"$DEV_LOG"
[[ $FAILS -eq 0 ]] || ctr_logs dev 30
podman rm -f -t 5 "$(cname dev)" >/dev/null 2>&1
step_end

# ------------------------------------------------------------------------------ ConfigMap ---
# The kubelet's atomic writer: files in a hidden timestamped directory, ..data -> it, and each
# key a symlink through ..data. An update writes a new directory, points ..data_tmp at it and
# renames ..data_tmp over ..data (one atomic swap), then removes the old directory.
cm_write() { # <dir> <server.toml content>
  local d="$1" ts; ts="..$(date -u +%Y_%m_%d_%H_%M_%S.%N)"
  mkdir "$d/$ts"; printf '%s\n' "$2" >"$d/$ts/server.toml"; chmod 0644 "$d/$ts/server.toml"
  ln -s "$ts" "$d/..data_tmp"; mv -T "$d/..data_tmp" "$d/..data"
  [[ -L "$d/server.toml" ]] || ln -s ..data/server.toml "$d/server.toml"
  local old; for old in "$d"/..[0-9]*; do [[ "$(basename "$old")" == "$ts" ]] || rm -rf "$old"; done
}
# The ConfigMap's server.toml from the manifest (the block under `server.toml: |`).
cm_toml() {
  awk '/^  server.toml: \|$/ { on = 1; next } on && /^    / { sub(/^    /, ""); print; next } on && !/^\s*$/ { exit }' \
    "$KUBE_DIR/konnectivity-server-configmap.yaml"
}
reloads() { # <admin port> <result>: konnectivity_network_proxy_server_reloads_total{result=...}
  curl -s --max-time 3 "http://127.0.0.1:$1/metrics" |
    awk -v r="result=\"$2\"" 'index($0, "reloads_total{") && index($0, r) { print $2 }' | head -n1
}
step_begin "ConfigMap variant: a ..data symlink swap reloads without a restart"
CM="$SCRATCH/configmap"; mkdir -p "$CM/pki" "$CM/uds"
cp "$PKI/apiserver.crt" "$PKI/apiserver.key" "$CM/pki/"; chmod 0600 "$CM/pki/apiserver.key"
# The manifest's settings, with this run's ports (the manifest's 8132-8134 are for kube play).
CM_TOML="$(cm_toml | sed -E "s/^agent_port = .*/agent_port = $CM_AGENT_PORT/; s/^admin_port = .*/admin_port = $CM_ADMIN_PORT/; s/^health_port = .*/health_port = $CM_HEALTH_PORT/")"
check "ConfigMap server.toml read from konnectivity-server-configmap.yaml" grep -q '^uds_name = ' <<<"$CM_TOML"
mkdir -p "$CM/config"; cm_write "$CM/config" "$CM_TOML"
# The DaemonSet's container: uid 0 with no capabilities, read-only root, the ConfigMap at /etc/konnectivity.
run_ctr configmap --network host --user 0:0 --cap-drop ALL --read-only --security-opt no-new-privileges \
  -v "$CM/config:/etc/konnectivity:ro" -v "$CM/pki:/etc/kubernetes/pki:ro" \
  -v "$CM/uds:/etc/kubernetes/konnectivity-server" \
  "$SERVER_IMAGE" --config=/etc/konnectivity/server.toml || fail "podman run (ConfigMap variant)"
check "ConfigMap variant: /healthz 200" wait_for 15 code_is 200 "http://127.0.0.1:$CM_HEALTH_PORT/healthz"
PID0="$(ctr_pid configmap)"
check "ConfigMap variant: uid 0 with no effective capabilities" eval \
  "[[ \"\$(awk '/^CapEff:/ { print \$2 }' /proc/$PID0/status)\" == 0000000000000000 ]]"
R0="$(reloads "$CM_ADMIN_PORT" success)"; R0="${R0:-0}"
cm_write "$CM/config" "$CM_TOML
proxy_strategies = \"destHost,default\""
check "ConfigMap variant: reloads_total{result=\"success\"} $R0 -> $((R0 + 1)) after the swap" \
  wait_for 10 eval "[[ \"\$(reloads $CM_ADMIN_PORT success)\" == $((R0 + 1)) ]]"
check "ConfigMap variant: same process (pid $PID0), no restart" test "$(ctr_pid configmap)" = "$PID0"
[[ $FAILS -eq 0 ]] || ctr_logs configmap 30
podman rm -f -t 5 "$(cname configmap)" >/dev/null 2>&1
step_end

# ------------------------------------------------------------------------------ kube play ---
# The host side as kubeadm leaves it, in the overlaid /etc: pki/ (keys root 0600), the
# server's kubeconfig; the socket directory is left to the kubelet (DirectoryOrCreate).
kubeadm_host() {
  rm -rf /etc/kubernetes /etc/konnectivity; mkdir -p /etc/kubernetes/pki /etc/konnectivity
  cp "$PKI/ca.crt" "$PKI/apiserver.crt" "$PKI/apiserver.key" /etc/kubernetes/pki/
  chmod 0644 /etc/kubernetes/pki/*.crt; chmod 0600 /etc/kubernetes/pki/apiserver.key
  kubeconfig /etc/kubernetes/konnectivity-server.conf; chmod 0600 /etc/kubernetes/konnectivity-server.conf
}
with_image() { # <manifest> <image> <out>: the manifest with its image line replaced, nothing else
  sed -E "s#^(\s*image:\s*).*#\1$2#" "$1" >"$3"
  if [[ "$(grep -cE '^\s*image:' "$1")" != 1 ]] || ! diff <(grep -vE '^\s*image:' "$1") <(grep -vE '^\s*image:' "$3") >/dev/null; then
    fail "$(basename "$1"): expected exactly one image line, and nothing else changed"; return 1
  fi
}
without_ports() { # <manifest> <out>: the containers' ports lists removed
  awk '
    skip && (match($0, /^ */) && RLENGTH > ind || (RLENGTH == ind && $0 ~ /^ *- /)) { next }
    { skip = 0 }
    /^ *ports:[[:space:]]*$/ { match($0, /^ */); ind = RLENGTH; skip = 1; next }
    { print }' "$1" >"$2"
}
play() { # <manifest>
  if podman pod exists konnectivity-server 2>/dev/null; then
    fail "a pod named konnectivity-server already exists in podman's storage (not ours: left alone)"; return 1
  fi
  PODS+=("$1")
  podman kube play "$1" >"$SCRATCH/play.log" 2>&1 && return 0
  # podman 4.3 refuses hostPort/containerPort with hostNetwork, which Kubernetes accepts (and
  # where they are informational: the process binds the node's ports itself). Only then are
  # the ports lists taken out, and the log says so.
  if grep -q 'PortMappings can only be used with' "$SCRATCH/play.log"; then
    log "      podman $(podman --version | cut -d' ' -f3) refuses ports with hostNetwork ($(tail -n1 "$SCRATCH/play.log")): playing it without the ports lists"
    without_ports "$1" "$1.noports"
    podman kube play --down "$1" >/dev/null 2>&1
    PODS+=("$1.noports")
    podman kube play "$1.noports" >"$SCRATCH/play.log" 2>&1 && return 0
  fi
  sed 's/^/      | /' "$SCRATCH/play.log"; return 1
}
pod_ctr() { echo konnectivity-server-konnectivity-server-container; }
pod_logs() { podman logs "$(pod_ctr)" 2>&1 | tail -n "${1:-20}" | sed 's/^/      | /'; }
down() { # <manifest>: stop (SIGTERM, within the pod's grace), report the exit code, remove
  local code m
  podman pod stop -t 50 konnectivity-server >/dev/null 2>&1
  code="$(podman inspect --format '{{.State.ExitCode}}' "$(pod_ctr)" 2>/dev/null)"
  for m in "$1" "$1.noports"; do
    [[ -f "$m" ]] && podman kube play --down "$m" >/dev/null 2>&1
    PODS=("${PODS[@]/$m}")
  done
  echo "$code"
}
pid_of_pod() { podman inspect --format '{{.State.Pid}}' "$(pod_ctr)" 2>/dev/null; }
pod_uid() { awk '/^Uid:/ { print $2 }' "/proc/$(pid_of_pod)/status" 2>/dev/null; }
pod_capeff() { awk '/^CapEff:/ { print $2 }' "/proc/$(pid_of_pod)/status" 2>/dev/null; }
KUDS=/etc/kubernetes/konnectivity-server/konnectivity-server.socket

step_begin "podman kube play packaging/kubernetes/konnectivity-server.yaml (image replaced)"
kubeadm_host
M="$SCRATCH/konnectivity-server.yaml"
if with_image "$KUBE_DIR/konnectivity-server.yaml" "$SERVER_IMAGE" "$M" && play "$M"; then
  check "static pod: /healthz 200 on 127.0.0.1:8134" wait_for 20 code_is 200 http://127.0.0.1:8134/healthz
  check "static pod: socket $KUDS created" test -S "$KUDS"
  check "static pod: uid 0 (securityContext) with no effective capabilities" \
    eval '[[ "$(pod_uid)" == 0 && "$(pod_capeff)" == 0000000000000000 ]]'
  check "static pod: /readyz 500 (no agent)" code_is 500 http://127.0.0.1:8134/readyz
  check "static pod: admin /metrics on 127.0.0.1:8133" code_is 200 http://127.0.0.1:8133/metrics
  [[ $FAILS -eq 0 ]] || pod_logs 30
  code="$(down "$M")"
  check "static pod: SIGTERM -> exit code 0 (got '$code')" test "$code" = 0
else
  fail "podman kube play konnectivity-server.yaml"
fi
step_end

step_begin "podman kube play packaging/kubernetes/konnectivity-server-ha.yaml (image replaced; no kube-apiserver behind its kubeconfig)"
kubeadm_host
M="$SCRATCH/konnectivity-server-ha.yaml"
if with_image "$KUBE_DIR/konnectivity-server-ha.yaml" "$SERVER_IMAGE" "$M" && play "$M"; then
  check "HA static pod (--enable-lease-controller): /healthz 200 on 127.0.0.1:8134" wait_for 20 code_is 200 http://127.0.0.1:8134/healthz
  [[ $FAILS -eq 0 ]] || pod_logs 30
  code="$(down "$M")"
  check "HA static pod: SIGTERM -> exit code 0 (got '$code')" test "$code" = 0
else
  fail "podman kube play konnectivity-server-ha.yaml"
fi
step_end

step_begin "podman kube play packaging/kubernetes/konnectivity-server-config-file.yaml: a host edit of server.toml reloads"
kubeadm_host
cp "$KUBE_DIR/server.toml" /etc/konnectivity/server.toml
M="$SCRATCH/konnectivity-server-config-file.yaml"
if with_image "$KUBE_DIR/konnectivity-server-config-file.yaml" "$SERVER_IMAGE" "$M" && play "$M"; then
  check "config-file variant: /healthz 200 on 127.0.0.1:8134" wait_for 20 code_is 200 http://127.0.0.1:8134/healthz
  check "config-file variant: socket $KUDS created (uds_name from server.toml)" test -S "$KUDS"
  PID0="$(pid_of_pod)"; R0="$(reloads 8133 success)"; R0="${R0:-0}"
  # An editor's save: write a new file and rename it over the old one.
  { cat "$KUBE_DIR/server.toml"; echo 'proxy_strategies = "destHost,default"'; } >/etc/konnectivity/.server.toml.new
  mv /etc/konnectivity/.server.toml.new /etc/konnectivity/server.toml
  check "config-file variant: reloads_total{result=\"success\"} $R0 -> $((R0 + 1)) after the rename" \
    wait_for 10 eval "[[ \"\$(reloads 8133 success)\" == $((R0 + 1)) ]]"
  check "config-file variant: same process, no restart" test "$(pid_of_pod)" = "$PID0"
  [[ $FAILS -eq 0 ]] || pod_logs 30
  code="$(down "$M")"
  check "config-file variant: SIGTERM -> exit code 0 (got '$code')" test "$code" = 0
else
  fail "podman kube play konnectivity-server-config-file.yaml"
fi
step_end

step_begin "podman kube play of the upstream-documented kubeadm manifest (only the image replaced)"
M="$SCRATCH/kubeadm-upstream.yaml"
if with_image "$HERE/fixtures/kubeadm-konnectivity-server.yaml" "$SERVER_IMAGE" "$M"; then
  # On kubeadm's own files (the kubelet's root 0755 socket directory, the root 0600 key) the
  # image's nonroot user can do neither, as with upstream's nonroot images: the server exits
  # at once, naming what it could not do. (Our manifests run it as uid 0 without capabilities.)
  has_error() { podman logs "$(pod_ctr)" 2>&1 | grep -q '^Error: '; }
  error_says() { podman logs "$(pod_ctr)" 2>&1 | grep '^Error: ' | head -n1 | grep -qF "$1"; }
  kubeadm_host
  if play "$M"; then
    wait_for 10 has_error
    check "documented manifest, kubeadm's files, uid 65532: exits naming the socket (failed to listen on ...$KUDS: Permission denied)" \
      error_says "failed to listen on the frontend socket $KUDS: Permission denied"
    down "$M" >/dev/null
  else
    fail "podman kube play (documented manifest)"
  fi
  kubeadm_host
  install -d -o 65532 -g 65532 -m 0750 /etc/kubernetes/konnectivity-server
  if play "$M"; then
    wait_for 10 has_error
    check "documented manifest, socket directory fixed, key root 0600: exits naming the key (failed to read private key /etc/kubernetes/pki/apiserver.key: ... Permission denied)" \
      eval 'error_says "failed to read private key /etc/kubernetes/pki/apiserver.key" && error_says "Permission denied"'
    down "$M" >/dev/null
  else
    fail "podman kube play (documented manifest)"
  fi
  # Readable by the image's user (group 65532) and a socket directory it owns: it serves.
  kubeadm_host
  chgrp 65532 /etc/kubernetes/pki/apiserver.key /etc/kubernetes/konnectivity-server.conf
  chmod 0640 /etc/kubernetes/pki/apiserver.key /etc/kubernetes/konnectivity-server.conf
  install -d -o 65532 -g 65532 -m 0750 /etc/kubernetes/konnectivity-server
  if play "$M"; then
    check "documented manifest: /healthz 200 on 127.0.0.1:8134" wait_for 20 code_is 200 http://127.0.0.1:8134/healthz
    check "documented manifest: socket $KUDS created" test -S "$KUDS"
    check "documented manifest: runs as uid 65532" test "$(pod_uid)" = 65532
    [[ $FAILS -eq 0 ]] || pod_logs 30
    code="$(down "$M")"
    check "documented manifest: SIGTERM -> exit code 0 (got '$code')" test "$code" = 0
  else
    fail "podman kube play (documented manifest)"
  fi
fi
step_end

step_begin "manifest image tags follow Cargo.toml ($VERSION)"
tags_ok() {
  local bad
  bad="$(grep -hE '^\s*image:' "$KUBE_DIR"/*.yaml | grep -vE "image: localhost/konnectivity-(server|agent):$VERSION\$")"
  [[ -z "$bad" ]] || { log "      $bad"; return 1; }
}
check "every image in packaging/kubernetes/*.yaml is localhost/konnectivity-{server,agent}:$VERSION" tags_ok
step_end

# ------------------------------------------------------------------------------ apiserver ---
step_begin "manifests against a real kube-apiserver (packaging/kubernetes/check.sh)"
if [[ -n "${KUBE_BIN_DIR:-}" && -x "$KUBE_BIN_DIR/kube-apiserver" ]]; then
  KUBE_RUN_DIR="$SCRATCH/kube"
  if KUBE_BIN_DIR="$KUBE_BIN_DIR" "$KUBE_DIR/check.sh" "$KUBE_RUN_DIR" | sed 's/^/      | /'; then
    pass "check.sh: every object accepted by a server-side dry run (strict field validation), both egress selector files loaded"
  else
    fail "check.sh: see above"
  fi
  KUBE_RUN_DIR=""
elif [[ "$CI" == true ]]; then
  fail "no kube-apiserver (KUBE_BIN_DIR='${KUBE_BIN_DIR:-}'): the manifests cannot be checked"
else
  skip "manifest dry run: no cached kube-apiserver (tests/kube/build.sh builds one, ~10 min cold; or set KUBE_BIN_DIR)"
fi
step_end

# ------------------------------------------------------------------------------ summary -----
echo
echo "=== image sizes"
for p in server agent; do
  [[ -n "${SIZES[$p]:-}" ]] && printf '  konnectivity-%-7s %10s bytes  %5.1f MB  (limit 25 MB)\n' "$p" "${SIZES[$p]}" "$(awk -v s="${SIZES[$p]}" 'BEGIN { print s / 1e6 }')"
done
echo "=== step timings"
printf '%s\n' "${TIMINGS[@]}"
echo "=== results"
printf '%s\n' "${RESULTS[@]}"
echo "=== $(grep -c '^PASS' <<<"$(printf '%s\n' "${RESULTS[@]}")") passed, $FAILS failed, $SKIPS skipped; total $(secs "$T_START") s"
[[ $FAILS -eq 0 ]]
