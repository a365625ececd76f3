# shellcheck shell=bash
# packaging/nspawn-kube-proxy-test.sh, sourced: long-lived connections through the Service from here on; reloads (the file watcher, systemctl reload, a broken configuration).
# Shares the entry script's variables and helpers; runs in its shell, in this order.

reloads() { # <trigger>: how many "configuration reloaded" entries name it
  c journalctl -u "$UNIT" -o json --no-pager 2>/dev/null |
    jq -s --arg t "$1" '[.[] | select(.MESSAGE == "configuration reloaded" and .TRIGGER == $t)] | length'
}
metrics_on() { [[ "$(cn curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://$1/metrics")" == 200 ]]; }   # <ip:port>

# Long-lived connections through the Service, open across the reloads, the restarts and the
# upgrade below (restart.sh collects them): each echoes a line every 100 ms; none may break.
HOLD_STOP="$SCRATCH/traffic/hold.stop"
HOLD_COUNT=4
step_begin "$HOLD_COUNT long-lived TCP connections through $SVC (an echo every 100 ms each, until the upgrade is done)"
client hold "$HOLD_COUNT" "$SVC" "$HOLD_STOP" >"$SCRATCH/traffic/hold.out" 2>&1 &
HOLD_PID=$!; HOST_PIDS+=("$HOLD_PID"); T_HOLD=$(now)
check "$HOLD_COUNT connections open and echoing" wait_for 10 grep -qx open "$SCRATCH/traffic/hold.out"
step_end

step_begin "reload: saving kube-proxy.toml reloads it; systemctl reload (--check-config, SIGHUP); a broken file changes nothing"
PID_BEFORE="$(main_pid)"
check "metrics on 127.0.0.1:10249 before" metrics_on 127.0.0.1:10249
# A setting the reference flags do not give, so the file's value is the one in force.
# An editor's save: a new file renamed over the old one.
{ cat "$CROOT/etc/kubernetes/kube-proxy.toml"; echo 'metrics_bind_address = "127.0.0.1:10251"'; } >"$CROOT/etc/kubernetes/.kube-proxy.toml.new"
mv "$CROOT/etc/kubernetes/.kube-proxy.toml.new" "$CROOT/etc/kubernetes/kube-proxy.toml"
check "the file watcher reloaded it: metrics move to 127.0.0.1:10251" wait_for 10 metrics_on 127.0.0.1:10251
check "journal: 'configuration reloaded' TRIGGER='file change'" test "$(reloads "file change")" -ge 1
R0="$(reloads SIGHUP)"
OUT="$(c timeout 60 systemctl reload "$UNIT" 2>&1)"; RC=$?
[[ -n "$OUT" ]] && echo "$OUT" | sed 's/^/      | /'
check "systemctl reload exits 0" test $RC -eq 0
check "journal: one more 'configuration reloaded' TRIGGER=SIGHUP ($R0 before)" wait_for 5 eval '[[ "$(reloads SIGHUP)" -eq $((R0 + 1)) ]]'
check "same MainPID ($PID_BEFORE), active/running" eval 'same_pid "$PID_BEFORE" && active_running'
check "the Service still answers" answers
cp "$CROOT/etc/kubernetes/kube-proxy.toml" "$SCRATCH/kube-proxy.toml.good"
echo 'proxy_mode = 42' >>"$CROOT/etc/kubernetes/kube-proxy.toml"
check "journal: the watcher's reload of the broken file failed ('RELOAD FAILED'), the running configuration kept" \
  wait_for 10 eval '[[ "$(journal | grep -c "RELOAD FAILED")" -ge 1 ]]'
OUT="$(c timeout 60 systemctl reload "$UNIT" 2>&1)"; RC=$?
check "systemctl reload of a broken file fails (--check-config), exit $RC" test $RC -ne 0
check "still the same MainPID, active/running, the Service answers" eval 'same_pid "$PID_BEFORE" && active_running && answers'
cp "$SCRATCH/kube-proxy.toml.good" "$CROOT/etc/kubernetes/kube-proxy.toml"
check "the file fixed: systemctl reload exits 0 again" c timeout 60 systemctl reload "$UNIT"
step_end
