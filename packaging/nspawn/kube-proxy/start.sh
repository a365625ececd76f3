# shellcheck shell=bash
# packaging/nspawn-kube-proxy-test.sh, sourced: the first start with the API server held back (READY only once the rules are in), the Service through the node, upstream's iptables leftovers, the process's privileges.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# Not `| grep -q`: with pipefail, nft killed by SIGPIPE would make a match fail.
table_has_service() { [[ "$(c nft list table ip kube-proxy 2>/dev/null)" == *"$SVC_IP"* ]]; }
journal() { c journalctl -u "$UNIT" -o cat --no-pager 2>/dev/null; }
# grep -c, not -q: with pipefail, journalctl killed by SIGPIPE would fail the check.
logged() { [[ "$(journal | grep -cF -- "$1")" -gt 0 ]]; }   # <text>
# How many of the unit's entries meet a jq condition (errors are in fields: ERROR, ...).
entries() { c journalctl -u "$UNIT" -o json --no-pager 2>/dev/null | jq -s "[.[] | select($1)] | length"; }
# Chains of upstream's iptables mode, and one of kubelet's (kube-proxy must leave it).
plant_leftovers() { # <iptables program>
  c "$1" -t nat -N KUBE-SERVICES && c "$1" -t nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES \
    && c "$1" -t nat -N KUBE-SVC-NSPAWNTEST000000 && c "$1" -t nat -A KUBE-SERVICES -j KUBE-SVC-NSPAWNTEST000000 \
    && c "$1" -t filter -N KUBE-FORWARD && c "$1" -t filter -A FORWARD -j KUBE-FORWARD \
    && c "$1" -t nat -N KUBE-KUBELET-CANARY
}
leftovers() { c "$1-save" 2>/dev/null | grep -oE '^:KUBE-[A-Z0-9-]+' | sort | tr '\n' ' '; }   # <iptables program>
# What stays after the leftovers are removed: kubelet's canary, and the KUBE-FORWARD chain our
# ipvs mode adds itself (upstream's accept rules, for a FORWARD policy of DROP).
CANARY_ONLY=":KUBE-FORWARD :KUBE-KUBELET-CANARY "

step_begin "the node's kubeconfig, the reference unit's flags, upstream's iptables leftovers, the relay"
kp_kubeconfig https://127.0.0.1:6443 "$KP_TOKEN" >"$CROOT/etc/kubernetes/kube-proxy.kubeconfig"
chmod 0600 "$CROOT/etc/kubernetes/kube-proxy.kubeconfig"
# Flags override the packaged kube-proxy.toml (still read: it is the default file); this also
# makes /etc/default/kube-proxy an admin-edited conffile for the upgrade test.
sed -i "s|^KUBE_PROXY_ARGS=.*|KUBE_PROXY_ARGS=\"$REFERENCE_ARGS\"|" "$CROOT/etc/default/kube-proxy"
check "KUBE_PROXY_ARGS is the reference command line" grep -qF "KUBE_PROXY_ARGS=\"$REFERENCE_ARGS\"" "$CROOT/etc/default/kube-proxy"
check "iptables is iptables-nft (Debian's default)" eval 'c iptables -V | grep -q nf_tables'
check "upstream's iptables-mode chains planted (iptables-nft), and kubelet's KUBE-KUBELET-CANARY" plant_leftovers iptables
log "      iptables-nft KUBE-* chains: $(leftovers iptables)"
# The container's half of the relay: 127.0.0.1:6443 -> the Unix socket the host's half listens
# on (/run/kube-api is bind-mounted from the host). The host's half starts later.
check "relay in the container (socat, 127.0.0.1:6443 -> /run/kube-api/apiserver.sock)" \
  c systemd-run --quiet --unit=kube-api-relay --property=Restart=always \
  socat TCP-LISTEN:6443,bind=127.0.0.1,reuseaddr,fork UNIX-CONNECT:/run/kube-api/apiserver.sock
step_end

# READY=1 only once the first sync is in the kernel: the API server is held back for a few
# seconds (the host's half of the relay is not there yet), so `systemctl start` must still be
# waiting then, with no rules in, and return only after the API server is reachable, with the
# Service's rules in the kernel at that moment.
API_DELAY=5
step_begin "systemctl start kube-proxy with the API server unreachable for ${API_DELAY}s (Type=notify: returns once the rules are in)"
T_START_KP=$(now)
c timeout 150 systemctl start "$UNIT" >"$SCRATCH/host/start.log" 2>&1 & START_PID=$!
sleep "$API_DELAY"
check "after ${API_DELAY}s without the API server: systemctl start still waiting (ActiveState=activating)" \
  test "$(show ActiveState)" = activating
check "after ${API_DELAY}s without the API server: no rules for the Service yet" eval '! table_has_service'
check "after ${API_DELAY}s without the API server: the Service does not answer" eval '! answers'
socat "UNIX-LISTEN:$SCRATCH/api/apiserver.sock,fork,unlink-early,mode=0600" "TCP:127.0.0.1:$APISERVER_PORT" \
  >"$SCRATCH/host/relay.log" 2>&1 &
HOST_PIDS+=($!)
T_API=$(now)
wait "$START_PID"; RC=$?
START_S=$(dur "$T_START_KP"); AFTER_API_S=$(dur "$T_API")
# The moment systemctl start returned: are the rules in?
IN_AT_READY=0; table_has_service && IN_AT_READY=1
sed 's/^/      | /' "$SCRATCH/host/start.log"
check "systemctl start exits 0 (${START_S}s in all, ${AFTER_API_S}s after the API server became reachable)" test $RC -eq 0
check "systemctl start returned only after the API server became reachable" \
  awk -v s="$START_S" -v d="$API_DELAY" 'BEGIN { exit !(s >= d) }'
check "when systemctl start returned, the Service's rules were in the kernel (nft list table ip kube-proxy has $SVC_IP)" \
  test $IN_AT_READY -eq 1
check "active/running" active_running
log "      StatusText=$(show StatusText)  MainPID=$(main_pid)"
check "StatusText counts the Service ('ip: 1 service ports' or more)" eval '[[ "$(show StatusText)" == *"IPv4: "[1-9]*" service ports"* || "$(show StatusText)" == *"ip: "[1-9]*" service ports"* ]]'
check "journal: 'rules programmed; ready'" logged "rules programmed; ready"
step_end

step_begin "the Service answers through the node; the reference flags are in force"
check "client -> $SVC (ClusterIP) -> pod1, answered" answers
log "      answer: $(client once "$SVC" 2)"
check "a second table for IPv6 (ip6 kube-proxy): both families are programmed" c nft list table ip6 kube-proxy
check "journal: the flags from /etc/default/kube-proxy (FLAG: --bind-address=\"$NODE_IP\", --proxy-mode=\"ipvs\")" \
  eval 'logged "FLAG: --bind-address=\"$NODE_IP\"" && logged "FLAG: --proxy-mode=\"ipvs\""'
check "journal: ipvs mode is served by the nftables dataplane (the warning says so)" logged "mode is served by nftables rules"
check "healthz on 0.0.0.0:10256 in the node's namespace: 200" \
  eval '[[ "$(cn curl -s -o /dev/null -w "%{http_code}" --max-time 3 http://127.0.0.1:10256/healthz)" == 200 ]]'
check "metrics on 127.0.0.1:10249: kubeproxy_sync_proxy_rules_duration_seconds" \
  eval 'cn curl -s --max-time 3 http://127.0.0.1:10249/metrics | grep -c "^kubeproxy_sync_proxy_rules_duration_seconds" >/dev/null'
check "upstream's iptables-mode chains removed at start; kubelet's KUBE-KUBELET-CANARY kept (got: $(leftovers iptables))" \
  test "$(leftovers iptables)" = "$CANARY_ONLY"
step_end

step_begin "the process's privileges"
KP_PID="$(main_pid)"
CAPS="$(status_field "$KP_PID" CapEff)"
check "effective capabilities exactly CAP_NET_ADMIN + CAP_NET_RAW (CapEff $CAPS, want 0000000000003000)" \
  test "$CAPS" = 0000000000003000
check "bounding set the same (CapBnd)" test "$(status_field "$KP_PID" CapBnd)" = 0000000000003000
check "uid 0, NoNewPrivs 1" test "$(status_field "$KP_PID" Uid)/$(status_field "$KP_PID" NoNewPrivs)" = 0/1
# OOMScoreAdjust=-999 is applied by systemd while it still holds CAP_SYS_RESOURCE; where the
# host grants nobody that capability (this VM's sandbox), systemd skips it as in a container and
# the process cannot lower its score either: then this is reported, not checked.
if has_sys_resource; then
  check "oom_score_adj -999 (--oom-score-adj's default, set by the unit's OOMScoreAdjust=)" \
    test "$(kproc "$KP_PID" oom_score_adj)" = -999
  check "journal: no 'Failed to apply OOMScore' (the process wrote -999 without CAP_SYS_RESOURCE)" \
    eval '! logged "Failed to apply OOMScore"'
else
  RESULTS+=("INFO  oom_score_adj not checked: the container's systemd has no CAP_SYS_RESOURCE (this host's bounding set lacks it), so OOMScoreAdjust=-999 cannot apply here (oom_score_adj $(kproc "$KP_PID" oom_score_adj))")
fi
# The paths the unit makes writable are, in the service's own mount namespace, and their parents
# are not (ProtectKernelTunables=, ProtectSystem=strict).
mount_opts() { c nsenter -t "$KP_PID" -m findmnt -n -o OPTIONS --target "$1" | cut -d, -f1; }   # <path>
check "in the service's mounts: /proc/sys/net/netfilter rw, /proc/sys ro" \
  test "$(mount_opts /proc/sys/net/netfilter)/$(mount_opts /proc/sys)" = rw/ro
check "in the service's mounts: /run, /etc and /usr ro (ProtectSystem=strict)" \
  test "$(mount_opts /run)/$(mount_opts /etc)/$(mount_opts /usr)" = ro/ro/ro
# ReadWritePaths= keeps a path out of the read-only remounts; it cannot make the container's
# read-only bind of the hash size writable, and the kernel would refuse the write here anyway.
check "in the service's namespace: /sys ro, the conntrack hash size readable (read at every start)" \
  eval '[[ "$(mount_opts /sys)" == ro ]] && c nsenter -t "$KP_PID" -m cat /sys/module/nf_conntrack/parameters/hashsize >/dev/null'
check "conntrack sysctl written in the node's namespace (nf_conntrack_tcp_timeout_established 86400)" \
  test "$(cn sysctl -n net.netfilter.nf_conntrack_tcp_timeout_established)" = 86400
check "the process is in the container's network namespace" \
  test "$(c readlink "/proc/$KP_PID/ns/net")" = "$(c readlink /proc/1/ns/net)"
step_end
