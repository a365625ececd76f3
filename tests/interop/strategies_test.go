package interop

// Proxy strategies (--proxy-strategies=destHost,default and destHost,defaultRoute) with two
// upstream agents that declare different identifiers. Which agent served a dial is read from
// each agent's open_endpoint_connections while the tunnels are held.

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	identsA = "host=a.test&host=localhost&ipv4=127.0.0.2"
	identsB = "ipv4=127.0.0.3&default-route=true"
)

func strategyScenarios() []scenarioX {
	return []scenarioX{
		{scenario: scenario{"strategies_desthost_default", scStrategiesDestHostDefault}, parallel: true, opts: func(string) envOpts {
			return envOpts{extraArgs: []string{"--proxy-strategies=destHost,default"}}
		}},
		{scenario: scenario{"strategies_desthost_defaultroute", scStrategiesDestHostDefaultRoute}, parallel: true, opts: func(string) envOpts {
			return envOpts{extraArgs: []string{"--proxy-strategies=destHost,defaultRoute"}}
		}},
	}
}

// agentOpts changes how startAgentWith starts an upstream agent.
type agentOpts struct {
	identifiers string   // default host=localhost&ipv4=127.0.0.1
	serverHost  string   // default e.agentHost
	healthHost  string   // default 127.0.0.1
	prefix      []string // command prefix (e.g. ip netns exec NS)
}

func (e *env) startAgentWith(id string, o agentOpts) *agentProc {
	e.t.Helper()
	cs := getCerts(e.t)
	if o.identifiers == "" {
		o.identifiers = "host=localhost&ipv4=127.0.0.1"
	}
	if o.serverHost == "" {
		o.serverHost = e.agentHost
	}
	if o.healthHost == "" {
		o.healthHost = "127.0.0.1"
	}
	e.nAgents++
	hp, ap := freePort(e.t), freePort(e.t)
	args := []string{
		"--ca-cert=" + cs.ca,
		"--agent-cert=" + cs.agentCert,
		"--agent-key=" + cs.agentKey,
		"--proxy-server-host=" + o.serverHost,
		fmt.Sprintf("--proxy-server-port=%d", e.agentPort),
		"--agent-id=" + id,
		"--agent-identifiers=" + o.identifiers,
		"--health-server-host=" + o.healthHost,
		fmt.Sprintf("--health-server-port=%d", hp),
		"--admin-bind-address=" + o.healthHost,
		fmt.Sprintf("--admin-server-port=%d", ap),
	}
	bin := e.bins.agent
	if len(o.prefix) > 0 {
		args = append(append(append([]string{}, o.prefix[1:]...), bin), args...)
		bin = o.prefix[0]
	}
	p := startProc(e.t, fmt.Sprintf("agent%d-%s", e.nAgents, id), e.dir, bin, args...)
	return &agentProc{proc: p, id: id, healthPort: hp, healthHost: o.healthHost}
}

// landOn opens n held tunnels to target and returns how many landed on each agent.
func landOn(t *testing.T, e *env, target string, n int, agents ...*agentProc) []float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		conn, _, err := e.dial(ctx, target)
		if err != nil {
			t.Fatalf("dial %s: %v", target, err)
		}
		held = append(held, conn)
		if _, err := fmt.Fprintf(conn, "HOLD\n"); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	var got []float64
	eventually(t, 10*time.Second, fmt.Sprintf("%d endpoint connections to %s", n, target), func() (bool, string) {
		got = endpointCounts(t, agents...)
		sum := 0.0
		for _, v := range got {
			sum += v
		}
		return sum == float64(n), fmt.Sprint(got)
	})
	for _, c := range held {
		c.Close()
	}
	held = nil
	waitEndpointCounts(t, make([]float64, len(agents)), agents...)
	return got
}

func expectLanding(t *testing.T, e *env, what, target string, n int, want []float64, agents ...*agentProc) {
	t.Helper()
	got := landOn(t, e, target, n, agents...)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: %d dials to %s landed on agents (a, b) = %v, want %v", what, n, target, got, want)
	}
	t.Logf("%s: %s -> %v", what, target, got)
}

// strategyAgents starts a (host=a.test, host=localhost, ipv4=127.0.0.2) and b (ipv4=127.0.0.3,
// default-route=true) and far ends on 127.0.0.2 and 127.0.0.3.
func strategyAgents(t *testing.T, e *env) (a, b *agentProc, farA, farB string) {
	a = e.startAgentWith("strat-a", agentOpts{identifiers: identsA})
	b = e.startAgentWith("strat-b", agentOpts{identifiers: identsB})
	e.waitAgentConnected(a)
	e.waitAgentConnected(b)
	e.waitServerAgentStreams(2)
	e.waitReady()
	return a, b, startFarEndOn(t, "127.0.0.2").addr, startFarEndOn(t, "127.0.0.3").addr
}

func scStrategiesDestHostDefault(t *testing.T, e *env) {
	a, b, farA, farB := strategyAgents(t, e)
	expectLanding(t, e, "destHost ipv4", farA, 4, []float64{4, 0}, a, b)
	expectLanding(t, e, "destHost ipv4", farB, 4, []float64{0, 4}, a, b)
	_, port, _ := net.SplitHostPort(e.far.addr)
	expectLanding(t, e, "destHost host", "localhost:"+port, 3, []float64{3, 0}, a, b)
	got := landOn(t, e, e.far.addr, 8, a, b)
	t.Logf("no destHost match -> default: %v", got)

	// Drain b: the default strategy avoids it; an exact destHost match still gets it.
	b.signal(syscall.SIGTERM)
	eventually(t, 10*time.Second, "agent strat-b received SIGTERM", func() (bool, string) {
		return strings.Contains(b.log(), "Received first signal"), "not yet"
	})
	// The agent sends DRAIN only after the next packet on its stream: probe it.
	eventually(t, 15*time.Second, "strat-b sent DRAIN", func() (bool, string) {
		landOn(t, e, farB, 1, a, b)
		return strings.Contains(b.log(), "drain agent client"), "no 'drain agent client' log line yet"
	})
	time.Sleep(200 * time.Millisecond) // the DRAIN packet is in flight after the log line
	expectLanding(t, e, "default with b draining", e.far.addr, 8, []float64{8, 0}, a, b)
	expectLanding(t, e, "destHost exact match, draining", farB, 3, []float64{0, 3}, a, b)
	expectLanding(t, e, "destHost ipv4, a", farA, 2, []float64{2, 0}, a, b)
	if b.exited() {
		t.Fatalf("draining agent exited after the first SIGTERM: %v", b.exitErr)
	}
}

func scStrategiesDestHostDefaultRoute(t *testing.T, e *env) {
	a, b, farA, farB := strategyAgents(t, e)
	expectLanding(t, e, "destHost ipv4", farA, 3, []float64{3, 0}, a, b)
	expectLanding(t, e, "destHost ipv4", farB, 3, []float64{0, 3}, a, b)
	expectLanding(t, e, "defaultRoute", e.far.addr, 6, []float64{0, 6}, a, b)

	// Without the default-route agent, a dial that matches no identifier finds no agent.
	b.kill()
	e.waitServerAgentStreams(1)
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	conn, _, err := e.dial(ctx, e.far.addr)
	if err == nil {
		conn.Close()
		t.Fatal("dial without a default-route agent succeeded")
	}
	if !strings.Contains(err.Error(), "No agent available") {
		t.Fatalf("dial without a default-route agent: want %q, got %v", "No agent available", err)
	}
	t.Logf("no default-route agent: %v", err)
	expectLanding(t, e, "destHost ipv4 after b left", farA, 2, []float64{2}, a)
}
