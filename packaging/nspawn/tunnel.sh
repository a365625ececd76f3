# shellcheck shell=bash
# packaging/nspawn-test.sh, sourced: tunnels through the packaged server and agents (with INTEROP_BIN_DIR).
# Shares the entry script's variables and helpers; runs in its shell, in this order.

# ------------------------------------------------------------------------------ tunnel (optional)
INTEROP=0
if [[ "${REQUIRE_TUNNEL:-}" == 1 || "${CI:-}" == true ]] && [[ -z "${INTEROP_BIN_DIR:-}" ]]; then
  fail "tunnel checks required (REQUIRE_TUNNEL=1 or CI=true) but INTEROP_BIN_DIR is not set"
fi
if [[ -n "${INTEROP_BIN_DIR:-}" ]]; then
  step_begin "upstream agent on the host -> container; tunnel over the UDS"
  INTEROP=1
  B="$INTEROP_BIN_DIR"
  for b in proxy-agent http-test-server proxy-test-client; do
    [[ -x "$B/$b" ]] || { fail "INTEROP_BIN_DIR ($B) has no executable $b: tunnel checks cannot run"; INTEROP=0; }
  done
  if [[ $INTEROP -eq 1 ]]; then
    "$B/http-test-server" --server-port="$TEST_SERVER_PORT" >"$SCRATCH/host/http-test-server.log" 2>&1 &
    HOST_PIDS+=($!)
    "$B/proxy-agent" --ca-cert="$SCRATCH/certs/ca.crt" --agent-cert="$SCRATCH/certs/agent.crt" \
      --agent-key="$SCRATCH/certs/agent.key" --proxy-server-host=127.0.0.1 --proxy-server-port="$AGENT_PORT" \
      --agent-id=nspawn-agent --agent-identifiers=ipv4=127.0.0.1 \
      --health-server-host=127.0.0.1 --health-server-port="$AGENT_HEALTH_PORT" \
      --admin-bind-address=127.0.0.1 --admin-server-port="$AGENT_ADMIN_PORT" \
      >"$SCRATCH/host/proxy-agent.log" 2>&1 &
    AGENT_PID=$!; HOST_PIDS+=("$AGENT_PID")
    check "agent connected (server /readyz 200)" wait_for 20 code_is 200 "http://127.0.0.1:$HEALTH_PORT/readyz"
    UDS_HOST="$CROOT/run/konnectivity-server/konnectivity-server.socket"
    tunnel_get() { # <request-path> <log name> [request host]: GET through a fresh tunnel; the body must be
      # the success page (proxy-test-client exits 0 on any HTTP status, so the body is checked).
      # Host 127.0.0.1 routes to the upstream agent, localhost to ours (destHost).
      upstream_test_client --mode=grpc --proxy-host= --proxy-port=0 --proxy-uds="$UDS_HOST" --request-host="${3:-127.0.0.1}" \
        --request-port="$TEST_SERVER_PORT" --request-path="$1" >"$SCRATCH/host/proxy-test-client-$2.log" 2>&1 \
        && grep -q 'The success test page' "$SCRATCH/host/proxy-test-client-$2.log"
    }
    check "proxy-test-client GET /success through the tunnel (UDS -> server -> agent -> host)" tunnel_get success first
    check "GET /success through our server and our agent (UDS -> server -> konnectivity-agent.service -> localhost)" \
      tunnel_get success first-ours localhost
    established() { # <n>: the server counts exactly n established tunnels
      curl -s --max-time 3 "http://127.0.0.1:$HEALTH_PORT/metrics" |
        grep -qx "konnectivity_network_proxy_server_established_connections $1"
    }
    # Starts the 10 s /sleep request through a fresh tunnel in the background (LONG_PID) and
    # waits until the server counts it as established, so the step after it really happens
    # while the tunnel is open.
    long_tunnel_open() { # <log name> [request host] [established count to wait for]
      T_LONG=$(now); tunnel_get sleep "$1" "${2:-127.0.0.1}" & LONG_PID=$!
      check "long tunnel ($1) established before the step under test (established_connections ${3:-1})" \
        wait_for 8 established "${3:-1}"
    }
  fi
  step_end
fi
