# shellcheck shell=bash
# packaging/nspawn-kube-proxy-test.sh, sourced: journald fields, the watchdog, stop (the rules stay), remove and purge, the checks' own negative control, the host untouched.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

step_begin "journalctl -u $UNIT -o json: structured fields"
JSON="$(c journalctl -u "$UNIT" -o json --no-pager 2>/dev/null)"
NATIVE="$(jq -c 'select(._TRANSPORT == "journal" and .SYSLOG_IDENTIFIER == "kube-proxy")' <<<"$JSON" 2>/dev/null)"
log "      entries: $(wc -l <<<"$JSON") total, $(grep -c . <<<"$NATIVE") via the native journal protocol"
log "      non-trusted fields seen: $(jq -r 'keys[]' <<<"$NATIVE" 2>/dev/null | grep -v '^_' | sort -u | tr '\n' ' ')"
kp_logged() { jq -s -e "any(.[]; $1)" <<<"$NATIVE" >/dev/null 2>&1; }   # <jq condition>
check "entries logged via the native journal protocol (_TRANSPORT=journal, SYSLOG_IDENTIFIER=kube-proxy)" test -n "$NATIVE"
check "structured fields present (TARGET, CODE_FILE, CODE_LINE, PRIORITY, MESSAGE)" \
  kp_logged '.TARGET and .CODE_FILE and .CODE_LINE and .PRIORITY and .MESSAGE'
check "MESSAGE 'rules programmed; ready' with its STATUS field" kp_logged '.MESSAGE == "rules programmed; ready" and .STATUS'
check "MESSAGE 'configuration reloaded' with TRIGGER=SIGHUP and RELOAD_GENERATION" \
  kp_logged '.MESSAGE == "configuration reloaded" and .TRIGGER == "SIGHUP" and .RELOAD_GENERATION'
check "warnings at PRIORITY 4 (the ipvs mode's)" kp_logged '.PRIORITY == "4" and (.MESSAGE | test("served by nftables rules"))'
check "no ANSI escapes in messages" eval '[[ "$(jq -r ".MESSAGE // empty" <<<"$JSON" | grep -c $'"'"'\x1b\\['"'"')" == 0 ]]'
step_end

step_begin "watchdog (runtime drop-in WatchdogSec=2s: WATCHDOG=1 pings while syncs are healthy, no kill)"
# Transactions go through nft -f here (they default to netlink), so that a failing nft below
# makes the syncs fail.
drop_in zz-watchdog 'WatchdogSec=2s' 'Environment=KUBE_PROXY_NFT_APPLIER=nft'
restart
check "restarted with WatchdogSec=2s" test "$(show WatchdogUSec)" = 2s
PID_BEFORE="$(main_pid)" NR_BEFORE="$(show NRestarts)"; sleep 0.5
WD1="$(show WatchdogTimestampMonotonic)"; sleep 3.5; WD2="$(show WatchdogTimestampMonotonic)"
check "WATCHDOG=1 received (WatchdogTimestamp advanced: $WD1 -> $WD2)" test "${WD2:-0}" -gt "${WD1:-0}"
check "no watchdog kill after 4 s (same MainPID, NRestarts $NR_BEFORE, active/running)" \
  test "$(main_pid)/$(show NRestarts)/$(show ActiveState)" = "$PID_BEFORE/$NR_BEFORE/active"
check "STATUS= refreshed with the pings (StatusText: $(show StatusText))" eval '[[ "$(show StatusText)" == *"service ports"* ]]'
# Pings stop once a requested sync has waited 2 x the sync period (10 s with the reference
# flags): nft is made to fail, a new Service asks for a sync, and systemd's watchdog must kill
# and restart the process. The rules in the kernel serve meanwhile.
dial_start watchdog
c mv /usr/sbin/nft /usr/sbin/nft.real
printf '#!/bin/sh\nexit 1\n' >"$CROOT/usr/sbin/nft"; chmod 0755 "$CROOT/usr/sbin/nft"
PID_BEFORE="$(main_pid)" NR_BEFORE="$(show NRestarts)"
kp_service kp echo2 10.96.0.81 80 "$POD_PORT"
check "with every nft failing, the syncs stop being healthy and systemd's watchdog kills it (journal: Watchdog timeout)" \
  wait_for 40 eval '[[ "$(c journalctl -u "$UNIT" --no-pager -o cat | grep -c "Watchdog timeout")" -ge 1 ]]'
c mv /usr/sbin/nft.real /usr/sbin/nft
check "nft working again: restarted (NRestarts $NR_BEFORE -> more, a new MainPID), active/running" \
  wait_for 40 eval '[[ "$(show NRestarts)" -gt "$NR_BEFORE" ]] && ! same_pid "$PID_BEFORE" && active_running'
dial_end "while its syncs failed and the watchdog restarted it"
drop_in_remove zz-watchdog
restart
step_end

step_begin "systemctl stop: exit 0, the rules stay in the kernel and keep serving"
T=$(now)
OUT="$(c timeout 60 systemctl stop "$UNIT" 2>&1)"; RC=$?
STOP_S=$(dur "$T")
check "systemctl stop exits 0 (${STOP_S}s)" test $RC -eq 0
check "inactive, Result=success, ExecMainStatus=0 (a clean exit)" \
  test "$(show ActiveState)/$(show Result)/$(show ExecMainStatus)" = inactive/success/0
check "the table and the Service's rules are still in the kernel" table_has_service
check "the Service answers with no kube-proxy running" answers
step_end

step_begin "dpkg -r, then dpkg -P"
c timeout 150 systemctl start "$UNIT" >/dev/null 2>&1
OUT="$(c timeout 120 dpkg -r kube-proxy </dev/null 2>&1)"; RC=$?
echo "$OUT" | sed 's/^/      | /'
check "dpkg -r exits 0" test $RC -eq 0
check "service stopped by remove" test "$(c systemctl is-active "$UNIT" 2>&1)" != active
check "binary removed, config kept" eval 'absent /usr/bin/kube-proxy && [[ -f "$CROOT/etc/kubernetes/kube-proxy.toml" ]]'
check "the rules stay after the removal (kube-proxy --cleanup is the way to remove them)" table_has_service
OUT="$(c timeout 120 dpkg -P kube-proxy </dev/null 2>&1)"; RC=$?
check "dpkg -P exits 0" test $RC -eq 0
check "purge removed /etc/kubernetes/kube-proxy.toml and /etc/default/kube-proxy" \
  eval 'absent /etc/kubernetes/kube-proxy.toml && absent /etc/default/kube-proxy'
check "purge removed the enablement symlink" absent "/etc/systemd/system/multi-user.target.wants/$UNIT"
check "the admin's kubeconfig kept (and so /etc/kubernetes)" test -f "$CROOT/etc/kubernetes/kube-proxy.kubeconfig"
step_end

# The checks above can fail: with the rules and the connection-tracking entries gone, a
# long-lived connection breaks and the Service stops answering, and both are seen.
step_begin "negative control: without the rules and conntrack entries, the same checks fail"
NEG_STOP="$SCRATCH/traffic/neg.stop"
client hold 1 "$SVC" "$NEG_STOP" >"$SCRATCH/traffic/neg.out" 2>&1 & NEG_PID=$!; HOST_PIDS+=("$NEG_PID")
check "a long-lived connection open (rules still in place)" wait_for 10 grep -qx open "$SCRATCH/traffic/neg.out"
cn nft delete table ip kube-proxy; cn nft delete table ip6 kube-proxy
cn conntrack -F >/dev/null 2>&1
sleep 3; touch "$NEG_STOP"; wait "$NEG_PID"
check "the connection is reported broken ($(grep '^{' "$SCRATCH/traffic/neg.out" | jq -c .broken 2>/dev/null))" \
  test "$(grep '^{' "$SCRATCH/traffic/neg.out" | jq '.broken | length' 2>/dev/null)" = 1
check "the Service no longer answers" eval '! answers'
step_end

step_begin "the host's own network namespace"
if [[ $HOST_TABLE_BEFORE -eq 1 ]]; then
  fail "the host's namespace had a kube-proxy table before this test: the check below proves nothing"
fi
check "the host's namespace has no kube-proxy table" eval '! host_has_kube_proxy_table'
if [[ "$(nft list ruleset 2>/dev/null | sha256sum)" == "$HOST_RULESET_BEFORE" ]]; then
  RESULTS+=("INFO  the host's nftables ruleset is as it was before the test")
else
  RESULTS+=("INFO  the host's nftables ruleset changed during the test (another program on this host?)")
fi
step_end
