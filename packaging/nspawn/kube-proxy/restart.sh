# shellcheck shell=bash
# packaging/nspawn-kube-proxy-test.sh, sourced: restarts and upgrades under traffic (no connection may break), a crash, and which privilege each capability and sandbox line of the unit is for.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# New connections, one every 50 ms, during a step: none may fail.
dial_start() { # <name>
  DIAL_STOP="$SCRATCH/traffic/$1.stop" DIAL_OUT="$SCRATCH/traffic/$1.out"
  client dial "$SVC" "$DIAL_STOP" >"$DIAL_OUT" 2>&1 & DIAL_PID=$!; HOST_PIDS+=("$DIAL_PID")
  sleep 0.5
}
dial_end() { # <label>: stops the dialer and checks that every connection was answered
  touch "$DIAL_STOP"; wait "$DIAL_PID"
  local ok failed
  ok="$(jq -r .ok "$DIAL_OUT" 2>/dev/null)" failed="$(jq -r .failed "$DIAL_OUT" 2>/dev/null)"
  [[ "${failed:-1}" -eq 0 ]] || jq -r '.errors[]' "$DIAL_OUT" 2>/dev/null | sed 's/^/      | /'
  check "$1: new connections every 50 ms meanwhile, all answered ($ok ok, $failed failed)" \
    test "${ok:-0}" -gt 5 -a "${failed:-1}" -eq 0
}
drop_in() { # <name> <[Service] lines...>: a runtime drop-in (gone with the container), then daemon-reload
  local name="$1"; shift
  mkdir -p "$CROOT/run/systemd/system/$UNIT.d"
  printf '[Service]\n' >"$CROOT/run/systemd/system/$UNIT.d/$name.conf"
  printf '%s\n' "$@" >>"$CROOT/run/systemd/system/$UNIT.d/$name.conf"
  c systemctl daemon-reload
}
drop_in_remove() { rm -f "$CROOT/run/systemd/system/$UNIT.d/$1.conf"; c systemctl daemon-reload; }
restart() { c timeout 150 systemctl restart "$UNIT" >"$SCRATCH/host/restart.log" 2>&1; }

step_begin "systemctl restart while connections run"
PID_BEFORE="$(main_pid)"
dial_start restart
T=$(now); restart; RC=$?; RESTART_S=$(dur "$T")
check "systemctl restart exits 0 (${RESTART_S}s: until the new process's first sync is in)" test $RC -eq 0
check "a new process (MainPID was $PID_BEFORE), active/running" eval '! same_pid "$PID_BEFORE" && active_running'
dial_end "restart"
step_end

step_begin "a crash (SIGKILL): Restart=always starts it again, the Service answers throughout"
PID_BEFORE="$(main_pid)" NR_BEFORE="$(show NRestarts)"
dial_start crash
# In the container's pid namespace (MainPID is one of its pids); never 0 or 1.
if [[ "$PID_BEFORE" =~ ^[0-9]+$ && "$PID_BEFORE" -gt 1 ]]; then c kill -KILL "$PID_BEFORE"; fi
check "restarted by systemd (NRestarts $NR_BEFORE -> more, a new MainPID, active/running)" \
  wait_for 30 eval '[[ "$(show NRestarts)" -gt "$NR_BEFORE" ]] && ! same_pid "$PID_BEFORE" && active_running'
dial_end "crash"
step_end

# Each line of the unit that grants something is taken away once, by a runtime drop-in, and
# what needs it must then fail; with the unit as shipped it works (start.sh, above).
step_begin "what each privilege is for: the unit without it, once each"
# CAP_NET_RAW: iptables-legacy's raw socket. On a node whose iptables is iptables-legacy, the
# leftovers are removed with the unit's capabilities, and kept without CAP_NET_RAW.
c update-alternatives --quiet --set iptables /usr/sbin/iptables-legacy
c update-alternatives --quiet --set ip6tables /usr/sbin/ip6tables-legacy
check "iptables is now iptables-legacy" eval 'c iptables -V | grep -q legacy'
check "upstream's iptables-mode chains planted (iptables-legacy)" plant_leftovers iptables
restart
check "the unit as shipped removes them from iptables-legacy (got: $(leftovers iptables))" test "$(leftovers iptables)" = "$CANARY_ONLY"
plant_leftovers iptables >/dev/null 2>&1
drop_in no-net-raw 'CapabilityBoundingSet=' 'CapabilityBoundingSet=CAP_NET_ADMIN'
restart; RC=$?
check "without CAP_NET_RAW it still starts (exit $RC)" test $RC -eq 0
check "without CAP_NET_RAW the iptables-legacy leftovers stay (got: $(leftovers iptables))" \
  test "$(leftovers iptables)" != "$CANARY_ONLY"
drop_in_remove no-net-raw
restart
check "with it again they are removed (got: $(leftovers iptables))" test "$(leftovers iptables)" = "$CANARY_ONLY"
# /usr/lib/tmpfiles.d/kube-proxy.conf: iptables-legacy-restore's lock must exist, since the
# service cannot create it under its read-only /run.
plant_leftovers iptables >/dev/null 2>&1
c rm -f /run/xtables.lock
restart
check "without /run/xtables.lock the iptables-legacy leftovers stay (got: $(leftovers iptables))" \
  test "$(leftovers iptables)" != "$CANARY_ONLY"
check "journal: 'Failed to execute iptables-restore', ERROR: can't open lock file /run/xtables.lock: Read-only file system" \
  test "$(entries '.MESSAGE == "Failed to execute iptables-restore" and (.ERROR | test("lock file /run/xtables.lock: Read-only file system"))')" -ge 1
c systemd-tmpfiles --create kube-proxy.conf
restart
check "the lock made again by systemd-tmpfiles (as at boot): they are removed (got: $(leftovers iptables))" \
  test "$(leftovers iptables)" = "$CANARY_ONLY"
c update-alternatives --quiet --set iptables /usr/sbin/iptables-nft
c update-alternatives --quiet --set ip6tables /usr/sbin/ip6tables-nft
# CAP_NET_ADMIN: nf_tables (and everything else). Without it the kernel refuses the proxy's
# first batch, so READY never comes; the old process's rules keep serving meanwhile. (Not
# waited out: once the kernel has refused, the unit is stopped.)
drop_in no-net-admin 'CapabilityBoundingSet=' 'CapabilityBoundingSet=CAP_NET_RAW'
dial_start no-net-admin
# The kernel refuses the nf_tables batch the proxy checks its netlink socket with at start.
NFT_REFUSED='((.MESSAGE // "") + " " + (.ERROR // "")) | test("Operation not permitted")'
NFT_REFUSED_BEFORE="$(entries "$NFT_REFUSED")"
c systemctl restart --no-block "$UNIT"
check "without CAP_NET_ADMIN: the kernel refused its nf_tables batch (Operation not permitted)" \
  wait_for 30 eval '[[ "$(entries "$NFT_REFUSED")" -gt $NFT_REFUSED_BEFORE ]]'
check "without CAP_NET_ADMIN: not ready (ActiveState $(show ActiveState), not active)" eval '[[ "$(show ActiveState)" != active ]]'
c timeout 60 systemctl stop "$UNIT" >/dev/null 2>&1
dial_end "while it could not start"
drop_in_remove no-net-admin
restart
check "with it again: active/running" active_running
# ReadWritePaths=/proc/sys/net/netfilter: the conntrack sysctls. The kernel's default is put
# back, so that the start has to write it.
cn sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_established=432000
drop_in no-sysctl-path 'ReadWritePaths=' 'ReadWritePaths=-/sys/module/nf_conntrack/parameters'
restart; RC=$?
check "without ReadWritePaths=/proc/sys/net/netfilter the start fails (exit $RC)" test $RC -ne 0
check "journal: writing nf_conntrack_tcp_timeout_established: Read-only file system" \
  eval '[[ "$(journal | grep -c "nf_conntrack_tcp_timeout_established: Read-only file system")" -ge 1 ]]'
drop_in_remove no-sysctl-path
restart
check "with it: active/running, nf_conntrack_tcp_timeout_established 86400 again" \
  eval 'active_running && [[ "$(cn sysctl -n net.netfilter.nf_conntrack_tcp_timeout_established)" == 86400 ]]'
# OOMScoreAdjust=-999: without it the process cannot lower its own score (no
# CAP_SYS_RESOURCE), which it logs at V(2), as upstream does. (Where systemd cannot apply it
# either, start.sh reported why.)
if has_sys_resource; then
  drop_in no-oom 'OOMScoreAdjust=0'
  restart
  check "without OOMScoreAdjust=-999: oom_score_adj stays 0, 'Failed to apply OOMScore' logged" \
    eval '[[ "$(kproc "$(main_pid)" oom_score_adj)" == 0 ]] && logged "Failed to apply OOMScore"'
  drop_in_remove no-oom
  restart
  check "with it: oom_score_adj -999" test "$(kproc "$(main_pid)" oom_score_adj)" = -999
fi
# The conntrack table size and hash size (nf_conntrack_max, /sys/module/nf_conntrack/
# parameters/hashsize) belong to the host's first network namespace: the kernel refuses them
# from any other, this container's included, so that line cannot be exercised here.
RESULTS+=("INFO  nf_conntrack_max / hashsize: written only from the host's own network namespace (the kernel refuses them in any other); needed here: none (this node's $(cn sysctl -n net.netfilter.nf_conntrack_max) >= $(( $(nproc) * 32768 > 131072 ? $(nproc) * 32768 : 131072 )) asked for)")
step_end

step_begin "upgrade $DEB_N_VER -> $DEB_N1_VER (edited conffiles; default policy: restart)"
PID_BEFORE="$(main_pid)"
SUM_CONF="$(sha256sum <"$CROOT/etc/kubernetes/kube-proxy.toml")"; SUM_DEF="$(sha256sum <"$CROOT/etc/default/kube-proxy")"
dial_start upgrade
OUT="$(c timeout 150 dpkg -i /var/tmp/kt/n1.deb </dev/null 2>&1)"; RC=$?
echo "$OUT" | sed 's/^/      | /'
check "dpkg -i N+1 exits 0 with stdin closed (no conffile prompt)" test $RC -eq 0
check "installed version is $DEB_N1_VER" test "$(c dpkg-query -W -f='${Version}' kube-proxy)" = "$DEB_N1_VER"
check "edited /etc/kubernetes/kube-proxy.toml and /etc/default/kube-proxy kept" \
  test "$(sha256sum <"$CROOT/etc/kubernetes/kube-proxy.toml")/$(sha256sum <"$CROOT/etc/default/kube-proxy")" = "$SUM_CONF/$SUM_DEF"
check "policy: restarted (postinst says so; a new MainPID, was $PID_BEFORE)" \
  eval 'grep -q "^kube-proxy: upgraded from .*RESTART_ON_UPGRADE=yes, restarting" <<<"$OUT" && ! same_pid "$PID_BEFORE" && active_running'
dial_end "upgrade"
sed -i 's/^RESTART_ON_UPGRADE=.*/RESTART_ON_UPGRADE=no/' "$CROOT/etc/default/kube-proxy"
PID_BEFORE="$(main_pid)"
OUT="$(c timeout 150 dpkg -i /var/tmp/kt/n1.deb </dev/null 2>&1)"; RC=$?
check "with RESTART_ON_UPGRADE=no: reinstall exits 0, NOT restarted (same MainPID), the notice printed" \
  eval '[[ $RC -eq 0 ]] && same_pid "$PID_BEFORE" && grep -q "^kube-proxy: upgraded from .*, NOT restarted" <<<"$OUT"'
step_end

step_begin "the long-lived connections, across the reloads, the restarts, the crash and the upgrades"
touch "$HOLD_STOP"; wait "$HOLD_PID"
HELD_S=$(dur "$T_HOLD")
RESULT="$(grep '^{' "$SCRATCH/traffic/hold.out")"
log "      $RESULT"
BROKEN="$(jq -r '.broken | length' <<<"$RESULT" 2>/dev/null)"
[[ "${BROKEN:-1}" -eq 0 ]] || jq -r '.broken[]' <<<"$RESULT" | sed 's/^/      | /'
check "zero of $HOLD_COUNT long-lived connections broken over ${HELD_S}s" test "${BROKEN:-1}" -eq 0
# Each echoed all along (one line per ~100 ms): at least half the lines the time allowed.
MIN_OK="$(jq '[.ok[]] | min' <<<"$RESULT" 2>/dev/null)"
check "each kept echoing throughout (fewest echoes $MIN_OK over ${HELD_S}s)" \
  awk -v n="${MIN_OK:-0}" -v s="$HELD_S" 'BEGIN { exit !(n >= s * 5) }'
step_end
