# Sourced by tests/interop/build.sh and tests/kube/build.sh: one cache of built binaries
# outside the work tree, keyed by the caller, shared by both.
#
#   cache_setup NAME KEY BINARY...   OUT=${XDG_CACHE_HOME:-$HOME/.cache}/NAME/KEY
#   cache_reuse_or_lock              a complete entry: print OUT on stdout and exit 0; otherwise
#                                    take NAME/.lock (waiting for a concurrent build, then
#                                    reusing its entry) and make TMP, removed on exit
#   cache_commit                     mark TMP complete, rename it into place as OUT, print OUT
#
# An entry is complete when it has the marker .complete and every BINARY is executable.
# Entries are renamed into place whole, so a reader never sees a half-built one. Old keys are
# never garbage-collected: rm -rf the directory.

cache_setup() {
  CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/$1"
  OUT="$CACHE_ROOT/$2"
  shift 2
  CACHE_BINARIES=("$@")
}

cache_complete() {
  [[ -f "$OUT/.complete" ]] || return 1
  local b
  for b in "${CACHE_BINARIES[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done
}

cache_reuse_or_lock() {
  if cache_complete; then
    echo "$(basename "$0"): cache hit ($OUT)" >&2
    echo "$OUT"
    exit 0
  fi
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.lock"
  if ! flock -n 9; then
    echo "$(basename "$0"): another build holds $CACHE_ROOT/.lock, waiting" >&2
    flock 9
  fi
  if cache_complete; then # built by whoever held the lock
    echo "$(basename "$0"): cache hit after wait ($OUT)" >&2
    echo "$OUT"
    exit 0
  fi
  TMP="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
  trap 'rm -rf "$TMP"' EXIT
}

cache_commit() {
  touch "$TMP/.complete"
  chmod 755 "$TMP"
  rm -rf "$OUT" # an incomplete entry (should not happen: entries are renamed into place)
  mv -T "$TMP" "$OUT"
  trap - EXIT
  echo "$OUT"
}
