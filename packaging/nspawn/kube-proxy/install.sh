# shellcheck shell=bash
# packaging/nspawn-kube-proxy-test.sh, sourced: dpkg -i, the files, enabled but not started, the unit's lint and hardening score.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

show() { c systemctl show -P "$1" "${2:-$UNIT}" 2>/dev/null; }   # <property> [unit]
active_running() { [[ "$(show ActiveState)/$(show SubState)" == active/running ]]; }
# MainPID is a pid in the container's pid namespace: read and signal it there (kproc), never
# with the host's /proc or kill.
main_pid() { show MainPID; }
kproc() { c cat "/proc/$1/$2" 2>/dev/null; }   # <pid> <file>: /proc/<pid>/<file> in the container
status_field() { kproc "$1" status | awk -v f="$2:" '$1 == f { print $2 }'; }   # <pid> <field>
same_pid() { local p; p="$(main_pid)"; [[ "$p" == "$1" && "$p" != 0 ]]; }
file_is() { # <path in container> <expected "%U:%G %a %F">
  local got; got="$(c stat -c '%U:%G %a %F' "$1" 2>&1)"
  [[ "$got" == "$2" ]] || { log "      $1: got '$got', want '$2'"; return 1; }
}
absent() { [[ ! -e "$CROOT$1" && ! -L "$CROOT$1" ]]; }

mkdir -p "$CROOT/var/tmp/kt"
cp "$DEB_N" "$CROOT/var/tmp/kt/n.deb"; cp "$DEB_N1" "$CROOT/var/tmp/kt/n1.deb"

step_begin "dpkg -i kube-proxy $DEB_N_VER (its dependency nftables is in the rootfs)"
OUT="$(c dpkg -i /var/tmp/kt/n.deb </dev/null 2>&1)"; RC=$?
echo "$OUT" | sed 's/^/      | /'
check "dpkg -i exits 0" test $RC -eq 0
check "postinst says: enabled, not started" grep -q '^kube-proxy: installed and enabled, not started' <<<"$OUT"
step_end

step_begin "files, modes, enablement"
check "/usr/bin/kube-proxy root:root 755" file_is /usr/bin/kube-proxy "root:root 755 regular file"
check "/etc/kubernetes/kube-proxy.toml root:root 644" file_is /etc/kubernetes/kube-proxy.toml "root:root 644 regular file"
check "/etc/default/kube-proxy root:root 644" file_is /etc/default/kube-proxy "root:root 644 regular file"
check "/usr/lib/tmpfiles.d/kube-proxy.conf present, applied by postinst: /run/xtables.lock root:root 600" \
  file_is /run/xtables.lock "root:root 600 regular empty file"
check "man pages kube-proxy(8), kube-proxy-trace(8), kube-proxy.toml(5); bash/zsh/fish completions" \
  c test -f /usr/share/man/man8/kube-proxy.8.gz -a -f /usr/share/man/man8/kube-proxy-trace.8.gz \
  -a -f /usr/share/man/man5/kube-proxy.toml.5.gz -a -f /usr/share/bash-completion/completions/kube-proxy \
  -a -f /usr/share/zsh/vendor-completions/_kube-proxy -a -f /usr/share/fish/vendor_completions.d/kube-proxy.fish
check "/usr/share/doc/kube-proxy/{README.md,PACKAGING.md,kube-proxy.toml,changelog.gz,copyright}" \
  c test -f /usr/share/doc/kube-proxy/README.md -a -f /usr/share/doc/kube-proxy/PACKAGING.md \
  -a -f /usr/share/doc/kube-proxy/kube-proxy.toml -a -f /usr/share/doc/kube-proxy/changelog.gz \
  -a -f /usr/share/doc/kube-proxy/copyright
check "the packaged configuration passes --check-config" \
  eval 'c kube-proxy --check-config --config=/etc/kubernetes/kube-proxy.toml | grep -q "^configuration OK"'
check "unit enabled after install" test "$(c systemctl is-enabled "$UNIT" 2>&1)" = enabled
check "unit NOT started by install" test "$(c systemctl is-active "$UNIT" 2>&1)" = inactive
# Enabled before its kubeconfig exists: a start (as at boot) is skipped, not failed.
c timeout 30 systemctl start "$UNIT" >/dev/null 2>&1
check "without /etc/kubernetes/kube-proxy.kubeconfig: start skipped by ConditionPathExists (inactive, not failed)" \
  test "$(show ActiveState)/$(show ConditionResult)" = inactive/no
check "no kube-proxy table in the container's namespace yet" eval '! c nft list table ip kube-proxy >/dev/null 2>&1'
step_end

step_begin "systemd-analyze verify + security"
VERIFY="$(c systemd-analyze verify "$UNIT" 2>&1)"; RC=$?
[[ -n "$VERIFY" ]] && echo "$VERIFY" | sed 's/^/      | /'
check "systemd-analyze verify $UNIT: exit 0, no warnings about it" test $RC -eq 0 -a -z "$(grep -i kube-proxy <<<"$VERIFY")"
SECURITY="$(c systemd-analyze security "$UNIT" --no-pager 2>&1 | tail -n 1)"
log "      systemd-analyze security: $SECURITY"
check "systemd-analyze security gives a score" eval '[[ "$SECURITY" == *"exposure level"* ]]'
step_end
