# shellcheck shell=bash
# packaging/oci/test.sh --inside, sourced: the images as built, their certificates, podman run of server and agent with a tunnel, and the ConfigMap reload.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# ------------------------------------------------------------------------------ images ------
declare -A SIZES=()
ldd_libs() { ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'; }
with_parents() { # <path>...: each path (no leading /) and every directory above it
  local f; for f in "$@"; do f="${f#/}"; while [[ "$f" == */* ]]; do echo "$f"; f="${f%/*}"; done; echo "$f"; done
}
# <program> <image> <entry> <binary> [user [/usr/bin link] [home] [tool...]]: the image as
# build.sh makes it. Defaults: the Konnectivity images' (65532:65532, /usr/bin/<entry>,
# /home/nonroot, no tool); "-" for none.
image_checks() {
  local p="$1" img="$2" entry="$3" bin="$4" want_user="${5:-65532:65532}" link="${6:-usr/bin/$3}" home="${7:-home/nonroot}"
  shift 4; shift $(( $# < 3 ? $# : 3 ))
  local tools=("$@") size user labels ctr t lib pkg
  [[ "$link" == - ]] && link=""; [[ "$home" == - ]] && home=""
  size="$(podman image inspect --format '{{.Size}}' "$img")"
  SIZES[$p]="$size"
  log "      image $img: $size bytes ($(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1e6 }') MB)"
  check "$p image under 25 MB ($size bytes)" test "$size" -lt 25000000
  user="$(podman image inspect --format '{{.User}}' "$img")"
  check "$p image user is $want_user (got '$user')" test "$user" = "$want_user"
  check "$p image entrypoint is [/$entry]" test "$(podman image inspect --format '{{.Config.Entrypoint}}' "$img")" = "[/$entry]"
  labels="$(podman image inspect --format '{{json .Labels}}' "$img")"
  label() { jq -r --arg k "org.opencontainers.image.$1" '.[$k] // ""' <<<"$labels"; }
  check "$p label version = $VERSION" test "$(label version)" = "$VERSION"
  check "$p label revision = git HEAD" test "$(label revision)" = "$(git -C "$ROOT" rev-parse HEAD)"
  if [[ ${#tools[@]} -eq 0 ]]; then check "$p label licenses = Apache-2.0" test "$(label licenses)" = Apache-2.0
  else check "$p label licenses = Apache-2.0 AND GPL-2.0-only (nftables)" test "$(label licenses)" = "Apache-2.0 AND GPL-2.0-only"; fi
  check "$p label source set ($(label source))" test -n "$(label source)"
  # The file list: exactly the binary, its /usr/bin link, the tools, the libraries ldd names
  # for the binary and the tools, the tools' packages' copyright files, the user database,
  # nsswitch.conf, /tmp and the home directory (plus the directories above them).
  ctr="$(podman create "$img")"
  podman export "$ctr" | tar -t | sed 's#/$##' | sort >"$SCRATCH/$p.files"
  podman rm "$ctr" >/dev/null
  {
    with_parents etc/group etc/nsswitch.conf etc/passwd tmp usr/bin "$entry" ${link:+"$link"} ${home:+"$home"} "${tools[@]}"
    for lib in $(ldd_libs "$bin"; for t in "${tools[@]}"; do ldd_libs "$t"; done); do
      with_parents "$lib"
      if [[ ${#tools[@]} -gt 0 ]]; then
        pkg="$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(sed 's#^/lib/#/usr/lib/#; t; s#^/usr/lib/#/lib/#' <<<"$lib")" 2>/dev/null)"
        with_parents "usr/share/doc/${pkg%%:*}/copyright"
      fi
    done
    for t in "${tools[@]}"; do pkg="$(dpkg -S "$t" | cut -d: -f1)"; with_parents "usr/share/doc/$pkg/copyright"; done
  } | sort -u >"$SCRATCH/$p.expected"
  # podman export adds the runtime's mount points (dev, proc, sys, etc/hosts, ...) when present.
  grep -vxE 'dev|proc|sys|run|etc/hosts|etc/hostname|etc/resolv.conf|\.' "$SCRATCH/$p.files" >"$SCRATCH/$p.files.clean"
  if diff "$SCRATCH/$p.expected" "$SCRATCH/$p.files.clean" >"$SCRATCH/$p.diff"; then
    pass "$p image holds exactly: $(grep -c . "$SCRATCH/$p.expected") paths (binary${link:+, /$link}${tools[*]:+, ${tools[*]}}, the ldd libraries, passwd/group/nsswitch, /tmp${home:+, /$home})"
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
  out="$(podman run --rm --network none --entrypoint "/${link:-$entry}" "$img" --help 2>&1 | head -n 3)"
  check "$p: /${link:-$entry} runs (--help)" test -n "$out"
  for t in "${tools[@]}"; do
    out="$(podman run --rm --network none --entrypoint "$t" "$img" --version 2>&1)"
    check "$p: $t runs in the image ($out)" eval '[[ "$out" == "$("$t" --version 2>&1)" ]]'
  done
}
step_begin "image checks"
image_checks server "$SERVER_IMAGE" proxy-server "$SERVER_BINARY"
if [[ $HAVE_AGENT -eq 1 ]]; then image_checks agent "$AGENT_IMAGE" proxy-agent "$AGENT_BINARY"; fi
# root: kubeadm's DaemonSet runs it privileged with no user of its own (oci/build.sh says why).
if [[ $HAVE_KUBE_PROXY -eq 1 ]]; then
  image_checks kube-proxy "$KUBE_PROXY_IMAGE" usr/local/bin/kube-proxy "$KUBE_PROXY_BINARY" 0:0 - - /usr/sbin/nft
  check "kube-proxy label names the nftables Debian package ($(podman image inspect --format '{{index .Labels "com.example.kube-traffic.nft.debian-package"}}' "$KUBE_PROXY_IMAGE"))" \
    test "$(podman image inspect --format '{{index .Labels "com.example.kube-traffic.nft.debian-package"}}' "$KUBE_PROXY_IMAGE")" = "nftables $(dpkg-query -W -f='${Version}' nftables)"
fi
podman images --filter reference='localhost/konnectivity-*' --filter reference='localhost/kube-proxy' | sed 's/^/      | /'
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
    upstream_test_client --mode=grpc --proxy-host= --proxy-port=0 --proxy-uds="$UDS" \
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
