# shellcheck shell=bash
# packaging/oci/test.sh --inside, sourced: kube-proxy's image as kubeadm's DaemonSet runs it, under podman kube play, on a node namespace of this test's with a real kube-apiserver.
# Shares the entry script's variables and helpers; runs in its shell, in this order.
#
# The node is this test's own network namespace (unshare --net in test.sh, never the host's):
# the pod has hostNetwork, so it programs this namespace. A client and a pod (network
# namespaces of their own) hang off it on veths:
#
#   client 10.12.51.2/24 -- 10.12.51.171/24 (node oci-kube-proxy-node) 10.244.1.1/32 -- 10.244.1.2/32 pod
#
# podman 4.3 plays Pods, not DaemonSets, so the test does what the cluster does between the
# manifest and a running pod: the API server stores the manifest's objects; the pod is the
# DaemonSet's template as its controller would create it for this node (spec.nodeName set);
# and, as the kubelet does, the downward API value ($(NODE_NAME) from spec.nodeName) is put in,
# the ServiceAccount token and CA are mounted at /var/run/secrets/kubernetes.io/serviceaccount,
# and the ConfigMap's kubeconfig.conf names this cluster's API server (kubeadm writes the
# cluster's endpoint there). Two host paths the pod mounts are stand-ins in the scratch
# directory, so nothing is created on the host: /run/xtables.lock (FileOrCreate) and
# /lib/modules (this VM has none).

KP_NODE=oci-kube-proxy-node KP_NODE_IP=10.12.51.171 KP_CLIENT_IP=10.12.51.2
KP_POD_IP=10.244.1.2 KP_POD_GW=10.244.1.1 KP_SVC_IP=10.96.0.80 KP_SVC_PORT=80 KP_POD_PORT=8080
KP_SVC="$KP_SVC_IP:$KP_SVC_PORT"
KP_NS_CLIENT="kpo$$-client" KP_NS_POD="kpo$$-pod"
# Namespaces are files under the host's /run/netns: removed whatever happens (test.sh's cleanup).
CLEANUP_HOOKS+=('ip netns del "$KP_NS_CLIENT" 2>/dev/null; ip netns del "$KP_NS_POD" 2>/dev/null')
KP_MANIFEST="$KUBE_DIR/kube-proxy.yaml"
KP_FIXTURE="$HERE/fixtures/kubeadm-kube-proxy.yaml"
TRAFFIC="$ROOT/packaging/kube-proxy-traffic.py"
KP_CTR=""
kp_logs() { podman logs "$KP_CTR" 2>&1 | tail -n "${1:-30}" | sed 's/^/      | /'; }
# Not `| grep -q`: with pipefail, nft killed by SIGPIPE would make a match fail.
kp_table_has_service() { [[ "$(nft list table ip kube-proxy 2>/dev/null)" == *"$KP_SVC_IP"* ]]; }
kp_client() { ip netns exec "$KP_NS_CLIENT" python3 "$TRAFFIC" "$@"; }
kp_answers() { kp_client once "$KP_SVC" 2 2>/dev/null | grep -q '^pod1 '; }

step_begin "kube-proxy: packaging/kubernetes/kube-proxy.yaml is kubeadm's manifest (packaging/oci/fixtures/) with only the image replaced"
# Both files' objects, without their leading comments: equal once the fixture's image line is ours.
objects() { sed -n '/^[^#]/,$p' "$1"; }
objects "$KP_FIXTURE" >"$SCRATCH/kp-fixture.yaml"; objects "$KP_MANIFEST" >"$SCRATCH/kp-manifest.yaml"
if with_image "$SCRATCH/kp-fixture.yaml" "$KUBE_PROXY_IMAGE" "$SCRATCH/kp-expected.yaml"; then
  check "kube-proxy.yaml = kubeadm's output with image $KUBE_PROXY_IMAGE, nothing else changed" \
    diff -u "$SCRATCH/kp-expected.yaml" "$SCRATCH/kp-manifest.yaml"
fi
step_end

step_begin "kube-proxy: the node (client and pod namespaces), a kube-apiserver, the manifest's objects in it"
KP_OK=1
if [[ $HAVE_KUBE_PROXY -ne 1 ]]; then
  KP_OK=0; [[ "$CI" == true ]] || skip "kube-proxy under kube play: no kube-proxy image"
elif [[ -z "${KUBE_BIN_DIR:-}" || ! -x "$KUBE_BIN_DIR/kube-apiserver" ]]; then
  KP_OK=0
  if [[ "$CI" == true ]]; then fail "no kube-apiserver (KUBE_BIN_DIR='${KUBE_BIN_DIR:-}'): kube-proxy cannot be tested"
  else skip "kube-proxy under kube play: no cached kube-apiserver (tests/kube/build.sh builds one)"; fi
fi
if [[ $KP_OK -eq 1 ]]; then
  # shellcheck source=packaging/kube-proxy-cluster.sh
  . "$ROOT/packaging/kube-proxy-cluster.sh"
  kp_network() {
    ip netns add "$KP_NS_CLIENT" && ip netns add "$KP_NS_POD" || return 1
    ip link add kpo-eth0 type veth peer name eth0 netns "$KP_NS_CLIENT" || return 1
    ip link add kpo-vp1 type veth peer name eth0 netns "$KP_NS_POD" || return 1
    ip addr add "$KP_NODE_IP/24" dev kpo-eth0 && ip link set kpo-eth0 up || return 1
    ip addr add "$KP_POD_GW/32" dev kpo-vp1 && ip link set kpo-vp1 up && ip route add "$KP_POD_IP/32" dev kpo-vp1 || return 1
    sysctl -qw net.ipv4.ip_forward=1 || return 1
    ip -n "$KP_NS_CLIENT" link set lo up && ip -n "$KP_NS_CLIENT" addr add "$KP_CLIENT_IP/24" dev eth0 \
      && ip -n "$KP_NS_CLIENT" link set eth0 up && ip -n "$KP_NS_CLIENT" route add default via "$KP_NODE_IP" || return 1
    ip -n "$KP_NS_POD" link set lo up && ip -n "$KP_NS_POD" addr add "$KP_POD_IP/32" dev eth0 \
      && ip -n "$KP_NS_POD" link set eth0 up && ip -n "$KP_NS_POD" route add default via "$KP_POD_GW" dev eth0 onlink
  }
  check "this test's network namespace is not the host's" test "$(readlink /proc/self/ns/net)" != "$OUTER_NET"
  check "client $KP_CLIENT_IP and pod $KP_POD_IP namespaces on veths into it (node $KP_NODE_IP)" kp_network
  ip netns exec "$KP_NS_POD" python3 "$TRAFFIC" serve pod1 "$KP_POD_PORT" >"$SCRATCH/kp-pod1.log" 2>&1 &
  HOST_PIDS+=($!)
  check "the pod's server listens" wait_for 10 grep -q ready "$SCRATCH/kp-pod1.log"
  check "no kube-proxy table in this namespace yet; the Service does not answer" eval '! kp_table_has_service && ! kp_answers'
  KP_API_DIR="$SCRATCH/kp-kube"
  KUBE_RUN_DIR="$KP_API_DIR"   # stopped by test.sh's cleanup
  if kp_api_start "$KP_API_DIR" 2>"$SCRATCH/kp-api-start.log"; then
    kp_api_load "$KP_API_DIR"
    pass "kube-apiserver $APISERVER_URL"
  else
    tail -n 10 "$SCRATCH/kp-api-start.log" | sed 's/^/      | /'; fail "kube-apiserver did not start"; KP_OK=0
  fi
fi
if [[ $KP_OK -eq 1 ]]; then
  # Every object of the manifest, created as `kubectl apply` would (YAML as the API takes it).
  kp_apply() {
    local doc kind path n=0
    rm -rf "$SCRATCH/kp-docs"; mkdir -p "$SCRATCH/kp-docs"
    awk -v d="$SCRATCH/kp-docs" 'BEGIN { n = 0; out = d "/0.yaml" } /^---[[:space:]]*$/ { n++; out = d "/" n ".yaml"; next } { print > out }' "$KP_MANIFEST"
    for doc in $(printf '%s\n' "$SCRATCH"/kp-docs/*.yaml | sort -V); do
      grep -q '^kind:' "$doc" || continue
      kind="$(sed -n 's/^kind: *//p' "$doc")"
      case "$kind" in
        ServiceAccount) path=/api/v1/namespaces/kube-system/serviceaccounts ;;
        ConfigMap) path=/api/v1/namespaces/kube-system/configmaps ;;
        DaemonSet) path=/apis/apps/v1/namespaces/kube-system/daemonsets ;;
        ClusterRoleBinding) path=/apis/rbac.authorization.k8s.io/v1/clusterrolebindings ;;
        Role) path=/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles ;;
        RoleBinding) path=/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings ;;
        *) log "      unexpected kind $kind in kube-proxy.yaml"; return 1 ;;
      esac
      kapi POST "$path?fieldValidation=Strict" "$(cat "$doc")" application/yaml >/dev/null \
        || { log "      the API server refused the $kind"; return 1; }
      n=$((n + 1))
    done
    log "      $n objects created"
    [[ $n -eq 6 ]]
  }
  check "the manifest's 6 objects created (ServiceAccount, ClusterRoleBinding, Role, RoleBinding, ConfigMap, DaemonSet; strict field validation)" kp_apply
  check "Node $KP_NODE (InternalIP $KP_NODE_IP); Service kp/echo $KP_SVC -> $KP_POD_IP:$KP_POD_PORT" \
    eval 'kp_node "$KP_NODE" "$KP_NODE_IP" && kp_namespace kp && kp_service kp echo "$KP_SVC_IP" "$KP_SVC_PORT" "$KP_POD_PORT" && kp_slice kp echo "$KP_POD_IP" "$KP_POD_PORT"'
  # The pod's ServiceAccount credentials, as the kubelet mounts them.
  KP_SA="$SCRATCH/kp-serviceaccount"; mkdir -p "$KP_SA"
  KP_TOKEN="$(kp_token)" && printf '%s' "$KP_TOKEN" >"$KP_SA/token" && cp "$KP_CA_CERT" "$KP_SA/ca.crt" \
    && printf 'kube-system' >"$KP_SA/namespace"
  check "a token of kube-system/kube-proxy (TokenRequest) and the cluster CA for the pod" test -s "$KP_SA/token"
  : >"$SCRATCH/kp-xtables.lock"; mkdir -p "$SCRATCH/kp-lib-modules"
  # What podman plays: the ConfigMap (its kubeconfig.conf naming this API server) and the pod
  # the DaemonSet's controller and the kubelet would run on this node, from the stored objects.
  kp_play_file() {
    local cm ds
    cm="$(kapi GET /api/v1/namespaces/kube-system/configmaps/kube-proxy)" || return 1
    ds="$(kapi GET /apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy)" || return 1
    KP_POD_NAME="$(jq -r --arg node "$KP_NODE" '.metadata.name + "-" + $node' <<<"$ds")"
    jq --arg server "https://127.0.0.1:$APISERVER_PORT" \
      '{apiVersion: "v1", kind: "ConfigMap", metadata: {name: .metadata.name, namespace: .metadata.namespace},
        data: (.data | .["kubeconfig.conf"] |= sub("server: [^\n]*"; "server: " + $server))}' <<<"$cm" || return 1
    echo ---
    jq --arg node "$KP_NODE" --arg sa "$KP_SA" --arg lock "$SCRATCH/kp-xtables.lock" --arg modules "$SCRATCH/kp-lib-modules" '
      .spec.template as $t
      # The downward API: each env value from spec.nodeName, then $(NAME) in command and args.
      | ($t.spec.containers[0].env // [] | map({(.name): (if .valueFrom.fieldRef.fieldPath == "spec.nodeName" then $node else .value end)}) | add // {}) as $env
      | def expand: reduce ($env | to_entries[]) as $e (.; gsub("\\$\\(" + $e.key + "\\)"; $e.value));
      {apiVersion: "v1", kind: "Pod",
       metadata: {name: (.metadata.name + "-" + $node), namespace: .metadata.namespace, labels: $t.metadata.labels},
       spec: ($t.spec + {nodeName: $node}
         | .containers |= map(
             .command |= (if . then map(expand) else . end)
             | .args |= (if . then map(expand) else . end)
             | .env |= (if . then map({name: .name, value: $env[.name]}) else . end)
             | .volumeMounts += [{name: "kube-api-access", mountPath: "/var/run/secrets/kubernetes.io/serviceaccount", readOnly: true}])
         | .volumes |= map(
             if .hostPath.path == "/run/xtables.lock" then .hostPath = {path: $lock, type: "File"}
             elif .hostPath.path == "/lib/modules" then .hostPath = {path: $modules, type: "Directory"}
             else . end)
         | .volumes += [{name: "kube-api-access", hostPath: {path: $sa, type: "Directory"}}])}' <<<"$ds"
  }
  KP_POD_NAME=""
  if kp_play_file >"$SCRATCH/kp-play.yaml" && [[ -n "$KP_POD_NAME" ]]; then
    pass "the pod for node $KP_NODE, from the stored DaemonSet and ConfigMap"
  else
    fail "the pod for node $KP_NODE could not be made from the stored objects"; KP_OK=0
  fi
fi
step_end

step_begin "kube-proxy: podman kube play (the DaemonSet's pod): the ConfigMap's configuration programs this namespace, a Service answers"
if [[ $KP_OK -eq 1 ]]; then
  # podman names a pod's container <pod>-<container>.
  KP_CTR="$KP_POD_NAME-kube-proxy"
  PODS+=("$SCRATCH/kp-play.yaml")
  T=$(now)
  if podman kube play "$SCRATCH/kp-play.yaml" >"$SCRATCH/kp-play.log" 2>&1; then
    pass "podman kube play ($(secs "$T") s)"
  else
    sed 's/^/      | /' "$SCRATCH/kp-play.log"; fail "podman kube play"; KP_OK=0
  fi
fi
if [[ $KP_OK -eq 1 ]]; then
  T=$(now)
  check "the Service's rules in this namespace's nftables (ip kube-proxy has $KP_SVC_IP)" wait_for 60 kp_table_has_service
  log "      rules in $(secs "$T") s after the pod started"
  check "client -> $KP_SVC (ClusterIP) -> pod1, answered" kp_answers
  log "      answer: $(kp_client once "$KP_SVC" 2)"
  KP_PID="$(podman inspect --format '{{.State.Pid}}' "$KP_CTR" 2>/dev/null)"
  check "the pod's process is in this test's network namespace (hostNetwork)" \
    test "$(readlink "/proc/$KP_PID/ns/net")" = "$(readlink /proc/self/ns/net)"
  check "it runs as uid 0 (the image's user; privileged: true)" \
    test "$(awk '/^Uid:/ { print $2 }' "/proc/$KP_PID/status" 2>/dev/null)" = 0
  # The ConfigMap's config.conf is what it runs: kubeadm's clusterCIDR (10.244.0.0/16) decides
  # what is local traffic, in the rules; mode "" is iptables, served by our nftables dataplane.
  check "the ConfigMap's clusterCIDR 10.244.0.0/16 is in the rules" eval '[[ "$(nft list table ip kube-proxy)" == *10.244.0.0/16* ]]'
  # --hostname-override=$(NODE_NAME) named the Node: its InternalIP is the node IP found.
  check "log: 'Detected node IP' $KP_NODE_IP: the Node $KP_NODE, named by --hostname-override=\$(NODE_NAME)" \
    eval '[[ "$(podman logs "$KP_CTR" 2>&1 | grep -c "\"Detected node IP\" ipFamily=\"IPv4\" nodeIP=\"$KP_NODE_IP\"")" -ge 1 ]]'
  check "log: the iptables mode (kubeadm's default) served by the nftables dataplane" \
    eval '[[ "$(podman logs "$KP_CTR" 2>&1 | grep -c "the iptables mode is served by nftables rules")" -ge 1 ]]'
  check "healthz 200 on 10256 (the configuration's healthzBindAddress)" wait_for 10 code_is 200 http://127.0.0.1:10256/healthz
  [[ $FAILS -eq 0 ]] || kp_logs 40
  T=$(now); podman pod stop -t 20 "$KP_POD_NAME" >/dev/null 2>&1
  code="$(podman inspect --format '{{.State.ExitCode}}' "$KP_CTR" 2>/dev/null)"
  check "SIGTERM -> exit code 0 (got '$code', after $(secs "$T") s)" test "$code" = 0
  check "the rules stay after the pod stopped: the Service still answers" eval 'kp_table_has_service && kp_answers'
  podman kube play --down "$SCRATCH/kp-play.yaml" >/dev/null 2>&1
  PODS=("${PODS[@]/"$SCRATCH/kp-play.yaml"}")
fi
# This namespace goes with test.sh; the client's and the pod's, and the API server, are this step's.
ip netns del "$KP_NS_CLIENT" 2>/dev/null; ip netns del "$KP_NS_POD" 2>/dev/null
if [[ -n "${KP_API_DIR:-}" ]]; then kp_api_stop; KUBE_RUN_DIR=""; fi
step_end
