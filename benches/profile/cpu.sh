#!/usr/bin/env bash
# Instructions of one short tunnel, by component, from callgrind.
#
#   benches/profile/cpu.sh [single|reusable|connect] [K=400] [PARALLEL=8]  > table.md
#
# Runs our server (release as shipped, jemalloc, plus line tables: see common.sh) under
# callgrind; after a 20-tunnel warm-up the counters are zeroed, K short tunnels run (dial,
# 1 KiB each way, close; PARALLEL at a time, the upstream agent behind the server) and the
# counters are dumped, so startup and shutdown are not in it. cg_group.py groups the dump.
# Output files stay in $OUT (default target/profile-cpu).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WHAT="${1:-single}"
K="${2:-400}"
PAR="${3:-8}"
OUT="${OUT:-$ROOT/target/profile-cpu}"
mkdir -p "$OUT"
BENCH="$(bench_bin)"
SERVER="$(server_bin jemalloc)"
UP="$(upstream_dir)"
rm -f "$OUT/callgrind.$WHAT".*
log "callgrind: $WHAT x$K"
nice -n 10 "$BENCH" drive --server-bin "$SERVER" --upstream-dir "$UP" --out "$OUT" \
  --what "$WHAT" --count "$K" --parallel "$PAR" \
  --wrap "valgrind --tool=callgrind --callgrind-out-file=$OUT/callgrind.$WHAT.%p" \
  --before 'callgrind_control -z $PID >/dev/null' --after 'callgrind_control -d $PID >/dev/null' \
  >"$OUT/drive.$WHAT.json" 2>"$OUT/drive.$WHAT.log" || { cat "$OUT/drive.$WHAT.log" >&2; exit 1; }
DUMP="$(ls "$OUT/callgrind.$WHAT".*.1 | head -1)"
echo "Server: \`$SERVER\` (${SERVER_BIN:+given by SERVER_BIN; }work tree $(cd "$ROOT" && git describe --always --dirty)); \`benches/profile/cpu.sh $WHAT $K $PAR\`; $(date -u +%F)."
echo
python3 "$PROFILE_DIR/cg_group.py" "$DUMP" "$K" tunnel
