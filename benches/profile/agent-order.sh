#!/usr/bin/env bash
# Regenerates src/bin/konnectivity-agent.symbol-order: the agent's functions that run while it
# idles, which build.rs has the linker place next to each other (see that file's header).
#
#   benches/profile/agent-order.sh [IDLE_SECS=30] [RUNS=3]
#
# Runs a release `konnectivity-server --dev` and, under callgrind, a release `konnectivity-agent
# --dev` connected to it with the benchmark's sync flags; records every agent function that
# runs from the agent's last call of drop_pages (the release of its start-up pages: what runs
# after it maps its pages again) over IDLE_SECS of idling, then over one round of /healthz,
# /readyz and /metrics requests (what a supervisor and a scraper do to an idle agent). RUNS
# agents one after another, since one run can miss what happens rarely (a keepalive, an
# allocator purge); the list is the union. Idle functions come first, then the probes' own,
# each set sorted by name.
# Run it again after a toolchain or dependency update: symbol names carry a hash that such an
# update changes, and a name the build no longer has is skipped (memory, never correctness).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
IDLE_SECS="${1:-30}"
RUNS="${2:-3}"
OUT="${OUT:-$ROOT/target/profile-order}"
ORDER="$ROOT/src/bin/konnectivity-agent.symbol-order"
rm -rf "$OUT"; mkdir -p "$OUT/state" "$OUT/run"
# As shipped: the release flags of every release build, and the programs alone (built beside
# the benchmark tool, the dependencies' features differ, and so do the names of the functions).
# shellcheck source=../../packaging/release-env.sh
. "$ROOT/packaging/release-env.sh"
(cd "$ROOT" && nice -n 10 cargo build --release --bins >&2)
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"

# Ports in [1024, 49151] that nothing listens on now.
free_ports() {
  python3 - "$1" <<'EOF'
import random, socket, sys
got = set()
while len(got) < int(sys.argv[1]):
    p = random.randint(1024, 49151)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
    got.add(p)
print(*got)
EOF
}
read -r AGENT_PORT HEALTH ADMIN <<<"$(free_ports 3)"
pids=()
# KILL: a first SIGTERM only drains an agent (as upstream's); nothing here needs a clean exit.
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
export XDG_STATE_HOME="$OUT/state" XDG_RUNTIME_DIR="$OUT/run"
"$BIN/konnectivity-server" --dev --agent-port="$AGENT_PORT" --health-port="$HEALTH" \
  --admin-port="$ADMIN" >"$OUT/server.log" 2>&1 &
pids+=($!)
until grep -q "is serving" "$OUT/server.log"; do sleep 0.2; done

for run in $(seq "$RUNS"); do
  read -r A_HEALTH A_ADMIN <<<"$(free_ports 2)"
  # Zeroed on each entry of drop_pages: the last zeroing is the last mapping released.
  valgrind --tool=callgrind --demangle=no --callgrind-out-file="$OUT/callgrind.$run.out" \
    '--zero-before=*startup_pages10drop_pages*' \
    "$BIN/konnectivity-agent" --dev --proxy-server-port="$AGENT_PORT" --agent-id="order$run" \
    --sync-interval=100ms --sync-interval-cap=1s --health-server-host=127.0.0.1 \
    --health-server-port="$A_HEALTH" --admin-server-port="$A_ADMIN" >"$OUT/agent.$run.log" 2>&1 &
  AGENT=$!
  pids+=("$AGENT")
  for _ in $(seq 600); do grep -q "released the pages of start-up code" "$OUT/agent.$run.log" && break; sleep 0.2; done
  grep -q "released the pages of start-up code" "$OUT/agent.$run.log" \
    || { log "the agent did not connect"; cat "$OUT/agent.$run.log" >&2; exit 1; }

  log "run $run of $RUNS: recording ${IDLE_SECS}s of idling"
  sleep "$IDLE_SECS"
  callgrind_control -d "$AGENT" >/dev/null 2>&1
  log "run $run of $RUNS: recording the probes"
  callgrind_control -z "$AGENT" >/dev/null 2>&1
  for path in healthz readyz metrics; do
    curl -fsS -o /dev/null "http://127.0.0.1:$A_HEALTH/$path"
  done
  sleep 1
  callgrind_control -d "$AGENT" >/dev/null 2>&1
  sleep 1
  kill -KILL "$AGENT"
  wait "$AGENT" 2>/dev/null || true
done

python3 - "$OUT" "$ORDER" "$RUNS" "$BIN/konnectivity-agent" <<'EOF'
import re, sys
import subprocess
out, order, runs, agent = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

def agent_functions(path):
    """Functions of the agent's own object with a cost block in one callgrind dump."""
    names, objects, fn_object, ob = {}, {}, {}, None
    for line in open(path):
        m = re.match(r"^(c?ob|c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if not m:
            continue
        kind, ident, name = m.groups()
        if kind.endswith("ob"):
            if name:
                objects[ident] = name
            if kind == "ob":
                ob = ident
        else:
            if name:
                names[ident] = name
            if kind == "fn":
                fn_object[ident] = ob
    # Not symbols: callgrind's own names such as "(below main)".
    return {names[f] for f, o in fn_object.items()
            if f in names and objects.get(o, "").endswith("/konnectivity-agent")
            and not names[f].startswith("(")}

# callgrind numbers its dumps: the first is the idle window, the second the probes.
idle, probes = set(), set()
for run in range(1, runs + 1):
    idle |= agent_functions(f"{out}/callgrind.{run}.out.1")
    probes |= agent_functions(f"{out}/callgrind.{run}.out.2")
probes -= idle
# Valgrind's CPU has no VAES or VPCLMULQDQ, so ring's AES-GCM runs its AES-NI code under
# callgrind; a CPU that has them runs the AVX2 code (and its Rust callers) instead.
if any("aes_gcm" in name for name in idle):
    symbols = subprocess.run(["nm", "--defined-only", agent], capture_output=True, text=True,
                             check=True).stdout.split()
    idle |= {s for s in symbols
             if re.match(r"ring_core_\w*_(vaes|vpclmulqdq)_avx2", s)
             or re.match(r"_ZN4ring4aead7aes_gcm12(open|seal)_strided", s)}
with open(order, "w") as f:
    f.write("# The agent's functions that run while it idles at the default verbosity, then those\n"
            "# of /healthz, /readyz and /metrics: build.rs has the linker place them first in its\n"
            "# text. Generated by benches/profile/agent-order.sh; regenerate it after a toolchain\n"
            "# or dependency update.\n")
    for name in sorted(idle) + sorted(probes):
        f.write(name + "\n")
print(f"{len(idle)} idle functions, {len(probes)} more for the probes: {order}", file=sys.stderr)
EOF
