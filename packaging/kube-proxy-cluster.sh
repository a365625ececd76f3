# shellcheck shell=bash
# Sourced by the kube-proxy packaging tests (packaging/nspawn/kube-proxy/, packaging/oci/test.d/):
# the test API server (tests/kube/start.sh: etcd + kube-apiserver on a loopback) and the objects
# a kube-proxy reads, written over REST as its admin (no controller-manager runs: Services have
# no selector and their EndpointSlices are written by hand). Needs curl and jq; the caller
# defines fail().

# Service ClusterIPs: kube-apiserver's range. start.sh's default (10.0.0.0/24) would hold
# addresses the tests give their namespaces.
KP_SERVICE_CIDR=10.96.0.0/16
# The `endpointslice.kubernetes.io/managed-by` of every slice written here.
KP_MANAGED_BY=packaging-test.kube-traffic.example.com

kp_api_start() { # <dir>: starts the fixture there (KP_API_DIR must name it for kp_api_stop)
  # The fixture's watchdog stops it if this script dies without its cleanup.
  # --allow-privileged=true, as kubeadm runs kube-apiserver: kube-proxy's DaemonSet is privileged.
  KUBE_APISERVER_EXTRA_ARGS="--service-cluster-ip-range=$KP_SERVICE_CIDR --allow-privileged=true" KUBE_WATCH_PID=$$ \
    "$ROOT/tests/kube/start.sh" "$1"
}
kp_api_load() { # <dir>: what start.sh wrote there, for kapi
  # KEY=VALUE lines without quotes or spaces (start.sh writes them so).
  APISERVER_PORT="$(sed -n 's/^APISERVER_PORT=//p' "$1/env")"
  APISERVER_URL="$(sed -n 's/^APISERVER_URL=//p' "$1/env")"
  KP_CA_CERT="$(sed -n 's/^CA_CERT=//p' "$1/env")"
  KP_ADMIN_TOKEN="$(sed -n 's/^ADMIN_TOKEN=//p' "$1/env")"
}
kp_api_stop() { [[ -z "${KP_API_DIR:-}" ]] || "$ROOT/tests/kube/stop.sh" "$KP_API_DIR" >/dev/null 2>&1; }

kapi() { # <method> <path> [body (JSON, or YAML with content type application/yaml)] [content type]
  curl -sS --fail-with-body --max-time 20 --cacert "$KP_CA_CERT" -H "Authorization: Bearer $KP_ADMIN_TOKEN" \
    -H "Content-Type: ${4:-application/json}" -X "$1" "$APISERVER_URL$2" ${3:+--data-binary "$3"}
}

# The kube-proxy identity kubeadm sets up: ServiceAccount kube-system/kube-proxy bound to the
# ClusterRole system:node-proxier (kube-apiserver's bootstrap role for kube-proxy).
kp_rbac() {
  kapi POST /api/v1/namespaces/kube-system/serviceaccounts \
    '{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"kube-proxy","namespace":"kube-system"}}' >/dev/null &&
  kapi POST /apis/rbac.authorization.k8s.io/v1/clusterrolebindings \
    '{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"kubeadm:node-proxier"},"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"system:node-proxier"},"subjects":[{"kind":"ServiceAccount","name":"kube-proxy","namespace":"kube-system"}]}' >/dev/null
}

kp_token() { # prints a token of kube-system/kube-proxy (TokenRequest, valid 2 h)
  kapi POST /api/v1/namespaces/kube-system/serviceaccounts/kube-proxy/token \
    '{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":7200}}' | jq -er .status.token
}

kp_kubeconfig() { # <server URL> <token>: a node's kubeconfig, as a node bootstrap writes it
  cat <<KC
apiVersion: v1
kind: Config
clusters:
- name: kubernetes
  cluster:
    server: $1
    certificate-authority-data: $(base64 -w0 "$KP_CA_CERT")
users:
- name: kube-proxy
  user:
    token: $2
contexts:
- name: kube-proxy@kubernetes
  context: {cluster: kubernetes, user: kube-proxy}
current-context: kube-proxy@kubernetes
KC
}

kp_node() { # <name> <InternalIP>
  kapi POST /api/v1/nodes "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"$1\"}}" >/dev/null &&
  kapi PATCH "/api/v1/nodes/$1/status" "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"$2\"}]}}" \
    application/merge-patch+json >/dev/null
}

kp_namespace() { # <name>
  kapi POST /api/v1/namespaces "{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"$1\"}}" >/dev/null
}

kp_service() { # <namespace> <name> <ClusterIP> <port> <targetPort>: a TCP Service without a selector
  kapi POST "/api/v1/namespaces/$1/services" "{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{\"name\":\"$2\",\"namespace\":\"$1\"},\"spec\":{\"clusterIP\":\"$3\",\"ports\":[{\"name\":\"tcp\",\"protocol\":\"TCP\",\"port\":$4,\"targetPort\":$5}]}}" >/dev/null
}

kp_slice() { # <namespace> <service> <endpoint IP> <port>: its EndpointSlice, one ready endpoint
  kapi POST "/apis/discovery.k8s.io/v1/namespaces/$1/endpointslices" "{\"apiVersion\":\"discovery.k8s.io/v1\",\"kind\":\"EndpointSlice\",\"metadata\":{\"name\":\"$2-1\",\"namespace\":\"$1\",\"labels\":{\"kubernetes.io/service-name\":\"$2\",\"endpointslice.kubernetes.io/managed-by\":\"$KP_MANAGED_BY\"}},\"addressType\":\"IPv4\",\"endpoints\":[{\"addresses\":[\"$3\"],\"conditions\":{\"ready\":true,\"serving\":true,\"terminating\":false}}],\"ports\":[{\"name\":\"tcp\",\"protocol\":\"TCP\",\"port\":$4}]}" >/dev/null
}
