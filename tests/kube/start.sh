#!/usr/bin/env bash
# Starts a real etcd + kube-apiserver on loopback for tests:   tests/kube/start.sh DIR
#
# Everything lives under DIR (created if missing, must be empty of a running fixture):
#   DIR/env                 KEY=VALUE lines (no quoting; paths contain no spaces), see below
#   DIR/kubeconfig          cluster admin (static token, group system:masters)
#   DIR/server.kubeconfig   user "system:konnectivity-server" with exactly upstream's RBAC:
#                           create tokenreviews; get/create/update/list/delete leases in kube-system
#   DIR/pki/                ca.{crt,key} (test CA), apiserver.{crt,key} (serving, SAN 127.0.0.1/localhost),
#                           sa.key / sa.pub (service-account signing key pair, RSA 2048)
#   DIR/audit.log           JSON lines, level Metadata, stage ResponseComplete, for
#                           tokenreviews create and every lease request not made by the apiserver itself
#   DIR/etcd.log, DIR/kube-apiserver.log, DIR/etcd-data/ (unless KUBE_ETCD_DATA)
#
# Ports are random free TCP ports in [1024, 32767] (below the kernel's ephemeral range),
# retried on a bind race. Binaries come from $KUBE_BIN_DIR, else from ./build.sh (which
# builds them on first use, ~10 min cold).
# Prints nothing on stdout; progress and errors on stderr. Non-zero exit (and nothing left
# running) on failure. Stop with tests/kube/stop.sh DIR.
#
# Env knobs:
#   KUBE_BIN_DIR              directory with kube-apiserver and etcd (skips build.sh)
#   KUBE_AUTHORIZATION_MODE   default RBAC (AlwaysAllow also works)
#   KUBE_APISERVER_EXTRA_ARGS extra kube-apiserver flags, whitespace-separated
#                             (e.g. --egress-selector-config-file=...)
#   KUBE_START_TIMEOUT        seconds to wait for /readyz (default 120)
#   KUBE_ETCD_DATA            an existing etcd data directory to start from, used in place of
#                             DIR/etcd-data and not emptied (a populated cluster kept across
#                             runs, e.g. the benchmarks'; pass a copy, etcd writes to it)
#   KUBE_WATCH_PID            if set, a watchdog runs stop.sh DIR when that pid exits
#                             (so a crashed test run does not leak the servers)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -ne 1 ]]; then echo "usage: $0 DIR" >&2; exit 2; fi
mkdir -p "$1"
DIR="$(cd "$1" && pwd)"
case "$DIR" in *[[:space:]]*) echo "start.sh: DIR must not contain whitespace: '$DIR'" >&2; exit 2;; esac
if [[ -f "$DIR/env" ]] && grep -q '^RUNNING=1$' "$DIR/env"; then
  echo "start.sh: $DIR already holds a running fixture; run stop.sh first" >&2; exit 2
fi

T0=$(date +%s.%N)
secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "start.sh: $*" >&2; }

if [[ -z "${KUBE_BIN_DIR:-}" ]]; then
  KUBE_BIN_DIR="$("$HERE/build.sh" | tail -n 1)" || { log "build.sh failed"; exit 1; }
fi
APISERVER_BIN="$KUBE_BIN_DIR/kube-apiserver"
ETCD_BIN="$KUBE_BIN_DIR/etcd"
for b in "$APISERVER_BIN" "$ETCD_BIN"; do
  [[ -x "$b" ]] || { log "missing binary $b"; exit 1; }
done

AUTHZ="${KUBE_AUTHORIZATION_MODE:-RBAC}"
TIMEOUT="${KUBE_START_TIMEOUT:-120}"
ISSUER="https://kubernetes.default.svc.cluster.local"
API_AUDIENCES="$ISSUER"
KONN_AUDIENCE="system:konnectivity-server"
ADMIN_TOKEN="$(openssl rand -hex 24)"
SERVER_TOKEN="$(openssl rand -hex 24)"
SERVER_USER="system:konnectivity-server"

ETCD_PID=""; APISERVER_PID=""
cleanup_on_error() {
  local rc=$?
  [[ $rc -eq 0 ]] && return
  log "failed (rc=$rc), stopping what was started"
  for p in $APISERVER_PID $ETCD_PID; do kill "$p" 2>/dev/null || true; done
  for p in $APISERVER_PID $ETCD_PID; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  sed -i 's/^RUNNING=1$/RUNNING=0/' "$DIR/env" 2>/dev/null || true
}
trap cleanup_on_error EXIT

# ---------------------------------------------------------------- ports
declare -A TAKEN=()
port_in_use() { ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q . ; }
free_port() { # <variable name>: sets it (no subshell, so TAKEN stays shared)
  local p
  for _ in $(seq 200); do
    p=$(( 1024 + (RANDOM * 32768 + RANDOM) % (32767 - 1024 + 1) ))
    [[ -n "${TAKEN[$p]:-}" ]] && continue
    port_in_use "$p" && continue
    TAKEN[$p]=1; printf -v "$1" '%s' "$p"; return 0
  done
  log "no free port found"; return 1
}

# ---------------------------------------------------------------- pki
PKI="$DIR/pki"
mkdir -p "$PKI"
(
  cd "$PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -sha256 \
    -keyout ca.key -out ca.crt -subj "/CN=konnectivity-test-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" \
    "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" > apiserver.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -sha256 \
    -extfile apiserver.ext -out apiserver.crt 2>/dev/null
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
  openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
  rm -f apiserver.csr apiserver.ext ca.srl
  chmod 600 ./*.key
)

printf '%s,admin,admin-uid,system:masters\n%s,%s,konnectivity-server-uid\n' \
  "$ADMIN_TOKEN" "$SERVER_TOKEN" "$SERVER_USER" > "$DIR/tokens.csv"
chmod 600 "$DIR/tokens.csv"

cat > "$DIR/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
# the apiserver's own identity/endpoint leases in kube-system renew every few seconds: noise
- level: None
  users: ["system:apiserver"]
- level: Metadata
  verbs: ["create"]
  resources:
  - group: authentication.k8s.io
    resources: ["tokenreviews"]
- level: Metadata
  resources:
  - group: coordination.k8s.io
    resources: ["leases"]
- level: None
EOF

# ---------------------------------------------------------------- etcd
wait_http() { # <url> <pid> <seconds> [curl args...]
  local url="$1" pid="$2" t="$3"; shift 3
  local deadline=$(( $(date +%s) + t ))
  while (( $(date +%s) < deadline )); do
    kill -0 "$pid" 2>/dev/null || return 2
    if curl -fsS -o /dev/null --max-time 2 "$@" "$url" 2>/dev/null; then return 0; fi
    sleep 0.2
  done
  return 1
}

# With KUBE_ETCD_DATA the data's own member restarts: etcd ignores the --initial-* flags then,
# and takes the new peer and client URLs (one member, so no peer holds the old ones).
ETCD_DATA="${KUBE_ETCD_DATA:-$DIR/etcd-data}"
start_etcd() {
  free_port ETCD_CLIENT_PORT; free_port ETCD_PEER_PORT
  [[ -n "${KUBE_ETCD_DATA:-}" ]] || rm -rf "$ETCD_DATA"
  setsid "$ETCD_BIN" \
    --name=fixture --data-dir="$ETCD_DATA" \
    --listen-client-urls="http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --advertise-client-urls="http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="fixture=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state=new \
    --unsafe-no-fsync --log-level=warn \
    </dev/null >"$DIR/etcd.log" 2>&1 &
  ETCD_PID=$!
  wait_http "http://127.0.0.1:$ETCD_CLIENT_PORT/health" "$ETCD_PID" 30
}

for attempt in 1 2 3 4 5; do
  rc=0; start_etcd || rc=$?
  [[ $rc -eq 0 ]] && break
  log "etcd attempt $attempt failed (rc=$rc); log tail:"; tail -n 5 "$DIR/etcd.log" >&2
  kill "$ETCD_PID" 2>/dev/null || true; wait "$ETCD_PID" 2>/dev/null || true; ETCD_PID=""
  [[ $attempt -eq 5 ]] && exit 1
done
ETCD_URL="http://127.0.0.1:$ETCD_CLIENT_PORT"

# ---------------------------------------------------------------- kube-apiserver
# Admission: only NamespaceLifecycle; every other default-enabled plugin is disabled
# (the list is read from this binary's --help, so it tracks the pinned version).
DEFAULT_ADMISSION="$("$APISERVER_BIN" --help 2>&1 | sed -n 's/.*in addition to default enabled ones (\([^)]*\)).*/\1/p' | tr -d ' ')"
DISABLE_ADMISSION="$(tr ',' '\n' <<<"$DEFAULT_ADMISSION" | grep -vx NamespaceLifecycle | paste -sd, -)"

start_apiserver() {
  free_port APISERVER_PORT
  # shellcheck disable=SC2086
  setsid "$APISERVER_BIN" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --cert-dir="$PKI" \
    --etcd-servers="$ETCD_URL" \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-account-issuer="$ISSUER" \
    --api-audiences="$API_AUDIENCES" \
    --token-auth-file="$DIR/tokens.csv" \
    --authorization-mode="$AUTHZ" \
    --enable-admission-plugins=NamespaceLifecycle \
    --disable-admission-plugins="$DISABLE_ADMISSION" \
    --audit-policy-file="$DIR/audit-policy.yaml" --audit-log-path="$DIR/audit.log" \
    --audit-log-mode=blocking --audit-log-maxbackup=0 \
    --service-cluster-ip-range=10.0.0.0/24 \
    --endpoint-reconciler-type=none \
    --profiling=false \
    ${KUBE_APISERVER_EXTRA_ARGS:-} \
    </dev/null >"$DIR/kube-apiserver.log" 2>&1 &
  APISERVER_PID=$!
  wait_http "https://127.0.0.1:$APISERVER_PORT/readyz" "$APISERVER_PID" "$TIMEOUT" \
    --cacert "$PKI/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN"
}

for attempt in 1 2 3; do
  rc=0; start_apiserver || rc=$?
  [[ $rc -eq 0 ]] && break
  log "kube-apiserver attempt $attempt failed (rc=$rc: 1=timeout 2=exited); log tail:"
  tail -n 15 "$DIR/kube-apiserver.log" >&2
  kill "$APISERVER_PID" 2>/dev/null || true; wait "$APISERVER_PID" 2>/dev/null || true
  APISERVER_PID=""
  # retry only a lost port race; anything else is a real failure
  grep -q 'address already in use' "$DIR/kube-apiserver.log" && [[ $attempt -lt 3 ]] || exit 1
done
APISERVER_URL="https://127.0.0.1:$APISERVER_PORT"

# ---------------------------------------------------------------- kubeconfigs
write_kubeconfig() { # <file> <user> <token>
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: fixture
  cluster:
    server: $APISERVER_URL
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $2
  user:
    token: $3
contexts:
- name: fixture
  context:
    cluster: fixture
    user: $2
current-context: fixture
EOF
  chmod 600 "$1"
}
write_kubeconfig "$DIR/kubeconfig" admin "$ADMIN_TOKEN"
write_kubeconfig "$DIR/server.kubeconfig" "$SERVER_USER" "$SERVER_TOKEN"

# ---------------------------------------------------------------- RBAC for the server identity
kapi() { # <method> <path> <json body>: created, or there already (a reused KUBE_ETCD_DATA)
  local code
  code="$(curl -sS --max-time 10 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    -H 'Content-Type: application/json' -X "$1" "$APISERVER_URL$2" --data "$3" -o /dev/null \
    -w '%{http_code}')" || return 1
  [[ "$code" == 2?? || "$code" == 409 ]] || { log "$1 $2: HTTP $code"; return 1; }
}
kapi POST /apis/rbac.authorization.k8s.io/v1/clusterroles '{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"konnectivity-server:auth-delegator"},"rules":[{"apiGroups":["authentication.k8s.io"],"resources":["tokenreviews"],"verbs":["create"]}]}'
kapi POST /apis/rbac.authorization.k8s.io/v1/clusterrolebindings '{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"konnectivity-server:auth-delegator"},"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"konnectivity-server:auth-delegator"},"subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"'"$SERVER_USER"'"}]}'
kapi POST /apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles '{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"konnectivity-server:leases","namespace":"kube-system"},"rules":[{"apiGroups":["coordination.k8s.io"],"resources":["leases"],"verbs":["get","create","update","list","delete"]}]}'
kapi POST /apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings '{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"konnectivity-server:leases","namespace":"kube-system"},"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"konnectivity-server:leases"},"subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"'"$SERVER_USER"'"}]}'

# ---------------------------------------------------------------- env + watchdog
WATCHDOG_PID=""
if [[ -n "${KUBE_WATCH_PID:-}" ]]; then
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" "$3"' \
    watchdog "$KUBE_WATCH_PID" "$HERE/stop.sh" "$DIR" </dev/null >"$DIR/watchdog.log" 2>&1 &
  WATCHDOG_PID=$!
fi

STARTUP_SECONDS="$(secs "$T0")"
cat > "$DIR/env.tmp" <<EOF
RUNNING=1
KUBE_BIN_DIR=$KUBE_BIN_DIR
ETCD_PID=$ETCD_PID
ETCD_CLIENT_PORT=$ETCD_CLIENT_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
ETCD_URL=$ETCD_URL
ETCD_LOG=$DIR/etcd.log
APISERVER_PID=$APISERVER_PID
APISERVER_PORT=$APISERVER_PORT
APISERVER_URL=$APISERVER_URL
APISERVER_LOG=$DIR/kube-apiserver.log
WATCHDOG_PID=$WATCHDOG_PID
CA_CERT=$PKI/ca.crt
CA_KEY=$PKI/ca.key
APISERVER_CERT=$PKI/apiserver.crt
SA_SIGNING_KEY=$PKI/sa.key
SA_PUBLIC_KEY=$PKI/sa.pub
SA_ISSUER=$ISSUER
API_AUDIENCES=$API_AUDIENCES
KONNECTIVITY_AUDIENCE=$KONN_AUDIENCE
KUBECONFIG=$DIR/kubeconfig
ADMIN_TOKEN=$ADMIN_TOKEN
SERVER_KUBECONFIG=$DIR/server.kubeconfig
SERVER_USER=$SERVER_USER
SERVER_TOKEN=$SERVER_TOKEN
AUDIT_LOG=$DIR/audit.log
AUTHORIZATION_MODE=$AUTHZ
STARTUP_SECONDS=$STARTUP_SECONDS
EOF
mv "$DIR/env.tmp" "$DIR/env"
log "etcd :$ETCD_CLIENT_PORT (pid $ETCD_PID), kube-apiserver :$APISERVER_PORT (pid $APISERVER_PID) ready in ${STARTUP_SECONDS}s"
