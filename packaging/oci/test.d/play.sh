# shellcheck shell=bash
# packaging/oci/test.sh --inside, sourced: the kubeadm static pod under podman kube play, and the manifests against a real kube-apiserver.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

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
  bad="$(grep -hE '^\s*image:' "$KUBE_DIR"/*.yaml | grep -vE "image: localhost/(konnectivity-(server|agent)|kube-proxy):$VERSION\$")"
  [[ -z "$bad" ]] || { log "      $bad"; return 1; }
}
check "every image in packaging/kubernetes/*.yaml is localhost/{konnectivity-server,konnectivity-agent,kube-proxy}:$VERSION" tags_ok
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
