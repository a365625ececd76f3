# shellcheck shell=bash
# Sourced by packaging/nspawn-test.sh and packaging/oci/test.sh: runs upstream's
# proxy-test-client (from INTEROP_BIN_DIR, "$B") with async preemption turned off.
#
# Why: the test client's UDS dialer calls signal.Notify with no signal list and closes its
# connection to the proxy on whatever signal arrives. That includes SIGURG, which the Go
# runtime sends itself to preempt a goroutine that has run for 10 ms, so on a busy machine
# a request could fail with `"connection closed"` and EOF right after its DIAL_RSP, whatever
# the server did. Measured with a restart-under-load loop on the host (one tunnel every
# 50 ms per worker, three workers, 30 to 50 restarts): 6 to 59 failed requests per run of
# 4,700 to 7,600 as shipped (four runs), none in 7,361 with GODEBUG=asyncpreemptoff=1.
# kube-apiserver's client has no such handler; this only keeps the test client from failing
# on its own signal.
upstream_test_client() { GODEBUG=asyncpreemptoff=1 "$B/proxy-test-client" "$@"; }
