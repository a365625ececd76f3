# shellcheck shell=bash
# packaging/nspawn-test.sh, sourced: reloads of both services, by signal, by watched files and through systemctl.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# ------------------------------------------------------------------------------ reload ------
step_begin "systemctl reload of both while tunnels run (server: new certificate), then systemctl stop of our agent while its tunnel runs (drain)"
PID_BEFORE="$(main_pid)" APID_BEFORE="$(main_pid "$AUNIT")"
check "fresh handshake presents serial 1001 before" serial_is 1001
if [[ $INTEROP -eq 1 ]]; then
  # Tunnels that are open across the reloads: http-test-server's /sleep answers after 10 s.
  # One through the upstream agent, one through ours, side by side.
  long_tunnel_open long
  T_LONG_RA=$(now); tunnel_get sleep long-ours localhost & LONG_RA_PID=$!
  check "long tunnel through our agent established too (established_connections 2)" wait_for 8 established 2
fi
# How long after its start STATUS= first said "connected" (the background watcher; the
# reload below sends STATUS= itself, so this is read before it).
if [[ -s "$SCRATCH/host/agent-status-connected" ]]; then
  ASTATUS_S="$(cat "$SCRATCH/host/agent-status-connected")"
  RESULTS+=("INFO  agent STATUS= said 'connected to 1 servers, ...' ${ASTATUS_S}s after systemctl start")
else
  ASTATUS_S="not yet ($(dur "$T_ASTART")s after systemctl start; StatusText: $(ashow StatusText))"
  # The agent sends STATUS= when a server connects: by now it must have said so.
  check "agent: STATUS= says 'connected' before its first reload ($ASTATUS_S)" false
fi
log "      agent STATUS= connected: $ASTATUS_S"
install_pki 1002
OUT="$(c timeout 60 systemctl reload "$UNIT" 2>&1)"; RC=$?
[[ -n "$OUT" ]] && echo "$OUT" | sed 's/^/      | /'
check "systemctl reload exits 0" test $RC -eq 0
check "same MainPID ($PID_BEFORE) after reload" same_pid "$PID_BEFORE"
check "active/running after reload" active_running
OUT="$(c timeout 60 systemctl reload "$AUNIT" 2>&1)"; RC=$?
[[ -n "$OUT" ]] && echo "$OUT" | sed 's/^/      | /'
check "agent: systemctl reload exits 0" test $RC -eq 0
check "agent: same MainPID ($APID_BEFORE) after reload" a_same_pid "$APID_BEFORE"
check "agent: active/running after reload" a_running
if [[ $INTEROP -eq 1 ]]; then
  check "agent: StatusText after reload is 'connected to 1 servers, 1 tunnels' (was: $(ashow StatusText))" \
    a_status_is 'connected to 1 servers, 1 tunnels'
else
  check "agent: StatusText after reload is 'connected to 1 servers, 0 tunnels' (was: $(ashow StatusText))" \
    a_status_is 'connected to 1 servers, 0 tunnels'
fi
check "fresh handshake presents the new serial 1002" wait_for 10 serial_is 1002
# Our agent's stop while its tunnel is open: SIGTERM -> DRAIN to the server, the tunnel runs
# on, the agent exits 0 when it has ended (graceful_shutdown_timeout = 60s in agent.toml).
T_ASTOP=$(now)
RA_TUNNEL_OPEN=0
[[ $INTEROP -eq 1 ]] && kill -0 "$LONG_RA_PID" 2>/dev/null && RA_TUNNEL_OPEN=1
c timeout 120 systemctl stop "$AUNIT" >"$SCRATCH/host/agent-stop.log" 2>&1 & ASTOP_PID=$!
if [[ $INTEROP -eq 1 ]]; then
  check "agent: its tunnel was still open when systemctl stop began" test $RA_TUNNEL_OPEN -eq 1
  check "agent: DRAIN reached the server (/agents: nspawn-rust-agent draining)" wait_for 5 agent_listed true
  check "agent: StatusText while stopping says 'draining: ...'" wait_for 3 a_status_is 'draining: *'
  log "      agent StatusText while stopping: $(ashow StatusText)"
fi
wait "$ASTOP_PID"; RC=$?
ASTOP_S=$(dur "$T_ASTOP")
check "agent: systemctl stop exits 0 (${ASTOP_S}s)" test $RC -eq 0
log "      agent: ActiveState=$(ashow ActiveState) Result=$(ashow Result) ExecMainCode=$(ashow ExecMainCode) ExecMainStatus=$(ashow ExecMainStatus)"
check "agent: inactive, Result=success, ExecMainStatus=0 (clean exit, no SIGKILL)" \
  test "$(ashow ActiveState)/$(ashow Result)/$(ashow ExecMainStatus)" = inactive/success/0
if [[ $INTEROP -eq 1 ]]; then
  check "agent: the tunnel open across its reload and its stop completed (/sleep, 10 s)" wait "$LONG_RA_PID"
  log "      long tunnel through our agent took $(dur "$T_LONG_RA")s; the agent's stop ${ASTOP_S}s"
  check "agent: it exited once its tunnel had ended, not at graceful_shutdown_timeout (stop ${ASTOP_S}s < 30s)" \
    test "$(echo "$ASTOP_S < 30" | bc)" -eq 1
fi
if [[ $INTEROP -eq 1 ]]; then
  check "tunnel opened before the reload completed after it (/sleep, 10 s)" wait "$LONG_PID"
  log "      long tunnel took $(dur "$T_LONG")s"
  check "agent process still alive (no reconnect)" kill -0 "$AGENT_PID"
  check "server /readyz 200 after reload" code_is 200 "http://127.0.0.1:$HEALTH_PORT/readyz"
  check "new tunnel after reload" tunnel_get success after-reload
fi
c timeout 90 systemctl start "$AUNIT" >/dev/null 2>&1
check "agent: started again and connected (agent /readyz 200)" wait_for 10 code_is 200 "http://127.0.0.1:$RA_HEALTH_PORT/readyz"
step_end

step_begin "broken config: reload fails, service keeps running (both)"
PID_BEFORE="$(main_pid)" APID_BEFORE="$(main_pid "$AUNIT")"
cp -p "$CROOT/etc/konnectivity/server.toml" "$SCRATCH/server.toml.good"
cp -p "$CROOT/etc/konnectivity/agent.toml" "$SCRATCH/agent.toml.good"
printf 'this is = not [valid toml\n' >>"$CROOT/etc/konnectivity/server.toml"
printf 'this is = not [valid toml\n' >>"$CROOT/etc/konnectivity/agent.toml"
OUT="$(c timeout 60 systemctl reload "$UNIT" 2>&1)"; RC=$?
[[ -n "$OUT" ]] && echo "$OUT" | sed 's/^/      | /'
check "systemctl reload with a broken config exits non-zero" test $RC -ne 0
check "same MainPID ($PID_BEFORE)" same_pid "$PID_BEFORE"
check "still active/running" active_running
check "health still 200" code_is 200 "http://127.0.0.1:$HEALTH_PORT/healthz"
OUT="$(c timeout 60 systemctl reload "$AUNIT" 2>&1)"; RC=$?
[[ -n "$OUT" ]] && echo "$OUT" | sed 's/^/      | /'
check "agent: systemctl reload with a broken config exits non-zero" test $RC -ne 0
check "agent: same MainPID ($APID_BEFORE), still active/running" eval 'a_same_pid "$APID_BEFORE" && a_running'
check "agent: /readyz still 200" code_is 200 "http://127.0.0.1:$RA_HEALTH_PORT/readyz"
cp -p "$SCRATCH/server.toml.good" "$CROOT/etc/konnectivity/server.toml"
cp -p "$SCRATCH/agent.toml.good" "$CROOT/etc/konnectivity/agent.toml"
check "reload after restoring the config exits 0" c timeout 60 systemctl reload "$UNIT"
check "agent: reload after restoring the config exits 0" c timeout 60 systemctl reload "$AUNIT"
step_end

step_begin "the shipped example drop-in 10-notify-reload.conf on systemd 252: systemctl reload still signals"
DROPIN="/etc/systemd/system/$UNIT.d/10-notify-reload.conf"
check "install the drop-in from /usr/share/doc/konnectivity-server/examples/" \
  c install -D -m 0644 /usr/share/doc/konnectivity-server/examples/10-notify-reload.conf "$DROPIN"
c systemctl daemon-reload
# The server logs "configuration reloaded" with TRIGGER=SIGHUP once per SIGHUP it acted on.
sighup_reloads() { jsonl_unit | jq -s '[.[] | select(.MESSAGE == "configuration reloaded" and .TRIGGER == "SIGHUP")] | length' 2>/dev/null; }
N0="$(sighup_reloads)" PID_BEFORE="$(main_pid)"
log "      with the drop-in: Type=$(show Type) (252 ignores notify-reload), $N0 SIGHUP reloads so far"
OUT="$(c timeout 60 systemctl reload "$UNIT" 2>&1)"; RC=$?
[[ -n "$OUT" ]] && echo "$OUT" | sed 's/^/      | /'
check "with the drop-in: systemctl reload exits 0" test $RC -eq 0
check "with the drop-in: the server was signalled and reloaded (\"configuration reloaded\", TRIGGER=SIGHUP: $N0 -> $((N0 + 1)))" \
  wait_for 5 eval '[[ "$(sighup_reloads)" == "$((N0 + 1))" ]]'
check "with the drop-in: same MainPID ($PID_BEFORE), active/running" eval 'same_pid "$PID_BEFORE" && active_running'
c rm -f "$DROPIN"; c systemctl daemon-reload
step_end
