# shellcheck shell=bash
# packaging/nspawn-test.sh and packaging/nspawn-kube-proxy-test.sh, sourced first: the step
# timer, the check helpers and the result list both entry scripts report with.

T_START=$(date +%s.%N)
now() { date +%s.%N; }
dur() { printf '%.2f' "$(echo "$(now) - $1" | bc)"; }
log() { printf '[%7.2fs] %s\n' "$(echo "$(now) - $T_START" | bc)" "$*"; }
declare -a TIMINGS=() RESULTS=()
FAILS=0
step_begin() { STEP="$1"; STEP_T=$(now); log "--- $STEP"; }
step_end() { local d; d=$(dur "$STEP_T"); TIMINGS+=("$(printf '%8ss  %s' "$d" "$STEP")"); log "    ($STEP: ${d}s)"; }
pass() { RESULTS+=("PASS  $*"); log "PASS  $*"; }
fail() { RESULTS+=("FAIL  $*"); log "FAIL  $*"; FAILS=$((FAILS + 1)); }
check() { # <description> <command...>: PASS if the command succeeds
  local d="$1"; shift
  if "$@"; then pass "$d"; else fail "$d"; fi
}
die() { log "FATAL: $*"; FAILS=$((FAILS + 1)); exit 1; }
wait_for() { # <seconds> <command...>
  local end=$(( $(date +%s) + $1 )); shift
  until "$@"; do [[ $(date +%s) -ge $end ]] && return 1; sleep 0.2; done
}
