#!/usr/bin/env bash
# Stops the fixture started by tests/kube/start.sh DIR:   tests/kube/stop.sh DIR
# Kills only the pids recorded in DIR/env, and only if they still run the expected
# binary (a recycled pid is left alone). SIGTERM, then SIGKILL after 10 s.
# Idempotent; leaves DIR (logs, audit log, pki) in place.
set -uo pipefail

if [[ $# -ne 1 ]]; then echo "usage: $0 DIR" >&2; exit 2; fi
DIR="$1"
ENV="$DIR/env"
[[ -f "$ENV" ]] || { echo "stop.sh: no $ENV, nothing to stop" >&2; exit 0; }

get() { sed -n "s/^$1=//p" "$ENV" | tail -n 1; }

is_ours() { # <pid> <expected substring of cmdline>
  [[ -n "$1" && -r "/proc/$1/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF -- "$2"
}

stop_pid() { # <name> <pid> <cmdline substring>
  local name="$1" pid="$2" match="$3"
  [[ "$pid" == "$$" ]] && return 0   # the watchdog exec'd into this script
  is_ours "$pid" "$match" || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    is_ours "$pid" "$match" || return 0
    sleep 0.1
  done
  echo "stop.sh: $name (pid $pid) ignored SIGTERM for 10 s, sending SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 50); do is_ours "$pid" "$match" || return 0; sleep 0.1; done
  echo "stop.sh: $name (pid $pid) still running" >&2
  return 1
}

rc=0
# the watchdog first, so it does not race us (it would only call this script again)
stop_pid watchdog       "$(get WATCHDOG_PID)"  "$DIR"                  || rc=1
stop_pid kube-apiserver "$(get APISERVER_PID)" "$(get KUBE_BIN_DIR)/kube-apiserver" || rc=1
stop_pid etcd           "$(get ETCD_PID)"      "$(get KUBE_BIN_DIR)/etcd"           || rc=1
sed -i 's/^RUNNING=1$/RUNNING=0/' "$ENV"
exit $rc
