#!/usr/bin/env bash
# Interop entry point:  tests/interop/run.sh [path-to-our-server-binary [path-to-our-agent-binary]]
# Builds (or reuses) the upstream binaries, runs every scenario against "ours"
# and "upstream", and prints a scenario x {ours, upstream} summary table.
# With our agent (second argument or KONNECTIVITY_AGENT_BIN), TestAgentInterop runs the agent
# scenarios with it against both servers (rows agent:<scenario>).
# Env: CI=true turns any skip (e.g. missing server or agent binary) into a failure.
#      GO_TEST_RUN=<regex> narrows the scenarios (passed to go test -run).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

OURS="${1:-${KONNECTIVITY_SERVER_BIN:-}}"
if [[ -n "$OURS" ]]; then
  if [[ ! -x "$OURS" ]]; then
    echo "run.sh: our server binary '$OURS' is missing or not executable" >&2
    exit 2
  fi
  OURS="$(cd "$(dirname "$OURS")" && pwd)/$(basename "$OURS")"
elif [[ "${CI:-}" == "true" ]]; then
  echo "run.sh: CI=true but no server binary given (argument or KONNECTIVITY_SERVER_BIN)" >&2
  exit 2
fi

AGENT="${2:-${KONNECTIVITY_AGENT_BIN:-}}"
if [[ -n "$AGENT" ]]; then
  if [[ ! -x "$AGENT" ]]; then
    echo "run.sh: our agent binary '$AGENT' is missing or not executable" >&2
    exit 2
  fi
  AGENT="$(cd "$(dirname "$AGENT")" && pwd)/$(basename "$AGENT")"
fi
# (Under CI=true a missing agent fails TestAgentInterop itself, when the run includes it.)

BUILD_OUT="$("$HERE/build.sh")" || { echo "run.sh: build.sh failed" >&2; exit 1; }
BIN_DIR="$(printf '%s\n' "$BUILD_OUT" | tail -n 1)"
echo "run.sh: upstream binaries in $BIN_DIR"

# The real kube-apiserver + etcd for TestKube (kube_test.go, metrics_test.go): built from the
# Go module proxy by tests/kube/build.sh into a cache outside the work tree (~10 min cold,
# instant when cached), started by the test itself. Skipped when GO_TEST_RUN excludes TestKube.
# tools.sh (promtool, haproxy, toxiproxy) for TestKube, TestAgentInterop (haproxy) and
# TestFaults (toxiproxy, haproxy).
KUBE_BIN_DIR="${KUBE_BIN_DIR:-}"
TOOLS_ENV=()
first_run_elem="${GO_TEST_RUN:-}"; first_run_elem="${first_run_elem%%/*}"
runs() { [[ -z "${GO_TEST_RUN:-}" ]] || [[ "$1" =~ $first_run_elem ]]; }
if runs TestKube || runs TestAgentInterop || runs TestFaults; then
  if runs TestKube && [[ -z "$KUBE_BIN_DIR" ]]; then
    kube_t0=$(date +%s)
    if KUBE_OUT="$("$HERE/../kube/build.sh")"; then
      KUBE_BIN_DIR="$(printf '%s\n' "$KUBE_OUT" | tail -n 1)"
      echo "run.sh: kube-apiserver + etcd in $KUBE_BIN_DIR ($(( $(date +%s) - kube_t0 ))s)"
    else
      echo "run.sh: tests/kube/build.sh failed after $(( $(date +%s) - kube_t0 ))s" >&2
      if [[ "${CI:-}" == "true" ]]; then exit 1; fi
    fi
  fi
  if TOOLS_OUT="$("$HERE/tools.sh")"; then :; else
    echo "run.sh: tools.sh could not provide every tool (promtool, haproxy, toxiproxy)" >&2
    if [[ "${CI:-}" == "true" ]]; then exit 1; fi
  fi
  mapfile -t TOOLS_ENV < <(printf '%s\n' "${TOOLS_OUT:-}" | grep -E '^[A-Z_]+=')
fi

LOG="$(mktemp "${TMPDIR:-/tmp}/konn-interop-XXXXXX.log")"
(
  cd "$HERE" && env "${TOOLS_ENV[@]}" KONNECTIVITY_SERVER_BIN="$OURS" KONNECTIVITY_AGENT_BIN="$AGENT" \
    UPSTREAM_BIN_DIR="$BIN_DIR" KUBE_BIN_DIR="$KUBE_BIN_DIR" \
    "$GO" test -count=1 -v -timeout 30m ${GO_TEST_RUN:+-run "$GO_TEST_RUN"} .
) 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}

echo
echo "==================== interop summary (full log: $LOG) ===================="
sed -nE \
  -e 's/^ *--- (PASS|FAIL|SKIP): TestInterop\/(ours|upstream)\/([^ ]+) \(.*/\3 \2 \1/p' \
  -e 's/^ *--- (PASS|FAIL|SKIP): TestInterop\/(ours|upstream) \(.*/* \2 \1/p' \
  -e 's/^ *--- (PASS|FAIL|SKIP): TestAgentInterop\/(ours|upstream)\/([^ ]+) \(.*/agent:\3 \2 \1/p' \
  -e 's/^ *--- (PASS|FAIL|SKIP): TestAgentInterop\/(ours|upstream) \(.*/*agent: \2 \1/p' \
  -e 's/^ *--- SKIP: TestAgentInterop \(.*/*agent: all SKIP/p' \
  -e 's/^ *--- (PASS|FAIL|SKIP): TestKube\/([^ ]+)\/(ours|upstream) \(.*/kube\/\2 \3 \1/p' \
  -e 's/^ *--- (PASS|FAIL|SKIP): TestKube\/(compare_[^ /]+) \(.*/kube\/\2 ours \1\nkube\/\2 upstream \1/p' \
  -e 's/^ *--- (PASS|FAIL|SKIP): TestFaults\/([^ /]+)\/(ours|upstream) \(.*/faults\/\2 \3 \1/p' \
  -e 's/^ *--- SKIP: TestFaults\/([^ /]+) \(.*/faults\/\1 ours SKIP\nfaults\/\1 upstream SKIP/p' "$LOG" |
awk '
  # A scenario missing for an implementation that did run is ours-only: n/a. Rows of
  # TestAgentInterop (agent:<scenario>; columns = the server) look at the runs of that test.
  function cell(s, impl,   w) {
    if ((s, impl) in res) return res[s, impl]
    w = (index(s, "agent:") == 1) ? "agent:" impl : impl
    if (!(w in whole)) return "-"
    return (whole[w] == "SKIP") ? "SKIP" : "n/a"
  }
  { if ($1 == "*") { whole[$2] = $3; next }
    if ($1 == "*agent:") { if ($2 == "all") agentskip = 1; else whole["agent:" $2] = $3; next }
    if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 }
    res[$1, $2] = $3 }
  END {
    printf "%-64s %-8s %-8s\n", "scenario (agent:* rows: our agent; columns = server)", "ours", "upstream"
    # TestAgentInterop (agent_test.go) runs first; its rows are printed last.
    for (pass = 0; pass < 2; pass++) for (i = 1; i <= n; i++) {
      s = order[i]; parent = 0
      if ((index(s, "agent:") == 1) != pass) continue
      for (j = 1; j <= n; j++) if (index(order[j], s "/") == 1) parent = 1
      if (parent) continue
      o = cell(s, "ours"); u = cell(s, "upstream")
      printf "%-64s %-8s %-8s\n", s, tolower(o), tolower(u)
    }
    if (n == 0) printf "(no scenario results found)\n"
    for (k in whole) if (whole[k] == "SKIP") printf "%s: whole run skipped\n", k
    if (agentskip) printf "agent: TestAgentInterop skipped (no KONNECTIVITY_AGENT_BIN / second argument)\n"
  }'
if grep -q 'RELOAD-FIGURES' "$LOG"; then
  grep -o 'RELOAD-FIGURES.*' "$LOG" | sed 's/^/reload_under_load: /'
fi
for fig in HOL-FIGURES BLACKHOLE-FIGURES AGENT-HOL-FIGURES AGENT-HA-FIGURES; do
  # " $fig " only: HOL-FIGURES must not also print the AGENT-HOL-FIGURES lines.
  if grep -qE "(^| )$fig " "$LOG"; then
    grep -oE "(^| )$fig .*" "$LOG" | sed 's/^ //' | cut -c1-330
  fi
done
# TestFaults (faults_test.go): one line per scenario and server, and the thresholds ours missed.
if grep -qE '(^| )FAULT-FIGURES ' "$LOG"; then
  grep -oE '(^| )FAULT-FIGURES .*' "$LOG" | sed 's/^ //' | sort | cut -c1-600
fi
if grep -qE 'FAULT-ASSERTION ' "$LOG"; then
  echo "fault thresholds missed (ours):"
  grep -oE 'FAULT-ASSERTION .*' "$LOG" | cut -c1-300 | sed 's/^/  /'
fi
if grep -qE 'FAULT-GOAL-MISSED ' "$LOG"; then
  echo "fault goals not met yet (ours; reported, not failed; see README):"
  grep -oE 'FAULT-GOAL-MISSED .*' "$LOG" | cut -c1-300 | sed 's/^/  /'
fi
for tag in TOKENREVIEW-COUNTS LEASE-TIMING HA-LB EGRESS METRICS-DIFF PROMTOOL; do
  if grep -qE "${tag}\\[|${tag}:" "$LOG"; then
    grep -oE "${tag}(\\[|:).*" "$LOG" | cut -c1-400 | sed 's/^/  /'
  fi
done
if grep -q 'KNOWN-UPSTREAM-DIFF' "$LOG"; then
  echo "known upstream differences observed (expected, not failures):"
  grep -o 'KNOWN-UPSTREAM-DIFF.*' "$LOG" | cut -c1-200 | sed 's/^/  /'
fi

# Last, so that a log cut in the middle (CI keeps the head and the tail) still shows why: each
# failed test with the last lines its own log wrote. go test -v does not tell a t.Errorf line
# from a t.Logf one, but it names the test before every stretch of its output (=== RUN/CONT/
# NAME), and a failing assertion is among the test's last lines.
if grep -qE -- '--- FAIL' "$LOG"; then
  echo "why it failed (each failed test, then the last lines of its own log):"
  awk '
    /^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; next }
    /^ *--- (FAIL|PASS|SKIP): / {
      if ($2 == "FAIL:") { name = $3; if (!(name in failed)) { failed[name] = 1; order[++n] = name } }
      next
    }
    /_test\.go:[0-9]+: / && !/---- last lines of / && cur != "" {
      k = ++count[cur]; lines[cur, k] = $0
      if (k > 6) delete lines[cur, k - 6]
    }
    END {
      for (i = 1; i <= n; i++) {
        name = order[i]; print "  --- FAIL: " name
        for (k = count[name] - 5; k <= count[name]; k++)
          if (k >= 1 && ((name, k) in lines)) { l = lines[name, k]; sub(/^ */, "", l); print "      " substr(l, 1, 300) }
      }
    }' "$LOG" | head -n 60
fi

if ! grep -qE -- '--- (PASS|FAIL): Test(Interop|Kube|AgentInterop|Faults)/' "$LOG"; then
  echo "run.sh: no scenario ran" >&2
  rc=1
fi
if [[ "${CI:-}" == "true" ]] && grep -qE -- '--- SKIP' "$LOG"; then
  echo "run.sh: CI=true and some tests were skipped -> failing" >&2
  rc=1
fi
echo "run.sh: exit $rc"
exit "$rc"
