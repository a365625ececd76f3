#!/usr/bin/env bash
# Checks this directory's manifests against a real kube-apiserver (tests/kube: etcd +
# kube-apiserver on 127.0.0.1), the REST equivalent of `kubectl apply --dry-run=server`:
#
#   packaging/kubernetes/check.sh [DIR]
#
#   - kube-apiserver starts with --egress-selector-config-file=egress-selector-configuration.yaml,
#     then again with egress-selector-configuration-http-connect.yaml (it refuses to start on
#     a configuration it cannot load or validate); --allow-privileged=true as kubeadm sets it
#   - every object of every other *.yaml is POSTed with ?dryRun=All&fieldValidation=Strict:
#     decoded, defaulted, validated and admitted like a real create, unknown or duplicate
#     fields rejected, nothing stored
#
# DIR holds the fixture's state (default: a temp dir, removed). Binaries: $KUBE_BIN_DIR, else
# tests/kube/build.sh (a cache hit once built; ~10 min cold). Prints one line per object and the
# durations; exit 1 if anything was refused. Needs curl and jq.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
T0=$(date +%s.%N)
secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
FAILS=0

if [[ -n "${1:-}" ]]; then DIR="$1"; OWN_DIR=0; else DIR="$(mktemp -d)"; OWN_DIR=1; fi
mkdir -p "$DIR"
stop() { "$ROOT/tests/kube/stop.sh" "$1" >/dev/null 2>&1; }
cleanup() { stop "$DIR/grpc"; stop "$DIR/http-connect"; [[ $OWN_DIR -eq 1 ]] && rm -rf "$DIR"; }
trap cleanup EXIT

if [[ -z "${KUBE_BIN_DIR:-}" ]]; then
  KUBE_BIN_DIR="$("$ROOT/tests/kube/build.sh" | tail -n 1)" || { echo "tests/kube/build.sh failed"; exit 1; }
fi
export KUBE_BIN_DIR KUBE_WATCH_PID=$$

start() { # <name> <egress file>
  local t; t=$(date +%s.%N)
  # --allow-privileged=true, as kubeadm runs kube-apiserver: kube-proxy's DaemonSet is privileged.
  if KUBE_APISERVER_EXTRA_ARGS="--egress-selector-config-file=$2 --allow-privileged=true" \
    "$ROOT/tests/kube/start.sh" "$DIR/$1" 2>"$DIR/$1.start.log"; then
    echo "kube-apiserver up with $(basename "$2") ($(secs "$t") s)"
  else
    echo "FAIL: kube-apiserver did not start with $(basename "$2"):"
    tail -n 5 "$DIR/$1.start.log"; grep -i egress "$DIR/$1/kube-apiserver.log" 2>/dev/null | tail -n 5
    FAILS=$((FAILS + 1)); return 1
  fi
}

# kind -> <collection path with NS for the namespace>
collection() {
  case "$1" in
    Pod) echo /api/v1/namespaces/NS/pods ;;
    ServiceAccount) echo /api/v1/namespaces/NS/serviceaccounts ;;
    ConfigMap) echo /api/v1/namespaces/NS/configmaps ;;
    Service) echo /api/v1/namespaces/NS/services ;;
    DaemonSet) echo /apis/apps/v1/namespaces/NS/daemonsets ;;
    Deployment) echo /apis/apps/v1/namespaces/NS/deployments ;;
    Role) echo /apis/rbac.authorization.k8s.io/v1/namespaces/NS/roles ;;
    RoleBinding) echo /apis/rbac.authorization.k8s.io/v1/namespaces/NS/rolebindings ;;
    ClusterRole) echo /apis/rbac.authorization.k8s.io/v1/clusterroles ;;
    ClusterRoleBinding) echo /apis/rbac.authorization.k8s.io/v1/clusterrolebindings ;;
    *) return 1 ;;
  esac
}

dry_run_all() {
  # shellcheck disable=SC1091
  set -a; . "$DIR/grpc/env"; set +a
  local f doc kind name ns path code n=0
  for f in "$HERE"/*.yaml; do
    case "$(basename "$f")" in egress-selector-configuration*.yaml) continue ;; esac
    rm -rf "$DIR/docs"; mkdir -p "$DIR/docs"
    awk -v d="$DIR/docs" 'BEGIN { n = 0; out = d "/0.yaml" } /^---[[:space:]]*$/ { n++; out = d "/" n ".yaml"; next } { print > out }' "$f"
    for doc in "$DIR"/docs/*.yaml; do
      grep -q '^kind:' "$doc" || continue      # a file's leading comment block
      kind="$(sed -n 's/^kind: *//p' "$doc" | head -n1)"
      name="$(awk '/^metadata:/ { m = 1; next } m && /^  name:/ { print $2; exit } /^[^ #]/ { m = 0 }' "$doc")"
      ns="$(awk '/^metadata:/ { m = 1; next } m && /^  namespace:/ { print $2; exit } /^[^ #]/ { m = 0 }' "$doc")"
      if ! path="$(collection "$kind")"; then
        echo "FAIL: $(basename "$f"): kind $kind has no collection path here"; FAILS=$((FAILS + 1)); continue
      fi
      path="${path/NS/${ns:-default}}"
      code="$(curl -sS -o "$DIR/response.json" -w '%{http_code}' --cacert "$CA_CERT" \
        -H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/yaml' \
        -X POST --data-binary @"$doc" "$APISERVER_URL$path?dryRun=All&fieldValidation=Strict")"
      if [[ "$code" == 201 || "$code" == 200 ]]; then
        echo "ok    $(basename "$f"): $kind ${ns:+$ns/}$name (dry run: $code)"
        n=$((n + 1))
      else
        echo "FAIL  $(basename "$f"): $kind ${ns:+$ns/}$name: HTTP $code $(jq -r '.message // .' "$DIR/response.json" 2>/dev/null | head -c 600)"
        FAILS=$((FAILS + 1))
      fi
      # Strict validation reports unknown fields as an error; warnings would come as headers.
    done
  done
  echo "$n objects accepted"
}

if start grpc "$HERE/egress-selector-configuration.yaml"; then
  dry_run_all
  stop "$DIR/grpc"
fi
start http-connect "$HERE/egress-selector-configuration-http-connect.yaml" && stop "$DIR/http-connect"
echo "check.sh: $FAILS failure(s), $(secs "$T0") s"
[[ $FAILS -eq 0 ]]
