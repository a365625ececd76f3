# shellcheck shell=bash
# packaging/oci/test.sh --inside, sourced: the private namespaces, the ports, and the image builds.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

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
KUBE_PROXY_BINARY="${KUBE_PROXY_BINARY:-$TARGET_DIR/release/kube-proxy}"
SERVER_IMAGE="localhost/konnectivity-server:$VERSION"
AGENT_IMAGE="localhost/konnectivity-agent:$VERSION"
KUBE_PROXY_IMAGE="localhost/kube-proxy:$VERSION"

step_begin "build images (packaging/oci/build.sh)"
PROGRAMS=(server) HAVE_AGENT=0
if [[ -x "$AGENT_BINARY" ]]; then
  PROGRAMS+=(agent); HAVE_AGENT=1
elif [[ "$CI" == true ]]; then
  fail "no agent binary at $AGENT_BINARY (CI=true: the agent image must be built and tested)"
else
  skip "agent image: no agent binary at $AGENT_BINARY (built and tested once it exists; CI requires it)"
fi
HAVE_KUBE_PROXY=0
if [[ -x "$KUBE_PROXY_BINARY" ]]; then
  PROGRAMS+=(kube-proxy); HAVE_KUBE_PROXY=1
elif [[ "$CI" == true ]]; then
  fail "no kube-proxy binary at $KUBE_PROXY_BINARY (CI=true: the kube-proxy image must be built and tested)"
else
  skip "kube-proxy image: no kube-proxy binary at $KUBE_PROXY_BINARY"
fi
T=$(now)
if "$HERE/build.sh" --server-binary "$SERVER_BINARY" --agent-binary "$AGENT_BINARY" \
    --kube-proxy-binary "$KUBE_PROXY_BINARY" "${PROGRAMS[@]}"; then
  pass "build.sh ${PROGRAMS[*]} ($(secs "$T") s)"
else
  fail "build.sh ${PROGRAMS[*]}"; exit 1
fi
step_end
