#!/usr/bin/env bash
# Heap of one idle tunnel or one idle agent, by component, from dhat (valgrind --tool=dhat).
#
#   benches/profile/heap.sh idle   [N_BASE=50] [N_MANY=550]  > table.md
#   benches/profile/heap.sh agents [N_BASE=20] [N_MANY=320]  > table.md
#   benches/profile/heap.sh connect-idle [N_BASE=50] [N_MANY=550]  > table.md
#
# Runs our server (release + line tables, glibc malloc: see common.sh) under dhat twice, with
# N_BASE and with N_MANY idle single-use gRPC tunnels (HTTP-CONNECT ones, or connected
# agents) held, and prints
# (bytes live at the heap's peak with N_MANY − with N_BASE) / (N_MANY − N_BASE) per component
# (dh_group.py). The peak is reached while all are held. Output files stay in $OUT
# (default target/profile-heap).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
WHAT="${1:-idle}"
if [[ "$WHAT" == agents ]]; then N0="${2:-20}"; N1="${3:-320}"; else N0="${2:-50}"; N1="${3:-550}"; fi
OUT="${OUT:-$ROOT/target/profile-heap}"
mkdir -p "$OUT"
BENCH="$(bench_bin)"
SERVER="$(server_bin glibc)"
UP="$(upstream_dir)"
for n in "$N0" "$N1"; do
  rm -f "$OUT/dhat.$WHAT.$n"
  log "dhat: $WHAT x$n"
  nice -n 10 "$BENCH" drive --server-bin "$SERVER" --upstream-dir "$UP" --out "$OUT" \
    --what "$WHAT" --count "$n" \
    --wrap "valgrind --tool=dhat --read-inline-info=no --dhat-out-file=$OUT/dhat.$WHAT.$n" \
    >"$OUT/drive.$WHAT.$n.json" 2>"$OUT/drive.$WHAT.$n.log" \
    || { cat "$OUT/drive.$WHAT.$n.log" >&2; exit 1; }
done
LABEL=tunnel; [[ "$WHAT" == agents ]] && LABEL=agent
echo "Server: \`$SERVER\` (${SERVER_BIN:+given by SERVER_BIN; }work tree $(cd "$ROOT" && git describe --always --dirty)); \`benches/profile/heap.sh $WHAT $N0 $N1\`; $(date -u +%F)."
echo
python3 "$PROFILE_DIR/dh_group.py" "$LABEL" "$OUT/dhat.$WHAT.$N0" "$N0" "$OUT/dhat.$WHAT.$N1" "$N1"
