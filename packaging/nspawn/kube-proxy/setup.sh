# shellcheck shell=bash
# packaging/nspawn-kube-proxy-test.sh, sourced: the package, the API server, the container with a private network, the client and pod namespaces.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# shellcheck source=packaging/nspawn/container.sh
. "$ROOT/packaging/nspawn/container.sh"

for t in ip python3 socat nsenter nft conntrack; do
  command -v "$t" >/dev/null || die "missing $t (apt-get install iproute2 python3 socat util-linux nftables conntrack)"
done
TRAFFIC="$ROOT/packaging/kube-proxy-traffic.py"
# The reference install unit's command line. Its addresses are given to the container's
# interface, so not one flag changes.
NODE_IP=10.12.51.171
REFERENCE_ARGS="--bind-address=$NODE_IP --hostname-override=$NODE_IP --cluster-cidr=10.254.0.0/16 --kubeconfig=/etc/kubernetes/kube-proxy.kubeconfig --logtostderr=true --v=2 --ipvs-scheduler=wrr --ipvs-min-sync-period=5s --ipvs-sync-period=5s --proxy-mode=ipvs"
CLIENT_IP=10.12.51.2 POD_IP=10.254.1.2 POD_GW=10.254.1.1
SVC_IP=10.96.0.80 SVC_PORT=80 POD_PORT=8080
SVC="$SVC_IP:$SVC_PORT"

# ------------------------------------------------------------------------------ packages ----
VERSION="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)"
DEB_N="${1:-$ROOT/target/packages/kube-proxy_${VERSION}-1_${ARCH}.deb}"
NEXT_VERSION="${VERSION}+nspawn1"
DEB_N1="${2:-}"
if [[ ! -f "$DEB_N" ]]; then
  step_begin "build packages (packaging/build.sh)"
  "$ROOT/packaging/build.sh" >/dev/null || die "packaging/build.sh failed"
  step_end
fi
[[ "$(dpkg-deb -f "$DEB_N" Package)" == kube-proxy ]] || die "$DEB_N is not the kube-proxy package"
DEB_N_VER="$(dpkg-deb -f "$DEB_N" Version)"
log "package N: $DEB_N ($DEB_N_VER, $(stat -c %s "$DEB_N") bytes)"

# The host's own network namespace is never touched: no kube-proxy table in it before (else
# the check at the end would prove nothing), none after (lifecycle.sh).
# CAP_SYS_RESOURCE (bit 24) in the container's bounding set: systemd can apply OOMScoreAdjust=.
has_sys_resource() { (( 0x$(awk '/^CapBnd:/ { print $2 }' "/proc/$LEADER/status") >> 24 & 1 )); }
host_has_kube_proxy_table() { [[ "$(nft list tables 2>/dev/null | grep -cE '^table (ip|ip6|inet) kube-proxy$')" -gt 0 ]]; }
HOST_TABLE_BEFORE=0; host_has_kube_proxy_table && HOST_TABLE_BEFORE=1
HOST_RULESET_BEFORE="$(nft list ruleset 2>/dev/null | sha256sum)"

ensure_rootfs
make_scratch kube-proxy-nspawn
mkdir -p "$SCRATCH/api" "$SCRATCH/traffic"
chmod 0755 "$SCRATCH/api"

# ------------------------------------------------------------------------------ API server --
# Started in the background (a few seconds), while the container boots and the package goes in.
step_begin "API server (tests/kube/start.sh, host loopback), in the background"
if [[ -z "${KUBE_BIN_DIR:-}" ]]; then
  KUBE_BIN_DIR="$("$ROOT/tests/kube/build.sh" | tail -n 1)" || die "tests/kube/build.sh failed"
fi
export KUBE_BIN_DIR
CLEANUP_HOOKS+=('kp_api_stop')
KP_API_DIR="$SCRATCH/kube"
( kp_api_start "$SCRATCH/kube" ) >"$SCRATCH/host/api-start.log" 2>&1 &
API_START_PID=$!
step_end

# ------------------------------------------------------------------------------ boot --------
N1_PID=""
if [[ -z "$DEB_N1" ]]; then
  DEB_N1="$SCRATCH/kube-proxy_${NEXT_VERSION}-1_${ARCH}.deb"
  repack_n1 "$DEB_N" "$DEB_N1" & N1_PID=$!
fi
# /run/kube-api: where the host's half of the relay puts the API server's Unix socket.
# /sys/module/nf_conntrack/parameters, read-only: systemd-nspawn shows a container only part of
# /sys (no /sys/module), and kube-proxy, as upstream's, reads the conntrack hash size at start
# whenever --conntrack-max-per-core is above 0 (the reference flags leave it at 32768): a node
# has the file. Read-only, as the kernel refuses its write from any namespace but the host's.
HASHSIZE=/sys/module/nf_conntrack/parameters
[[ -r "$HASHSIZE/hashsize" ]] || die "$HASHSIZE/hashsize missing: the host has no nf_conntrack loaded (modprobe nf_conntrack)"
boot_container "kptest$$" --private-network --bind="$SCRATCH/api:/run/kube-api" --bind-ro="$HASHSIZE"
if [[ -n "$N1_PID" ]]; then wait "$N1_PID" || die "repacking the N+1 .deb failed"; fi
DEB_N1_VER="$(dpkg-deb -f "$DEB_N1" Version)" || die "not a .deb: $DEB_N1"
dpkg --compare-versions "$DEB_N1_VER" gt "$DEB_N_VER" || die "DEB_N1 ($DEB_N1_VER) is not newer than DEB_N ($DEB_N_VER)"

# A command in the container's network namespace, with the host's programs (ip, python3, curl).
cn() { nsenter -t "$LEADER" -n -- "$@"; }
netns_of() { readlink "/proc/$1/ns/net"; }

step_begin "namespaces: the container's own network (the node), a client and a pod on veths into it"
check "the container has a network namespace of its own (not the host's)" \
  test "$(netns_of "$LEADER")" != "$(netns_of $$)"
NS_CLIENT="kpn$$-client" NS_POD="kpn$$-pod"
CLEANUP_HOOKS+=('ip netns del "$NS_CLIENT" 2>/dev/null; ip netns del "$NS_POD" 2>/dev/null')
make_network() {
  ip netns add "$NS_CLIENT" && ip netns add "$NS_POD" || return 1
  # Created inside the container's namespace, the peer moved straight into the client's or the
  # pod's: the host's namespace never holds either end.
  cn ip link add eth0 type veth peer name eth0 netns "$NS_CLIENT" || return 1
  cn ip link add vp1 type veth peer name eth0 netns "$NS_POD" || return 1
  cn ip addr add "$NODE_IP/24" dev eth0 && cn ip link set eth0 up || return 1
  cn ip addr add "$POD_GW/32" dev vp1 && cn ip link set vp1 up || return 1
  cn ip route add "$POD_IP/32" dev vp1 || return 1
  cn sysctl -qw net.ipv4.ip_forward=1 || return 1
  ip -n "$NS_CLIENT" link set lo up && ip -n "$NS_CLIENT" addr add "$CLIENT_IP/24" dev eth0 \
    && ip -n "$NS_CLIENT" link set eth0 up && ip -n "$NS_CLIENT" route add default via "$NODE_IP" || return 1
  ip -n "$NS_POD" link set lo up && ip -n "$NS_POD" addr add "$POD_IP/32" dev eth0 \
    && ip -n "$NS_POD" link set eth0 up && ip -n "$NS_POD" route add default via "$POD_GW" dev eth0 onlink
}
check "client $CLIENT_IP and pod $POD_IP namespaces on veths into the container (node $NODE_IP)" make_network
ip netns exec "$NS_POD" python3 "$TRAFFIC" serve pod1 "$POD_PORT" >"$SCRATCH/host/pod1.log" 2>&1 &
HOST_PIDS+=($!)
check "the pod's server listens on $POD_IP:$POD_PORT" wait_for 10 grep -q ready "$SCRATCH/host/pod1.log"
client() { ip netns exec "$NS_CLIENT" python3 "$TRAFFIC" "$@"; }
answers() { client once "$SVC" 2 2>/dev/null | grep -q "^pod1 "; }   # the Service answers, from the pod
check "the client reaches the pod directly ($POD_IP:$POD_PORT)" eval 'client once "$POD_IP:$POD_PORT" 2 | grep -q "^pod1 $CLIENT_IP "'
check "before kube-proxy, the Service $SVC does not answer" eval '! answers'
step_end

step_begin "API server objects: kube-proxy's identity (system:node-proxier), the Node, the Service and its endpoint"
wait "$API_START_PID"; RC=$?
sed 's/^/      | /' "$SCRATCH/host/api-start.log" | tail -n 5
[[ $RC -eq 0 ]] || die "tests/kube/start.sh failed"
kp_api_load "$KP_API_DIR"
log "      kube-apiserver $APISERVER_URL ($(sed -n 's/^STARTUP_SECONDS=//p' "$KP_API_DIR/env") s to start)"
check "ServiceAccount kube-system/kube-proxy bound to system:node-proxier (as kubeadm does)" kp_rbac
KP_TOKEN="$(kp_token)"
check "a token for it (TokenRequest)" test -n "$KP_TOKEN"
check "Node $NODE_IP (InternalIP $NODE_IP)" kp_node "$NODE_IP" "$NODE_IP"
check "namespace kp, Service kp/echo $SVC -> targetPort $POD_PORT, its EndpointSlice ($POD_IP)" \
  eval 'kp_namespace kp && kp_service kp echo "$SVC_IP" "$SVC_PORT" "$POD_PORT" && kp_slice kp echo "$POD_IP" "$POD_PORT"'
step_end
