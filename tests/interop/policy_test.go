package interop

// Destination policy with the unchanged upstream peers: upstream's konnectivity-client and
// proxy-agent against our server with --deny-destinations (a denied range, a denied port and
// a denied name, on the gRPC and the HTTP-CONNECT frontend), a reload that changes the policy
// of the next dial and not of an open tunnel, and our agent refusing a name whose addresses
// are denied, behind either server. Upstream has no policy: these rows are ours only.

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

const (
	metricRefused      = "konnectivity_network_proxy_server_destinations_refused_total"
	metricAgentRefused = "konnectivity_network_proxy_agent_destinations_refused_total"
	notAllowed         = "destination not allowed by policy"
	connect403         = "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
)

// deniedDials: a destination for each kind of rule in policyRules, and the rule that refuses it.
var deniedDials = []struct{ addr, rule string }{
	{"10.20.30.40:443", "10.0.0.0/8"},
	{"127.0.0.1:22", "127.0.0.1:1-1023"},
	{"vault.policy.test:8200", "*.policy.test"},
}

const policyRules = "10.0.0.0/8,127.0.0.1:1-1023,*.policy.test"

func policyScenarios() []scenarioX {
	withRules := func(mode string) func(string) envOpts {
		return func(string) envOpts {
			return envOpts{mode: mode, extraArgs: []string{"--deny-destinations=" + policyRules}}
		}
	}
	return []scenarioX{
		{scenario: scenario{"policy_grpc_denied", scPolicyGRPC}, opts: withRules("grpc"), oursOnly: true},
		{scenario: scenario{"policy_http_connect_denied", scPolicyHTTPConnect}, opts: withRules("http-connect"), oursOnly: true},
		{scenario: scenario{"policy_reload_next_dial_only", scPolicyReload}, oursOnly: true, opts: func(string) envOpts {
			return envOpts{config: func(e *env) string { return baseConfig(e, "10s").toml() }, notify: true}
		}},
	}
}

// refusedCount is the server's destinations_refused_total for one rule.
func (e *env) refusedCount(t *testing.T, rule string) float64 {
	t.Helper()
	m, err := e.serverMetrics()
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	return m.sum(metricRefused, fmt.Sprintf("rule=%q", rule))
}

// agentSawDial: whether the upstream agent's log names a DIAL_REQ for addr.
func agentSawDial(a *agentProc, addr string) bool {
	return strings.Contains(a.log(), fmt.Sprintf("dialAddress=%q", addr))
}

// checkAgentHeard: the agent's log names the DIAL_REQ for an allowed addr, so its silence about
// the denied ones means something.
func checkAgentHeard(t *testing.T, a *agentProc, addr string) {
	t.Helper()
	eventually(t, 10*time.Second, "the agent logged the allowed DIAL_REQ", func() (bool, string) {
		return agentSawDial(a, addr), "no dialAddress=" + addr + " in its log"
	})
}

func scPolicyGRPC(t *testing.T, e *env) {
	a := e.withAgent("a1", "")
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	for _, d := range deniedDials {
		conn, _, err := e.dial(ctx, d.addr)
		if err == nil {
			conn.Close()
			t.Fatalf("dial %s: allowed, want %q", d.addr, notAllowed)
		}
		if !strings.Contains(err.Error(), notAllowed) {
			t.Fatalf("dial %s: %v, want an error containing %q", d.addr, err, notAllowed)
		}
		if n := e.refusedCount(t, d.rule); n != 1 {
			t.Fatalf("%s{rule=%q} = %v after refusing %s, want 1", metricRefused, d.rule, n, d.addr)
		}
	}
	// An allowed destination still works, and the agent heard of none of the denied ones.
	allowed := e.startTestServer()
	libSingleRequest(t, e, allowed)
	checkAgentHeard(t, a, allowed)
	for _, d := range deniedDials {
		if agentSawDial(a, d.addr) {
			t.Fatalf("the agent received a DIAL_REQ for denied %s", d.addr)
		}
	}
}

func scPolicyHTTPConnect(t *testing.T, e *env) {
	a := e.withAgent("a1", "")
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	for _, d := range deniedDials {
		c, hdr, err := e.connectRaw(ctx, d.addr, "127.0.0.1", nil)
		if err != nil {
			t.Fatalf("CONNECT %s: %v (got %q)", d.addr, err, hdr)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		body, err := io.ReadAll(c)
		c.Close()
		if string(hdr) != connect403 || string(body) != notAllowed+"\r\n" || err != nil {
			t.Fatalf("CONNECT %s: got %q%q (%v), want %q%q and the connection closed", d.addr, hdr, body, err, connect403, notAllowed+"\r\n")
		}
		if n := e.refusedCount(t, d.rule); n != 1 {
			t.Fatalf("%s{rule=%q} = %v after refusing %s, want 1", metricRefused, d.rule, n, d.addr)
		}
	}
	if err := fetch(ctx, e.connectDialer(), e.far.addr, 64<<10, 3); err != nil {
		t.Fatalf("CONNECT to an allowed destination: %v", err)
	}
	checkAgentHeard(t, a, e.far.addr)
	for _, d := range deniedDials {
		if agentSawDial(a, d.addr) {
			t.Fatalf("the agent received a DIAL_REQ for denied %s", d.addr)
		}
	}
}

// scPolicyReload: a tunnel to the far end is open when a reload starts denying the far end's
// address; the next dial there is refused and the open tunnel still carries a checksummed
// transfer. A reload back to no policy lets the dial through again.
func scPolicyReload(t *testing.T, e *env) {
	e.expectStartReady(t)
	e.withAgent("a1", "")
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	open, _, err := e.dial(ctx, e.far.addr)
	if err != nil {
		t.Fatalf("dial %s before the reload: %v", e.far.addr, err)
	}
	defer open.Close()

	base := baseConfig(e, "10s")
	denied := base
	denied.extra = `deny_destinations = ["127.0.0.0/8"]` + "\n"
	e.writeConfig(t, denied)
	e.reload(t)
	if conn, _, err := e.dial(ctx, e.far.addr); err == nil {
		conn.Close()
		t.Fatalf("dial %s after the reload that denies 127.0.0.0/8: allowed", e.far.addr)
	} else if !strings.Contains(err.Error(), notAllowed) {
		t.Fatalf("dial %s after the reload: %v, want %q", e.far.addr, err, notAllowed)
	}
	if n := e.refusedCount(t, "127.0.0.0/8"); n != 1 {
		t.Fatalf("%s{rule=\"127.0.0.0/8\"} = %v, want 1", metricRefused, n)
	}
	// The tunnel opened before the reload is not subject to it.
	already := func(context.Context, string) (net.Conn, error) { return open, nil }
	if err := fetch(ctx, already, "", 1<<20, 11); err != nil {
		t.Fatalf("transfer on the tunnel opened before the reload: %v", err)
	}

	e.writeConfig(t, base)
	e.reload(t)
	if err := fetch(ctx, e.singleUse(), e.far.addr, 64<<10, 5); err != nil {
		t.Fatalf("dial after the reload that lifts the policy: %v", err)
	}
}

// scAgentPolicyName: our agent with --deny-destinations for the test server's port on both
// loopback addresses refuses a dial to `localhost:<port>` after resolving it (the server only
// sees a name), with the DIAL_RSP error and its own counter; other ports still work.
func scAgentPolicyName(t *testing.T, e *env) {
	addr := e.startTestServer()
	_, port, _ := net.SplitHostPort(addr)
	rules := fmt.Sprintf("127.0.0.1:%s,[::1]:%s", port, port)
	a := e.startAgentArgs("a1", "", e.agentPort, "--deny-destinations="+rules)
	e.waitAgentConnected(a)
	e.waitReady()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	conn, _, err := e.dial(ctx, "localhost:"+port)
	if err == nil {
		conn.Close()
		t.Fatalf("dial localhost:%s: allowed, want %q", port, notAllowed)
	}
	if !strings.Contains(err.Error(), notAllowed) {
		t.Fatalf("dial localhost:%s: %v, want an error containing %q", port, err, notAllowed)
	}
	m, err := a.metrics()
	if err != nil {
		t.Fatalf("agent metrics: %v", err)
	}
	// The first address the name resolved to (127.0.0.1 or ::1) names the rule.
	if v := m.sum(metricAgentRefused); v != 1 {
		t.Fatalf("%s = %v (over its rules), want 1", metricAgentRefused, v)
	}
	if err := fetch(ctx, e.singleUse(), e.far.addr, 64<<10, 9); err != nil {
		t.Fatalf("dial to an allowed port: %v", err)
	}
}
