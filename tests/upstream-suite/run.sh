#!/usr/bin/env bash
# Runs upstream's own integration suite (sigs.k8s.io/apiserver-network-proxy v0.36.0,
# package tests) against an external agent binary, with upstream's in-process Go proxy
# server or (--server) an external server binary.
#
#   run.sh --agent PATH [--server PATH] [--run REGEX] [--skip REGEX] [--count N]
#          [--retries N] [--timeout DUR] [--host-net] [--verbose]
#
#   --agent PATH    agent binary, given to the suite as -agent-path (its ExternalAgentRunner)
#   --server PATH   server binary, started by our runner (externalserver/, README.md) instead of
#                   the in-process server; tests in EXTERNAL_SERVER_EXCLUDED are skipped
#   --run REGEX     passed as -test.run (default: every test)
#   --skip REGEX    passed as -test.skip (with the exclusions below, if any)
#   --count N       -test.count (default 1; more to measure flakiness)
#   --retries N     rerun the top-level tests that failed, up to N times (default 0). One
#                   that then passes is reported FLAKY and does not fail the run.
#   --timeout DUR   -test.timeout for the whole binary (default: 10m)
#   --host-net      run in the host's network namespace (default: a private one, below)
#   --verbose       stream the whole log, not only the test results
#
# By default the binary and everything it starts run in a private network namespace
# (unshare; root, or unprivileged user namespaces): loopback, 198.18.0.254 (the suite's
# "blackhole" dial target) on a veth with a static neighbour entry so that SYNs vanish,
# and /etc/resolv.conf (private mount namespace) pointing at our nxdns on 127.0.0.1:53,
# which answers NXDOMAIN (the suite expects "no such host" for a made-up name). Nothing
# leaves loopback and two tests stop depending on the host's network.
#
# Prints one line per top-level test (PASS/FAIL/FLAKY/SKIP, or NO RESULT when the binary
# died under it) and the full log's path. Exit status: 0 only if no test failed (FLAKY
# excepted) and every non-zero exit of the binary is explained by a failed test. The test
# binary is compiled once per go version + go.sum (build.sh, cache outside the work tree).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEFAULT_TIMEOUT=10m

# Tests that cannot run against an external server, skipped by name (-test.skip) only
# with --server. Each needs a reason.
#   (none: every test of v0.36.0 runs against an external server; see README.md)
EXTERNAL_SERVER_EXCLUDED=()

usage() { sed -n '6,26p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

abs_exe() { # <what> <path>: absolute path of an executable file, or exit 2
  if [[ ! -f "$2" || ! -x "$2" ]]; then
    echo "run.sh: $1 '$2' is missing or not an executable file" >&2
    exit 2
  fi
  echo "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
}

AGENT="" SERVER="" RUN="" SKIP="" COUNT=1 RETRIES=0 TIMEOUT="$DEFAULT_TIMEOUT" VERBOSE=0 HOST_NET=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --agent) AGENT="${2:-}"; shift 2 || usage ;;
    --server) SERVER="${2:-}"; shift 2 || usage ;;
    --run) RUN="${2:-}"; shift 2 || usage ;;
    --skip) SKIP="${2:-}"; shift 2 || usage ;;
    --count) COUNT="${2:-}"; shift 2 || usage ;;
    --retries) RETRIES="${2:-}"; shift 2 || usage ;;
    --timeout) TIMEOUT="${2:-}"; shift 2 || usage ;;
    --verbose) VERBOSE=1; shift ;;
    --host-net) HOST_NET=1; shift ;;
    -h|--help) usage ;;
    *) echo "run.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ -n "$AGENT" ]] || { echo "run.sh: --agent PATH is required" >&2; usage; }
AGENT="$(abs_exe "agent binary" "$AGENT")" || exit 2
if [[ -n "$SERVER" ]]; then SERVER="$(abs_exe "server binary" "$SERVER")" || exit 2; fi

if [[ -n "$SERVER" ]]; then
  MODE="external server"
  BUILD_OUT="$("$HERE/build.sh" --external)" || { echo "run.sh: build.sh --external failed" >&2; exit 1; }
  CACHE_DIR="$(printf '%s\n' "$BUILD_OUT" | tail -n 1)"
  TEST_BIN="$CACHE_DIR/upstream-tests-external.test"
else
  MODE="in-process server"
  BUILD_OUT="$("$HERE/build.sh")" || { echo "run.sh: build.sh failed" >&2; exit 1; }
  CACHE_DIR="$(printf '%s\n' "$BUILD_OUT" | tail -n 1)"
  TEST_BIN="$CACHE_DIR/upstream-tests.test"
fi

[[ "$COUNT" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --count needs a positive integer" >&2; exit 2; }
[[ "$RETRIES" =~ ^[0-9]+$ ]] || { echo "run.sh: --retries needs a non-negative integer" >&2; exit 2; }
ARGS=(-test.v -test.count="$COUNT" -test.timeout="$TIMEOUT" -agent-path="$AGENT")
[[ -n "$SERVER" ]] && ARGS+=(-server-path="$SERVER")
[[ -n "$RUN" ]] && ARGS+=(-test.run="$RUN")
SKIPS=()
if [[ -n "$SERVER" && ${#EXTERNAL_SERVER_EXCLUDED[@]} -gt 0 ]]; then
  SKIPS+=("^($(IFS='|'; echo "${EXTERNAL_SERVER_EXCLUDED[*]}"))\$")
fi
[[ -n "$SKIP" ]] && SKIPS+=("$SKIP")
if [[ ${#SKIPS[@]} -gt 0 ]]; then ARGS+=(-test.skip="$(IFS='|'; echo "${SKIPS[*]}")"); fi

LOG="$(mktemp "${TMPDIR:-/tmp}/konn-upstream-suite-XXXXXX.log")"
# The binary's cwd and TMPDIR (so the suite's cert dir and UDS sockets, which TestMain
# leaves behind when it panics, go with it); short: socket paths must fit 108 bytes.
WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/knpus-XXXXXX")"
NET="private network namespace"
[[ "$HOST_NET" == 1 ]] && NET="host network"
echo "run.sh: $MODE, $NET, agent $AGENT${SERVER:+, server $SERVER}"
echo "run.sh: $TEST_BIN ${ARGS[*]}"
echo "run.sh: full log: $LOG"

LAUNCH=()
if [[ "$HOST_NET" == 0 ]]; then
  UNSHARE=(unshare --net --mount)
  [[ "$(id -u)" -ne 0 ]] && UNSHARE=(unshare --user --map-root-user --net --mount)
  if ! "${UNSHARE[@]}" true 2>/dev/null; then
    echo "run.sh: cannot create a private network namespace (${UNSHARE[*]}): run as root, allow unprivileged user namespaces, or pass --host-net" >&2
    exit 2
  fi
  printf 'nameserver 127.0.0.1\n' > "$WORKDIR/resolv.conf"
  # $1 nxdns, $2 workdir, then the test binary and its arguments.
  NETNS_SETUP='set -e
    ip link set lo up
    ip link add knp-bh0 type veth peer name knp-bh1
    ip link set knp-bh0 up
    ip link set knp-bh1 up
    ip addr add 198.18.0.1/15 dev knp-bh0
    ip neigh replace 198.18.0.254 lladdr 02:00:00:00:00:01 dev knp-bh0 nud permanent
    mount --bind "$2/resolv.conf" /etc/resolv.conf
    "$1" -listen 127.0.0.1:53 -ready "$2/nxdns.ready" &
    echo $! > "$2/nxdns.pid"
    i=0; while [ ! -e "$2/nxdns.ready" ]; do i=$((i+1)); [ $i -lt 100 ] || { echo "nxdns did not start" >&2; exit 1; }; sleep 0.05; done
    shift 2
    exec "$@"'
  LAUNCH=("${UNSHARE[@]}" sh -c "$NETNS_SETUP" netns-setup "$CACHE_DIR/nxdns" "$WORKDIR")
fi

# The binary runs in a session of its own (setsid: its pid is the process group id), so
# that agent and server processes it leaves behind (a timeout panic skips t.Cleanup) can
# be found and stopped by that group id afterwards. unshare and sh exec into it.
# run_binary ARGS...: one run, appended to $LOG; sets RC.
run_binary() {
  rm -f "$WORKDIR/nxdns.pid" "$WORKDIR/nxdns.ready"
  (cd "$WORKDIR" && TMPDIR="$WORKDIR" exec setsid "${LAUNCH[@]}" "$TEST_BIN" "$@") >>"$LOG" 2>&1 &
  PGID=$!
  trap 'echo "run.sh: interrupted, stopping process group $PGID" >&2; stop_group; exit 130' INT TERM
  if [[ "$VERBOSE" == 1 ]]; then
    tail -n 0 --pid="$PGID" -f "$LOG" &
  else
    tail -n 0 --pid="$PGID" -f "$LOG" | grep --line-buffered -E '^--- (PASS|FAIL|SKIP): ' &
  fi
  local tail_pid=$!
  wait "$PGID"; RC=$?
  wait "$tail_pid" 2>/dev/null
  trap - INT TERM
  if [[ -s "$WORKDIR/nxdns.pid" ]]; then # ours, expected to outlive the binary
    local nxdns_pid
    nxdns_pid="$(cat "$WORKDIR/nxdns.pid")"
    kill "$nxdns_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$nxdns_pid" 2>/dev/null || break; sleep 0.05; done
  fi
  # Live members of the group (zombies are agents the binary killed without waiting for
  # them; they are reaped once re-parented). Give stopping processes a moment.
  for _ in $(seq 40); do [[ -z "$(group_alive)" ]] && break; sleep 0.05; done
  if [[ -n "$(group_alive)" ]]; then
    echo "run.sh: processes left running in group $PGID after the test binary exited, killing them:" >&2
    ps -o pid=,args= -p "$(group_alive | paste -sd,)" | cut -c1-200 | sed 's/^/    /' >&2
    stop_group
  fi
}
stop_group() { kill -KILL -- "-$PGID" 2>/dev/null; }
group_alive() { ps -e -o pid=,pgid=,stat= | awk -v g="$PGID" '$2 == g && $3 !~ /^Z/ { print $1 }'; }
# Top-level tests that failed in the last run (after the last retry marker).
last_failed() { awk '/^##### run.sh retry /{delete f} /^--- FAIL: [^ \/]+ \(/{f[$3]=1} END{for (k in f) print k}' "$LOG" | sort; }

start=$(date +%s)
: >"$LOG"
run_binary "${ARGS[@]}"
RCS=("$RC")
UNEXPLAINED=0 # a non-zero exit without a failed top-level test: TestMain error, panic, ...
[[ "$RC" -ne 0 && -z "$(last_failed)" ]] && UNEXPLAINED=1
for ((retry = 1; retry <= RETRIES; retry++)); do
  mapfile -t FAILED < <(last_failed)
  [[ ${#FAILED[@]} -gt 0 && "$UNEXPLAINED" == 0 ]] || break
  RETRY_RUN="^($(IFS='|'; echo "${FAILED[*]}"))\$"
  echo "run.sh: retry $retry of ${FAILED[*]}"
  echo "##### run.sh retry $retry: -test.run=$RETRY_RUN" >>"$LOG"
  RETRY_ARGS=()
  for a in "${ARGS[@]}"; do [[ "$a" == -test.run=* ]] || RETRY_ARGS+=("$a"); done
  run_binary "${RETRY_ARGS[@]}" -test.run="$RETRY_RUN"
  RCS+=("$RC")
  [[ "$RC" -ne 0 && -z "$(last_failed)" ]] && UNEXPLAINED=1
done
elapsed=$(( $(date +%s) - start ))
rm -rf "$WORKDIR"

echo
echo "==================== upstream suite, $MODE, $NET (full log: $LOG) ===================="
# Top-level tests only: "=== RUN   TestX" without "/", and "--- RESULT: TestX (t)" at column 0.
# A test's line: PASS; FAIL (some run failed and no retry passed it); FLAKY (failed, then
# passed in every retry run of it that followed); SKIP; NO RESULT (started, never ended,
# e.g. the binary panicked). With --count > 1 or retries, the tally per result follows.
awk -v runs="$COUNT" '
  function add(name) { if (!(name in seen)) { seen[name] = 1; order[++n] = name } }
  /^##### run.sh retry / { pass_no++ }
  /^=== RUN   [^ \/]+$/ { add($3); started[$3]++ }
  /^--- (PASS|FAIL|SKIP): [^ \/]+ \(/ {
    name = $3; add(name); r = substr($2, 1, 4); tally[name, r]++; ended[name]++
    if (pass_no > 0) { retried[name] = 1; if (r == "FAIL") retry_failed[name] = 1 }
    t = $4; gsub(/[()s]/, "", t); if (t + 0 >= max[name] + 0) max[name] = t
  }
  END {
    for (i = 1; i <= n; i++) {
      s = order[i]
      if (started[s] > ended[s]) r = "NO RESULT"
      else if (tally[s, "FAIL"] && retried[s] && !retry_failed[s]) r = "FLAKY"
      else if (tally[s, "FAIL"]) r = "FAIL"
      else if (tally[s, "PASS"]) r = "PASS"; else r = "SKIP"
      line = sprintf("%-55s %-9s %ss", s, r, max[s] == "" ? "-" : max[s])
      if (runs > 1 || retried[s]) line = line sprintf("   pass %d, fail %d, skip %d, no result %d", tally[s, "PASS"], tally[s, "FAIL"], tally[s, "SKIP"], started[s] - ended[s])
      print line
      count[r]++
    }
    printf "\n%d tests: %d passed, %d failed, %d flaky (failed, then passed on retry), %d skipped, %d without a result\n", n, count["PASS"], count["FAIL"], count["FLAKY"], count["SKIP"], count["NO RESULT"]
    exit (count["FAIL"] + count["NO RESULT"] > 0)
  }' "$LOG"
summary_failed=$?
if ! grep -q '^=== RUN' "$LOG"; then
  echo "run.sh: no test ran; the log ends with:"; tail -n 20 "$LOG" | sed 's/^/    /'
fi
if grep -q '^panic: ' "$LOG"; then
  echo "run.sh: the test binary panicked: $(grep -m1 '^panic: ' "$LOG")"
fi
if [[ -n "$SERVER" && ${#EXTERNAL_SERVER_EXCLUDED[@]} -gt 0 ]]; then
  echo "run.sh: excluded with an external server (see EXTERNAL_SERVER_EXCLUDED in run.sh): ${EXTERNAL_SERVER_EXCLUDED[*]}"
fi
echo "run.sh: test binary exit status ${RCS[*]} (first run, then retries), ${elapsed}s"

if [[ "$summary_failed" -ne 0 || "$UNEXPLAINED" -ne 0 ]]; then exit 1; fi
exit 0
