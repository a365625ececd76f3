#!/usr/bin/env bash
# System calls and context switches of one short tunnel, by call and by thread, from perf.
#
#   benches/profile/syscalls.sh [single|reusable|connect] [K=2000] [PARALLEL=16]  > table.md
#
# Runs our server (release as shipped, jemalloc, plus line tables: see common.sh; or
# SERVER_BIN) with the upstream agent behind it. After a 20-tunnel warm-up, `perf trace -s`
# and `perf stat` attach to the server, K short tunnels run (dial, 1 KiB each way, close;
# PARALLEL at a time) and both detach, so startup and shutdown are not in it. Every thread of
# the server is counted: the runtime's workers, the log writer and the blocking pool.
# Output files stay in $OUT (default target/profile-syscalls).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WHAT="${1:-single}"
K="${2:-2000}"
PAR="${3:-16}"
OUT="${OUT:-$ROOT/target/profile-syscalls}"
mkdir -p "$OUT"
BENCH="$(bench_bin)"
SERVER="$(server_bin jemalloc)"
UP="$(upstream_dir)"
TRACE="$OUT/trace.$WHAT.txt" STAT="$OUT/stat.$WHAT.txt"
rm -f "$TRACE" "$STAT" "$OUT"/*.pid
# Both tools stop on SIGINT and then write their summaries; the hook waits for that.
BEFORE="perf trace -s -p \$PID -o $TRACE >/dev/null 2>&1 & echo \$! > $OUT/trace.pid;
  perf stat -e raw_syscalls:sys_enter,context-switches -p \$PID -o $STAT >/dev/null 2>&1 & echo \$! > $OUT/stat.pid;
  sleep 2"
AFTER="kill -INT \$(cat $OUT/trace.pid) \$(cat $OUT/stat.pid);
  while kill -0 \$(cat $OUT/trace.pid) 2>/dev/null || kill -0 \$(cat $OUT/stat.pid) 2>/dev/null; do sleep 0.2; done"
log "perf: $WHAT x$K"
nice -n 10 "$BENCH" drive --server-bin "$SERVER" --upstream-dir "$UP" --out "$OUT" \
  --what "$WHAT" --count "$K" --parallel "$PAR" --before "$BEFORE" --after "$AFTER" \
  >"$OUT/drive.$WHAT.json" 2>"$OUT/drive.$WHAT.log" || { cat "$OUT/drive.$WHAT.log" >&2; exit 1; }
echo "Server: \`$SERVER\` (${SERVER_BIN:+given by SERVER_BIN; }work tree $(cd "$ROOT" && git describe --always --dirty)); \`benches/profile/syscalls.sh $WHAT $K $PAR\`; $(date -u +%F)."
echo
python3 "$PROFILE_DIR/sc_group.py" "$TRACE" "$STAT" "$K" tunnel
