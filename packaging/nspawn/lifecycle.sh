# shellcheck shell=bash
# packaging/nspawn-test.sh, sourced: journald fields, stop, and the watchdog.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# ------------------------------------------------------------------------------ journal -----
step_begin "journalctl -u $UNIT / -u $AUNIT -o json: structured fields"
JSON="$(jsonl_unit)"
NATIVE="$(jq -c 'select(._TRANSPORT == "journal" and .SYSLOG_IDENTIFIER == "konnectivity-server")' <<<"$JSON" 2>/dev/null)"
log "      entries: $(wc -l <<<"$JSON") total, $(grep -c . <<<"$NATIVE") via the native journal protocol"
FIELDS="$(jq -r 'keys[]' <<<"$NATIVE" 2>/dev/null | grep -v '^_' | grep -v '^__' | sort -u | tr '\n' ' ')"
log "      non-trusted fields seen: $FIELDS"
check "entries logged via the native journal protocol (_TRANSPORT=journal, SYSLOG_IDENTIFIER=konnectivity-server)" test -n "$NATIVE"
structured() { jq -e 'select(.TARGET and .CODE_FILE and .PRIORITY and .MESSAGE)' <<<"${1:-$NATIVE}" >/dev/null 2>&1; }
no_ansi() { [[ "$(jq -r '.MESSAGE // empty' <<<"${1:-$JSON}" 2>/dev/null | grep -c $'\x1b\\[')" == 0 ]]; }
check "structured fields present (TARGET, CODE_FILE, PRIORITY, MESSAGE)" structured
check "no ANSI escapes in messages" no_ansi
AJSON="$(jsonl_unit "$AUNIT")"
ANATIVE="$(jq -c 'select(._TRANSPORT == "journal" and .SYSLOG_IDENTIFIER == "konnectivity-agent")' <<<"$AJSON" 2>/dev/null)"
log "      agent entries: $(wc -l <<<"$AJSON") total, $(grep -c . <<<"$ANATIVE") via the native journal protocol"
log "      agent non-trusted fields seen: $(jq -r 'keys[]' <<<"$ANATIVE" 2>/dev/null | grep -v '^_' | sort -u | tr '\n' ' ')"
a_logged() { # <jq condition>: some entry meets it (slurped: jq 1.6's -e looks at the last entry only)
  jq -s -e "any(.[]; $1)" <<<"$ANATIVE" >/dev/null 2>&1
}
check "agent: entries logged via the native journal protocol (SYSLOG_IDENTIFIER=konnectivity-agent)" test -n "$ANATIVE"
check "agent: structured fields present (TARGET, CODE_FILE, PRIORITY, MESSAGE)" a_logged '.TARGET and .CODE_FILE and .PRIORITY and .MESSAGE'
check "agent: MESSAGE \"successfully connected to new proxy server\" with SERVERID=nspawn-test" \
  a_logged '.MESSAGE == "successfully connected to new proxy server" and .SERVERID == "nspawn-test"'
check "agent: MESSAGE \"Start serving\" with AGENTID=nspawn-rust-agent" \
  a_logged '.MESSAGE == "Start serving" and .AGENTID == "nspawn-rust-agent"'
check "agent: MESSAGE \"configuration reloaded\" (TRIGGER=SIGHUP)" a_logged '.MESSAGE == "configuration reloaded" and .TRIGGER == "SIGHUP"'
check "agent: no ANSI escapes in messages" no_ansi "$AJSON"
step_end

# ------------------------------------------------------------------------------ stop --------
step_begin "systemctl stop (STOPPING=1, drain, exit 0)"
T=$(now)
OUT="$(c timeout 120 systemctl stop "$UNIT" 2>&1)"; RC=$?
STOP_S=$(dur "$T")
check "systemctl stop exits 0 (${STOP_S}s)" test $RC -eq 0
log "      ActiveState=$(show ActiveState) Result=$(show Result) ExecMainCode=$(show ExecMainCode) ExecMainStatus=$(show ExecMainStatus)"
check "inactive, Result=success, ExecMainStatus=0 (clean exit, no SIGKILL)" \
  test "$(show ActiveState)/$(show Result)/$(show ExecMainStatus)" = inactive/success/0
check "RuntimeDirectoryPreserve=yes kept /run/konnectivity-server" c test -d /run/konnectivity-server
check "agent: with its server gone it keeps running and retrying (/readyz not 200)" \
  eval 'wait_for 5 eval "! code_is 200 http://127.0.0.1:$RA_HEALTH_PORT/readyz" && a_running'
step_end

# ------------------------------------------------------------------------------ watchdog ----
step_begin "watchdog, both (runtime drop-ins WatchdogSec=2s: WATCHDOG=1 pings, no watchdog kill)"
for u in "$UNIT" "$AUNIT"; do
  c mkdir -p "/run/systemd/system/$u.d"
  printf '[Service]\nWatchdogSec=2s\n' >"$CROOT/run/systemd/system/$u.d/zz-nspawn-watchdog.conf"
done
c systemctl daemon-reload
c timeout 90 systemctl start "$UNIT" >/dev/null 2>&1
c timeout 90 systemctl restart "$AUNIT" >/dev/null 2>&1
check "started with WatchdogSec=2s" test "$(show WatchdogUSec)" = 2s
check "agent: restarted with WatchdogSec=2s" test "$(ashow WatchdogUSec)" = 2s
PID_BEFORE="$(main_pid)" APID_BEFORE="$(main_pid "$AUNIT")"; sleep 0.5
WD1="$(show WatchdogTimestampMonotonic)" AWD1="$(ashow WatchdogTimestampMonotonic)"
sleep 3.5; WD2="$(show WatchdogTimestampMonotonic)" AWD2="$(ashow WatchdogTimestampMonotonic)"
check "WATCHDOG=1 received (WatchdogTimestamp advanced: $WD1 -> $WD2)" test "${WD2:-0}" -gt "${WD1:-0}"
check "no watchdog kill after 4 s (same MainPID, NRestarts=0, active/running)" \
  test "$(main_pid)/$(show NRestarts)/$(show ActiveState)" = "$PID_BEFORE/0/active"
check "agent: WATCHDOG=1 received (WatchdogTimestamp advanced: $AWD1 -> $AWD2)" test "${AWD2:-0}" -gt "${AWD1:-0}"
check "agent: no watchdog kill after 4 s (same MainPID, NRestarts=0, active/running)" \
  test "$(main_pid "$AUNIT")/$(ashow NRestarts)/$(ashow ActiveState)" = "$APID_BEFORE/0/active"
# The heartbeat refreshes STATUS= with each ping (every second here).
check "agent: STATUS= refreshed with the pings: 'connected to 1 servers, 0 tunnels' ($(ashow StatusText))" \
  a_status_is 'connected to 1 servers, 0 tunnels'
for u in "$UNIT" "$AUNIT"; do rm -f "$CROOT/run/systemd/system/$u.d/zz-nspawn-watchdog.conf"; done
c systemctl daemon-reload
c timeout 120 systemctl stop "$UNIT" >/dev/null 2>&1
step_end
