# shellcheck shell=bash
# packaging/nspawn-test.sh, sourced: install of both packages, their users, files and hardening; certificates and test configuration; the first start.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# ------------------------------------------------------------------------------ install -----
mkdir -p "$CROOT/var/tmp/kt"
cp "$DEB_N" "$CROOT/var/tmp/kt/n.deb"; cp "$DEB_N1" "$CROOT/var/tmp/kt/n1.deb"
cp "$ADEB_N" "$CROOT/var/tmp/kt/agent-n.deb"; cp "$ADEB_N1" "$CROOT/var/tmp/kt/agent-n1.deb"

step_begin "dpkg -i both packages (server $DEB_N_VER, agent $ADEB_N_VER)"
OUT="$(c dpkg -i /var/tmp/kt/n.deb /var/tmp/kt/agent-n.deb </dev/null 2>&1)"; RC=$?
echo "$OUT" | sed 's/^/      | /'
check "dpkg -i exits 0" test $RC -eq 0
check "postinst says: enabled, not started" grep -q '^konnectivity-server: installed and enabled, not started' <<<"$OUT"
check "agent postinst says: enabled, not started" grep -q '^konnectivity-agent: installed and enabled, not started' <<<"$OUT"
step_end

step_begin "user, files, modes, enablement"
check "user konnectivity exists (system uid, nologin, home /var/lib/konnectivity-server)" user_ok
check "group konnectivity exists" eval 'c getent group konnectivity >/dev/null'
check "/usr/bin/konnectivity-server root:root 755" file_is /usr/bin/konnectivity-server "root:root 755 regular file"
check "/etc/konnectivity/server.toml root:konnectivity 640" file_is /etc/konnectivity/server.toml "root:konnectivity 640 regular file"
check "/etc/konnectivity/pki root:konnectivity 750" file_is /etc/konnectivity/pki "root:konnectivity 750 directory"
check "/etc/default/konnectivity-server root:root 644" file_is /etc/default/konnectivity-server "root:root 644 regular file"
check "/usr/lib/sysusers.d/konnectivity-server.conf present" c test -f /usr/lib/sysusers.d/konnectivity-server.conf
check "unit enabled after install" test "$(c systemctl is-enabled "$UNIT" 2>&1)" = enabled
check "socket unit enabled after install" test "$(c systemctl is-enabled konnectivity-server.socket 2>&1)" = enabled
check "unit NOT started by install" test "$(c systemctl is-active "$UNIT" 2>&1)" = inactive
check "agent: user konnectivity-agent exists (system uid, nologin, home /var/lib/konnectivity-agent)" \
  user_ok konnectivity-agent /var/lib/konnectivity-agent
check "agent: user konnectivity-agent is not in group konnectivity (no access to the server's keys)" \
  eval '! c id -nG konnectivity-agent | tr " " "\\n" | grep -qx konnectivity'
check "/usr/bin/konnectivity-agent root:root 755" file_is /usr/bin/konnectivity-agent "root:root 755 regular file"
check "/etc/konnectivity/agent.toml root:konnectivity-agent 640" file_is /etc/konnectivity/agent.toml "root:konnectivity-agent 640 regular file"
check "/etc/konnectivity/agent-pki root:konnectivity-agent 750" file_is /etc/konnectivity/agent-pki "root:konnectivity-agent 750 directory"
check "/etc/default/konnectivity-agent root:root 644" file_is /etc/default/konnectivity-agent "root:root 644 regular file"
check "/usr/lib/sysusers.d/konnectivity-agent.conf present" c test -f /usr/lib/sysusers.d/konnectivity-agent.conf
check "/usr/share/doc/konnectivity-agent/{README.md,changelog.gz,agent.toml} present" \
  c test -f /usr/share/doc/konnectivity-agent/README.md -a -f /usr/share/doc/konnectivity-agent/changelog.gz \
  -a -f /usr/share/doc/konnectivity-agent/agent.toml
for p in konnectivity-server konnectivity-agent; do
  check "$p: man pages $p(8) and $p.toml(5), bash/zsh/fish completions installed" \
    c test -f "/usr/share/man/man8/$p.8.gz" -a -f "/usr/share/man/man5/$p.toml.5.gz" \
    -a -f "/usr/share/bash-completion/completions/$p" -a -f "/usr/share/zsh/vendor-completions/_$p" \
    -a -f "/usr/share/fish/vendor_completions.d/$p.fish"
done
check "agent unit enabled after install" test "$(c systemctl is-enabled "$AUNIT" 2>&1)" = enabled
check "agent unit NOT started by install" test "$(c systemctl is-active "$AUNIT" 2>&1)" = inactive
# Enabled before its certificates exist: a start (as at boot) is skipped, not failed.
c timeout 30 systemctl start "$AUNIT" >/dev/null 2>&1
check "agent without certificates: start skipped by ConditionPathExists (inactive, not failed)" \
  test "$(ashow ActiveState)/$(ashow ConditionResult)" = inactive/no
# The same for the server and its socket unit (as at boot: the socket first, then the service).
c timeout 30 systemctl start konnectivity-server.socket "$UNIT" >/dev/null 2>&1
check "server without certificates: start skipped by ConditionPathExists (inactive, not failed)" \
  test "$(show ActiveState)/$(show ConditionResult)" = inactive/no
check "socket unit without certificates: skipped by ConditionPathExists (inactive, not failed, not listening)" \
  test "$(show ActiveState konnectivity-server.socket)/$(show ConditionResult konnectivity-server.socket)" = inactive/no
step_end

step_begin "systemd-analyze verify + security"
VERIFY="$(c systemd-analyze verify "$UNIT" 2>&1)"; RC=$?
[[ -n "$VERIFY" ]] && echo "$VERIFY" | sed 's/^/      | /'
check "systemd-analyze verify $UNIT: exit 0, no warnings" test $RC -eq 0 -a -z "$(grep -i konnectivity <<<"$VERIFY")"
SECURITY="$(c systemd-analyze security "$UNIT" --no-pager 2>&1 | tail -n 1)"
log "      systemd-analyze security: $SECURITY"
VERIFY="$(c systemd-analyze verify "$AUNIT" 2>&1)"; RC=$?
[[ -n "$VERIFY" ]] && echo "$VERIFY" | sed 's/^/      | /'
check "systemd-analyze verify $AUNIT: exit 0, no warnings" test $RC -eq 0 -a -z "$(grep -i konnectivity <<<"$VERIFY")"
ASECURITY="$(c systemd-analyze security "$AUNIT" --no-pager 2>&1 | tail -n 1)"
log "      systemd-analyze security: $ASECURITY"
score() { sed -n 's/.*exposure level for [^:]*: *\([0-9.]*\).*/\1/p' <<<"$1"; }
check "agent unit's exposure score equals the server's ($(score "$ASECURITY") vs $(score "$SECURITY"))" \
  test -n "$(score "$SECURITY")" -a "$(score "$ASECURITY")" = "$(score "$SECURITY")"
step_end

# ------------------------------------------------------------------------------ certificates + test config
step_begin "test certificates (openssl on the host) and test arguments"
gen_certs() {
  local d="$SCRATCH/certs"
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 2 -subj "/CN=nspawn-test-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null || return 1
  local serial ext
  for serial in 1001 1002; do
    openssl req -newkey rsa:2048 -nodes -subj "/CN=konnectivity-server" \
      -keyout "$d/cluster-$serial.key" -out "$d/cluster-$serial.csr" 2>/dev/null || return 1
    ext="$d/server.ext"
    printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "extendedKeyUsage=serverAuth" \
      "keyUsage=critical,digitalSignature,keyEncipherment" >"$ext"
    openssl x509 -req -in "$d/cluster-$serial.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
      -set_serial "0x$serial" -days 2 -sha256 -extfile "$ext" -out "$d/cluster-$serial.crt" 2>/dev/null || return 1
  done
  openssl req -newkey rsa:2048 -nodes -subj "/CN=system:konnectivity-agent" \
    -keyout "$d/agent.key" -out "$d/agent.csr" 2>/dev/null || return 1
  printf '%s\n' "extendedKeyUsage=clientAuth" "keyUsage=critical,digitalSignature,keyEncipherment" >"$d/agent.ext"
  openssl x509 -req -in "$d/agent.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -set_serial 0x2001 \
    -days 2 -sha256 -extfile "$d/agent.ext" -out "$d/agent.crt" 2>/dev/null
}
install_pki() { # <serial>: cluster.crt/key (+ ca.crt) as root:konnectivity 0640
  local s="$1" P="$CROOT/etc/konnectivity/pki"
  cp "$SCRATCH/certs/cluster-$s.crt" "$P/cluster.crt.new" && cp "$SCRATCH/certs/cluster-$s.key" "$P/cluster.key.new" \
    && cp "$SCRATCH/certs/ca.crt" "$P/ca.crt" || return 1
  c chown root:konnectivity /etc/konnectivity/pki/cluster.crt.new /etc/konnectivity/pki/cluster.key.new /etc/konnectivity/pki/ca.crt
  c chmod 0640 /etc/konnectivity/pki/cluster.crt.new /etc/konnectivity/pki/cluster.key.new /etc/konnectivity/pki/ca.crt
  # Key first, then cert (each rename is atomic), as an operator's rotation script would.
  mv "$P/cluster.key.new" "$P/cluster.key" && mv "$P/cluster.crt.new" "$P/cluster.crt"
}
install_agent_pki() { # the agent's client certificate, key and CA, root:konnectivity-agent 0640
  local P="$CROOT/etc/konnectivity/agent-pki" f
  for f in ca.crt agent.crt agent.key; do
    cp "$SCRATCH/certs/$f" "$P/$f" && c chown root:konnectivity-agent "/etc/konnectivity/agent-pki/$f" \
      && c chmod 0640 "/etc/konnectivity/agent-pki/$f" || return 1
  done
}
check "generate CA, server (SAN 127.0.0.1/localhost, serials 1001/1002) and agent certificates" gen_certs
check "install server certificate (serial 1001) root:konnectivity 0640" install_pki 1001
check "install the agent's certificate, key and CA root:konnectivity-agent 0640 in /etc/konnectivity/agent-pki" install_agent_pki
# The test's ports etc. on the command line (flags override the config file); this also makes
# /etc/default/konnectivity-server an admin-edited conffile for the upgrade test.
# destHost routes a tunnel to localhost to our agent (host=localhost), one to 127.0.0.1 to the
# upstream agent (ipv4=127.0.0.1); default picks any agent when none matches.
# --deny-destinations= (an empty list): the packaged server.toml denies loopback, and the
# tunnel checks below reach destinations on 127.0.0.1 and localhost.
ARGS="--config /etc/konnectivity/server.toml --agent-port=$AGENT_PORT --agent-bind-address=127.0.0.1 --health-port=$HEALTH_PORT --health-bind-address=127.0.0.1 --admin-port=$ADMIN_PORT --admin-bind-address=127.0.0.1 --graceful-shutdown-timeout=5s --server-id=nspawn-test --proxy-strategies=destHost,default --deny-destinations="
sed -i "s|^KONNECTIVITY_SERVER_ARGS=.*|KONNECTIVITY_SERVER_ARGS=\"$ARGS\"|" "$CROOT/etc/default/konnectivity-server"
check "test arguments in /etc/default/konnectivity-server" grep -q "agent-port=$AGENT_PORT" "$CROOT/etc/default/konnectivity-server"
# Our agent: the packaged agent.toml (its certificate paths, graceful_shutdown_timeout = 60s)
# with the test's server and ports as flags, and its id from the environment layer.
AARGS="--config /etc/konnectivity/agent.toml --proxy-server-host=127.0.0.1 --proxy-server-port=$AGENT_PORT --agent-identifiers=host=localhost --health-server-host=127.0.0.1 --health-server-port=$RA_HEALTH_PORT --admin-bind-address=127.0.0.1 --admin-server-port=$RA_ADMIN_PORT"
sed -i "s|^KONNECTIVITY_AGENT_ARGS=.*|KONNECTIVITY_AGENT_ARGS=\"$AARGS\"\nPROXY_AGENT_ID=nspawn-rust-agent|" "$CROOT/etc/default/konnectivity-agent"
check "test arguments in /etc/default/konnectivity-agent" grep -q "proxy-server-port=$AGENT_PORT" "$CROOT/etc/default/konnectivity-agent"
step_end

# ------------------------------------------------------------------------------ start -------
step_begin "systemctl start, the server then our agent (Type=notify: returns after READY=1)"
OUT="$(c timeout 90 systemctl start "$UNIT" 2>&1)"; RC=$?
[[ -n "$OUT" ]] && echo "$OUT" | sed 's/^/      | /'
check "systemctl start exits 0" test $RC -eq 0
check "active/running after start (READY=1 received)" active_running
log "      StatusText=$(show StatusText)  MainPID=$(main_pid)  NRestarts=$(show NRestarts)"
check "health /healthz 200" wait_for 10 code_is 200 "http://127.0.0.1:$HEALTH_PORT/healthz"
T_ASTART=$(now)
OUT="$(c timeout 90 systemctl start "$AUNIT" 2>&1)"; RC=$?
ASTART_S=$(dur "$T_ASTART")
[[ -n "$OUT" ]] && echo "$OUT" | sed 's/^/      | /'
check "agent: systemctl start exits 0 (${ASTART_S}s; READY=1 once its ports listen)" test $RC -eq 0
check "agent: active/running after start" a_running
log "      agent StatusText=$(ashow StatusText)  MainPID=$(main_pid "$AUNIT")"
check "agent: connected to our server (agent /readyz 200)" wait_for 10 code_is 200 "http://127.0.0.1:$RA_HEALTH_PORT/readyz"
log "      agent connected $(dur "$T_ASTART")s after systemctl start"
agent_listed() { # [draining]: the server lists our agent (by the id from PROXY_AGENT_ID), with that draining flag
  curl -s --max-time 3 "http://127.0.0.1:$ADMIN_PORT/agents" |
    jq -e --argjson d "${1:-false}" 'any(.[]; .agent_id == "nspawn-rust-agent" and .draining == $d)' >/dev/null 2>&1
}
check "server's /agents lists nspawn-rust-agent (PROXY_AGENT_ID from /etc/default/konnectivity-agent)" wait_for 5 agent_listed
# STATUS= says "connected to 1 servers, ..." once connected: watched in the background (the
# steps go on meanwhile) and checked after the reload step.
( end=$(( $(date +%s) + 30 ))
  until a_connected; do [[ $(date +%s) -ge $end ]] && exit 1; sleep 0.2; done
  dur "$T_ASTART" >"$SCRATCH/host/agent-status-connected" ) &
ASTATUS_PID=$!; HOST_PIDS+=("$ASTATUS_PID")
step_end

step_begin "UDS in RuntimeDirectory"
check "/run/konnectivity-server konnectivity:konnectivity 750" file_is /run/konnectivity-server "konnectivity:konnectivity 750 directory"
check "socket konnectivity:konnectivity 770" file_is /run/konnectivity-server/konnectivity-server.socket "konnectivity:konnectivity 770 socket"
# kube-apiserver's access path: a member of group konnectivity can reach and write the socket
# (connect(2) needs search on the directory and write on the socket); others cannot.
c useradd --system --no-create-home --shell /usr/sbin/nologin --groups konnectivity kt-apiserver >/dev/null 2>&1
c useradd --system --no-create-home --shell /usr/sbin/nologin kt-other >/dev/null 2>&1
uds_access() { c runuser -u "$1" -- test -x /run/konnectivity-server -a -w /run/konnectivity-server/konnectivity-server.socket; }
check "a member of group konnectivity can reach the socket" uds_access kt-apiserver
check "a non-member cannot reach the socket" eval '! uds_access kt-other'
step_end
