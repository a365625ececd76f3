# shellcheck shell=bash
# packaging/nspawn-test.sh, sourced: what the checks ask systemd, the journal and the container.
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# ------------------------------------------------------------------------------ helpers -----
show() { c systemctl show -P "$1" "${2:-$UNIT}" 2>/dev/null; }   # <property> [unit]
active_running() { [[ "$(show ActiveState "${1:-$UNIT}")/$(show SubState "${1:-$UNIT}")" == active/running ]]; }
main_pid() { show MainPID "${1:-$UNIT}"; }
jsonl_unit() { c journalctl -u "${1:-$UNIT}" -o json --no-pager 2>/dev/null; }
# Our agent (in the container, the packaged unit):
ashow() { show "$1" "$AUNIT"; }
a_running() { active_running "$AUNIT"; }
a_same_pid() { local p; p="$(main_pid "$AUNIT")"; [[ "$p" == "$1" && "$p" != 0 ]]; }
a_status_is() { [[ "$(ashow StatusText)" == $1 ]]; }     # <glob>
a_connected() { a_status_is 'connected to 1 servers, *'; }
file_is() { # <path in container> <expected "%U:%G %a %F">
  local got; got="$(c stat -c '%U:%G %a %F' "$1" 2>&1)"
  [[ "$got" == "$2" ]] || { log "      $1: got '$got', want '$2'"; return 1; }
}
free_base() { # 8 consecutive free TCP ports in 20000-29999
  local b p busy
  for _ in $(seq 1 50); do
    b=$((20000 + RANDOM % 9990)); busy=0
    for p in $(seq "$b" $((b + 7))); do
      if ss -Htln "sport = :$p" | grep -q .; then busy=1; break; fi
    done
    [[ $busy -eq 0 ]] && { echo "$b"; return 0; }
  done
  return 1
}
http_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 3 "$1"; }
code_is() { [[ "$(http_code "$2")" == "$1" ]]; }                 # <code> <url>
same_pid() { local p; p="$(main_pid)"; [[ "$p" == "$1" && "$p" != 0 ]]; }
new_pid_running() { local p; p="$(main_pid)"; [[ "$p" != "$1" && "$p" != 0 ]] && active_running; }
serial_is() { [[ "$(serial_now)" == "$1" ]]; }
user_ok() { # [user home]: a system user with nologin and that home
  local u="${1:-konnectivity}" h="${2:-/var/lib/konnectivity-server}" e
  e="$(c getent passwd "$u")"
  [[ "$e" =~ ^$u:x:([0-9]+):([0-9]+):[^:]*:$h:/usr/sbin/nologin$ ]] \
    && (( BASH_REMATCH[1] < 1000 )) || { log "      getent passwd $u: '$e'"; return 1; }
}
absent() { [[ ! -e "$CROOT$1" && ! -L "$CROOT$1" ]]; }
not_installed() { local s; s="$(c dpkg-query -W -f='${Status}' "${1:-konnectivity-server}" 2>/dev/null)"; [[ -z "$s" || "$s" == *not-installed* ]]; }
no_dpkg_leftovers() { ! ls "$CROOT/etc/konnectivity/" "$CROOT/etc/default/" | grep -q 'dpkg-'; }
serial_now() { # serial of the certificate the agent port presents to a fresh handshake
  openssl s_client -connect "127.0.0.1:$AGENT_PORT" -servername localhost \
    -CAfile "$SCRATCH/certs/ca.crt" -cert "$SCRATCH/certs/agent.crt" -key "$SCRATCH/certs/agent.key" \
    </dev/null 2>/dev/null | openssl x509 -noout -serial 2>/dev/null | cut -d= -f2
}

BASE="$(free_base)" || die "no free port range in 20000-29999"
AGENT_PORT=$BASE HEALTH_PORT=$((BASE + 1)) ADMIN_PORT=$((BASE + 2)) TEST_SERVER_PORT=$((BASE + 3))
AGENT_HEALTH_PORT=$((BASE + 4)) AGENT_ADMIN_PORT=$((BASE + 5))
RA_HEALTH_PORT=$((BASE + 6)) RA_ADMIN_PORT=$((BASE + 7))   # our agent's (RA: Rust agent)
log "ports: agent=$AGENT_PORT health=$HEALTH_PORT admin=$ADMIN_PORT (host test server $TEST_SERVER_PORT; our agent's health=$RA_HEALTH_PORT admin=$RA_ADMIN_PORT)"
