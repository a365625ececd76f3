# Shared by the profiling scripts (sourced). Builds what they need, prints paths.
#   SERVER_BIN   use this server binary instead of building one
#   KONN_BENCH   use this konn_bench binary instead of building one
set -euo pipefail
PROFILE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$PROFILE_DIR/../.." && pwd)"
log() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }

# The load driver (`konn_bench drive`); a debug build is enough, it is not what is measured.
bench_bin() {
  if [[ -n "${KONN_BENCH:-}" ]]; then echo "$KONN_BENCH"; return; fi
  local json
  json="$(cd "$ROOT" && nice -n 10 cargo build --bench konn_bench --message-format=json-render-diagnostics 2>/dev/null)"
  grep '"reason":"compiler-artifact"' <<<"$json" | grep '"name":"konn_bench"' \
    | grep -o '"executable":"[^"]*"' | tail -1 | sed 's/^"executable":"//; s/"$//'
}

# Our server as shipped (release: fat LTO, one codegen unit) plus line tables and symbols, so
# callgrind and dhat can name every inlined frame's file. $1 = jemalloc (as shipped) | glibc
# (dhat and heaptrack only see the system malloc). Copied aside: both variants share a target dir.
server_bin() {
  if [[ -n "${SERVER_BIN:-}" ]]; then echo "$SERVER_BIN"; return; fi
  local variant="$1" feat=()
  [[ "$variant" == glibc ]] && feat=(--no-default-features)
  (cd "$ROOT" && CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_PROFILE_RELEASE_STRIP=none \
    nice -n 10 cargo build --release --bin konnectivity-server --target-dir target/profiling "${feat[@]}" >&2)
  cp "$ROOT/target/profiling/release/konnectivity-server" "$ROOT/target/profiling/konnectivity-server-$variant"
  echo "$ROOT/target/profiling/konnectivity-server-$variant"
}

upstream_dir() {
  "$ROOT/tests/interop/build.sh" | tail -1
}

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
