package interop

// TestFaults: network faults on the link between agents and the server's agent port, made by
// Shopify's toxiproxy (pinned in tools.sh; no netem in this kernel) sitting in between, one
// proxy per agent link (or per server link), so that one link can be faulted alone. Every
// scenario runs against ours and upstream's Go server side by side, with real processes:
//
//	blackhole_one_of_two_agents   `timeout` toxic (data dropped, no FIN/RST) on agent B's link
//	slow_link                     `bandwidth` 256 KB/s: new dials beside a saturating download
//	latency                       `latency` 50 ms +- 10 ms each way: one 64 MiB download
//	resets                        `reset_peer` 1 s in every 5 s during 20 s of short tunnels
//	our_agent_one_of_two_servers_blackholed
//	                              our agent (KONNECTIVITY_AGENT_BIN) behind haproxy, connected to
//	                              two servers; server B's link blackholed, then restored
//
// Each logs one `FAULT-FIGURES <scenario> <impl> key=value ...` line. The thresholds asserted
// for ours (named constants below) state the liveness we want; upstream's figures are only
// reported. The scenario groups run concurrently (t.Run from goroutines: `go test`'s
// -parallel limit, GOMAXPROCS = 2 here, would run them two at a time), ours and upstream of
// one scenario always at the same time; latency and resets, the two that use CPU, one after
// the other.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

const (
	toxiproxyVersion    = "v2.5.0" // tools.sh builds this one
	metricReadyBackends = "konnectivity_network_proxy_server_ready_backend_connections"

	// blackhole_one_of_two_agents. Asserted for ours: fbTunnels/fbTunnels succeed, none
	// slower than fbMaxTunnel, no dial sent to B later than fbNotPickedWithin after the
	// blackhole, B retired within fbRetiredWithin, the open tunnel's client told within
	// fbToldWithin.
	fbTunnels         = 40
	fbClientTimeout   = 20 * time.Second
	fbFetchBytes      = 8 << 10
	fbMaxTunnel       = 3 * time.Second
	fbNotPickedWithin = 5 * time.Second
	fbRetiredWithin   = 20 * time.Second
	fbToldWithin      = 20 * time.Second
	fbPollEvery       = 250 * time.Millisecond
	fbRetireWatch     = 30 * time.Second
	// No tunnel of the sequence starts later than this after the blackhole: a server that
	// sends every other dial into the blackhole would need 40 x 20 s / 2 = 400 s otherwise.
	// The tunnels not started count as failed (attempted=<n> in the figures).
	fbSeqBudget = 45 * time.Second

	// slow_link. Asserted for ours: no dial fails; goals: dial p50 <= slowP50Limit, max <=
	// slowMaxLimit, all slowDials within slowBudget.
	slowRateKBps    = 256
	slowDials       = 10
	slowDialTimeout = 15 * time.Second
	slowFill        = 3 * time.Second  // the download fills the link's buffers first
	slowBudget      = 45 * time.Second // no dial starts later than this after the first
	// Goals, reported (FAULT-GOAL-MISSED) rather than asserted, as they are timings on a
	// shared machine: ours holds an agent to a receive window that follows the link
	// (src/h2_ping/window/), so little of a download queues ahead of a DIAL_RSP. Measured
	// p50 0.69 s, max 0.96 s (Go 1.05 s, 1.19 s); with the fixed 2 MiB window it was 8-9 s.
	slowP50Limit = time.Second
	slowMaxLimit = 2 * time.Second

	// latency. A goal for ours, reported (FAULT-GOAL-MISSED): MB/s >= latMinRatio x upstream's
	// in the same run (one download each, at the same time). Past 2 MiB the window follows
	// the link's bandwidth-delay product, up to the 8 MiB h2 accounts; see the README for the
	// figures (this harness runs our debug build beside Go's optimised one on 2 cores).
	latMinRatio = 1.0
	latMS       = 50
	latJitter   = 10
	latBytes    = 64 << 20
	latCap      = 60 * time.Second // a slower download is cut there (complete=false)
	latWaitFor  = 3 * time.Minute  // ours waits this long for upstream's figure

	// resets. Asserted for ours: no client hung (every op answered within its timeout +
	// rstGrace), gauges back to 0.
	rstPeriod   = 5 * time.Second
	rstCut      = time.Second
	rstFirstCut = 3 * time.Second
	rstTraffic  = 20 * time.Second
	rstWorkers  = 4
	rstOpLimit  = 10 * time.Second
	rstGrace    = 2 * time.Second
	rstFetch    = 16 << 10
	rstPause    = 20 * time.Millisecond

	// our_agent_one_of_two_servers_blackholed (asserted for both servers: the subject is
	// our agent): the tunnel on A keeps moving, haDials new dials through A within
	// haDialLimit each, the agent reconnects to B within haReconnectWithin of the restore.
	haHold            = 45 * time.Second // past our agent's --server-ping-interval + --server-ping-timeout (30 s + 10 s)
	haDials           = 5
	haDialLimit       = 5 * time.Second
	haReconnectWithin = 30 * time.Second

	// opGrace: an op still running this long after its limit is cancelled and counts as hung.
	opGrace = 2 * time.Second
)

// ---------------------------------------------------------------- toxiproxy

func toxiproxyBin(t *testing.T) string {
	t.Helper()
	p := os.Getenv("TOXIPROXY_BIN")
	if p == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		p = filepath.Join(cache, "konnectivity-tools", "toxiproxy-"+toxiproxyVersion, "server")
	}
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		skipOrFail(t, "toxiproxy %s not found at %s (%v): tests/interop/tools.sh builds it (run.sh runs tools.sh), or set TOXIPROXY_BIN", toxiproxyVersion, p, err)
	}
	return p
}

// toxiproxy is one toxiproxy server (its HTTP API on a loopback port of the harness's
// allocator); its proxies listen on ports of the allocator too.
type toxiproxy struct {
	t   *testing.T
	api string
	hc  *http.Client
}

func startToxiproxy(t *testing.T, bin, dir string) *toxiproxy {
	t.Helper()
	for attempt := 1; ; attempt++ {
		port := freePort(t)
		p := startProc(t, fmt.Sprintf("toxiproxy-%d", attempt), dir, bin, "-host=127.0.0.1", fmt.Sprintf("-port=%d", port))
		tp := &toxiproxy{t: t, api: fmt.Sprintf("http://127.0.0.1:%d", port), hc: &http.Client{Timeout: 10 * time.Second}}
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && !p.exited() {
			if code, _, err := tp.call(http.MethodGet, "/version", nil); err == nil && code == 200 {
				return tp
			}
			time.Sleep(50 * time.Millisecond)
		}
		if attempt < 3 && p.exited() {
			continue
		}
		t.Fatalf("toxiproxy did not serve its API on %d:\n%s", port, p.tail(20))
	}
}

func (tp *toxiproxy) call(method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, tp.api+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := tp.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// link creates proxy name: 127.0.0.1:<free port> -> 127.0.0.1:upstreamPort; returns the port.
func (tp *toxiproxy) link(name string, upstreamPort int) int {
	tp.t.Helper()
	for attempt := 1; ; attempt++ {
		port := freePort(tp.t)
		code, b, err := tp.call(http.MethodPost, "/proxies", map[string]any{
			"name": name, "listen": fmt.Sprintf("127.0.0.1:%d", port),
			"upstream": fmt.Sprintf("127.0.0.1:%d", upstreamPort), "enabled": true,
		})
		if err == nil && code == http.StatusCreated {
			return port
		}
		if attempt >= 3 {
			tp.t.Fatalf("toxiproxy: creating proxy %s: %d %s %v", name, code, b, err)
		}
	}
}

// both adds toxic <name>-up (stream upstream: agent -> server) and <name>-down (server ->
// agent) of type typ to proxy.
func (tp *toxiproxy) both(proxy, name, typ string, attrs map[string]any) {
	tp.t.Helper()
	for _, s := range []string{"upstream", "downstream"} {
		code, b, err := tp.call(http.MethodPost, "/proxies/"+proxy+"/toxics", map[string]any{
			"name": name + "-" + s[:2], "type": typ, "stream": s, "toxicity": 1.0, "attributes": attrs,
		})
		if err != nil || code != http.StatusOK {
			tp.t.Fatalf("toxiproxy: adding %s toxic %s to %s: %d %s %v", typ, name, proxy, code, b, err)
		}
	}
}

// removeBoth removes the toxics both added. Removing a `timeout` toxic closes the
// connections it held (toxiproxy's Cleanup).
func (tp *toxiproxy) removeBoth(proxy, name string) {
	tp.t.Helper()
	for _, s := range []string{"up", "do"} {
		code, b, err := tp.call(http.MethodDelete, "/proxies/"+proxy+"/toxics/"+name+"-"+s, nil)
		if err != nil || (code != http.StatusNoContent && code != http.StatusOK) {
			tp.t.Errorf("toxiproxy: removing toxic %s-%s from %s: %d %s %v", name, s, proxy, code, b, err)
		}
	}
}

// ---------------------------------------------------------------- runner

type faultScenario struct {
	name string
	// ourAgent: needs KONNECTIVITY_AGENT_BIN (skipped without it, failed under CI=true).
	ourAgent bool
	opts     func(impl string) envOpts
	run      func(t *testing.T, f *fenv)
}

// fenv: one implementation's run of one scenario.
type fenv struct {
	e        *env
	tp       *toxiproxy
	impl     string
	ourAgent string
	shared   *faultShared
	bg       sync.WaitGroup // tunnel closes running in the background
}

// faultShared: what the two implementations of one scenario exchange (latency: ours is
// compared with upstream's MB/s).
type faultShared struct {
	upstreamDone chan struct{}
	once         sync.Once
	upstreamMBps float64 // NaN until set; valid once upstreamDone is closed
}

func (s *faultShared) publish(v float64) {
	s.once.Do(func() { s.upstreamMBps = v; close(s.upstreamDone) })
}

func faultScenarioGroups() [][]faultScenario {
	return [][]faultScenario{
		{{name: "blackhole_one_of_two_agents", run: scFaultBlackholeAgent}},
		{{name: "slow_link", run: scFaultSlowLink}},
		{{name: "latency", run: scFaultLatency}, {name: "resets", run: scFaultResets}},
		{{name: "our_agent_one_of_two_servers_blackholed", ourAgent: true, run: scFaultOurAgentHA,
			opts: func(impl string) envOpts {
				return envOpts{serverID: "faults-ha-" + impl + "-a", serverCount: 2}
			}}},
	}
}

func TestFaults(t *testing.T) {
	bins := upstreamBinaries(t)
	tox := toxiproxyBin(t)
	ourAgent := os.Getenv("KONNECTIVITY_AGENT_BIN")
	impls := []struct{ name, bin string }{{"ours", os.Getenv("KONNECTIVITY_SERVER_BIN")}, {"upstream", bins.server}}
	start := time.Now()
	var groups sync.WaitGroup
	for _, g := range faultScenarioGroups() {
		groups.Add(1)
		go func() {
			defer groups.Done()
			for _, sc := range g {
				t.Run(sc.name, func(t *testing.T) {
					if sc.ourAgent {
						if ourAgent == "" {
							skipOrFail(t, "KONNECTIVITY_AGENT_BIN is not set: this scenario tests our agent")
						}
						if st, err := os.Stat(ourAgent); err != nil || st.Mode()&0o111 == 0 {
							skipOrFail(t, "our agent binary %q is missing or not executable: %v", ourAgent, err)
						}
					}
					shared := &faultShared{upstreamDone: make(chan struct{}), upstreamMBps: math.NaN()}
					var both sync.WaitGroup
					for _, impl := range impls {
						both.Add(1)
						go func() {
							defer both.Done()
							t.Run(impl.name, func(t *testing.T) {
								if impl.name == "upstream" {
									defer shared.publish(math.NaN()) // unless the scenario did
								}
								if impl.bin == "" {
									skipOrFail(t, "KONNECTIVITY_SERVER_BIN is not set: not testing our server (pass it to run.sh)")
								}
								if st, err := os.Stat(impl.bin); err != nil || st.Mode()&0o111 == 0 {
									skipOrFail(t, "%s server binary %q is missing or not executable: %v", impl.name, impl.bin, err)
								}
								var opts envOpts
								if sc.opts != nil {
									opts = sc.opts(impl.name)
								}
								e := newEnvWith(t, impl.name, impl.bin, bins, opts)
								f := &fenv{e: e, tp: startToxiproxy(t, tox, e.dir), impl: impl.name, ourAgent: ourAgent, shared: shared}
								t.Cleanup(f.bg.Wait) // before the processes are killed (cleanups run last-in first)
								sc.run(t, f)
							})
						}()
					}
					both.Wait()
				})
			}
		}()
	}
	groups.Wait()
	t.Logf("TestFaults took %.1fs", time.Since(start).Seconds())
}

// quiesce: the harness's end-of-scenario checks (server gauges 0, far end closed, no panic);
// upstream's leftovers are recorded as a known difference, not failed.
func (f *fenv) quiesce(t *testing.T, id string) {
	t.Helper()
	f.quiesceEnv(t, f.e, id)
}

func (f *fenv) quiesceEnv(t *testing.T, e *env, id string) {
	t.Helper()
	f.bg.Wait()
	if f.impl == "ours" {
		e.assertQuiescent(t)
		return
	}
	e.assertServerAlive(t)
	e.quiescentOrKnownDiff(t, id)
}

// check: an assertion on ours (t.Errorf); for upstream the same finding is only logged.
func (f *fenv) check(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	if f.impl == "ours" {
		t.Errorf("FAULT-ASSERTION "+format, args...)
	} else {
		t.Logf("(upstream, reported only) "+format, args...)
	}
}

// goal: a target of ours not met yet, with its reason in the README: reported on every run
// (FAULT-GOAL-MISSED, in run.sh's summary), not failed, so the figure stays in sight.
func (f *fenv) goal(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if !ok && f.impl == "ours" {
		t.Logf("FAULT-GOAL-MISSED "+format, args...)
	}
}

// ---------------------------------------------------------------- tunnels with bounds

type opResult struct {
	start      time.Time
	dial, took time.Duration
	err        error
	hung       bool
}

// tunnelOp: one single-use tunnel as kube-apiserver makes it: create + dial within limit
// (the dial's context), then do(conn). konnectivity-client's conn has no deadlines, so an op
// still running at limit + opGrace has its tunnel context cancelled (which ends its stream)
// and counts as hung. The tunnel is closed in the background (Close waits up to 10 s for
// CLOSE_RSP; the tunnel context is cancelled 3 s after it began).
func (f *fenv) tunnelOp(e *env, addr string, limit time.Duration, do func(net.Conn) error) opResult {
	start := time.Now()
	tctx, cancel := context.WithCancel(e.ctx)
	ch := make(chan opResult, 1)
	f.bg.Add(1)
	go func() {
		defer f.bg.Done()
		r := opResult{start: start}
		dctx, dcancel := context.WithTimeout(tctx, limit)
		defer dcancel()
		var c net.Conn
		tunnel, err := client.CreateSingleUseGrpcTunnelWithContext(dctx, tctx, e.sock, e.grpcOpts()...)
		if err == nil {
			c, err = tunnel.DialContext(dctx, "tcp", addr)
		} else {
			err = fmt.Errorf("create tunnel: %w", err)
		}
		r.dial = time.Since(start)
		if err != nil {
			r.err, r.took = fmt.Errorf("dial: %w", err), r.dial
			ch <- r
			// The client sends DIAL_CLS and closes a single-use tunnel itself: let it.
			time.Sleep(2 * time.Second)
			cancel()
			return
		}
		if do != nil {
			r.err = do(c)
		}
		r.took = time.Since(start)
		ch <- r
		closeWithin(c, cancel, 3*time.Second)
	}()
	select {
	case r := <-ch:
		return r
	case <-time.After(limit + opGrace):
		cancel()
		return opResult{start: start, took: time.Since(start), hung: true,
			err: fmt.Errorf("no answer within %v + %v: tunnel cancelled", limit, opGrace)}
	}
}

// closeWithin closes c and cancels its tunnel, at the latest after d.
func closeWithin(c net.Conn, cancel context.CancelFunc, d time.Duration) {
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
	cancel()
}

// fetchInto returns a do func: GET n bytes with seed, checked by sha256; got counts bytes.
func fetchInto(n int64, seed uint64, got *atomic.Int64) func(net.Conn) error {
	return func(c net.Conn) error {
		if _, err := fmt.Fprintf(c, "GET %d %d\n", n, seed); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		h := sha256.New()
		buf := make([]byte, 64<<10)
		var total int64
		for {
			k, err := c.Read(buf)
			h.Write(buf[:k])
			total += int64(k)
			if got != nil {
				got.Add(int64(k))
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return fmt.Errorf("read after %d bytes: %w", total, err)
			}
		}
		if total != n {
			return fmt.Errorf("got %d bytes, want %d", total, n)
		}
		if sum, want := hex.EncodeToString(h.Sum(nil)), expectedSHA(n, seed); sum != want {
			return fmt.Errorf("sha256 mismatch")
		}
		return nil
	}
}

// streamWatch reads a long-lived tunnel (far-end TICK or STREAM) to its end.
type streamWatch struct {
	conn    net.Conn
	n       atomic.Int64
	endedAt atomic.Int64 // UnixNano, 0 = still open
	err     atomic.Pointer[error]
}

func watchStream(c net.Conn) *streamWatch {
	w := &streamWatch{conn: c}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			k, err := c.Read(buf)
			w.n.Add(int64(k))
			if err != nil {
				w.err.Store(&err)
				w.endedAt.Store(time.Now().UnixNano())
				return
			}
		}
	}()
	return w
}

func (w *streamWatch) ended() bool { return w.endedAt.Load() != 0 }

// endedAfter: seconds from t0 to the end, or "never".
func (w *streamWatch) endedAfter(t0 time.Time) string {
	if ns := w.endedAt.Load(); ns != 0 {
		return fmt.Sprintf("%.2fs", time.Duration(ns-t0.UnixNano()).Seconds())
	}
	return "never"
}

func (w *streamWatch) errText() string {
	if p := w.err.Load(); p != nil {
		return (*p).Error()
	}
	return ""
}

// openStream opens a tunnel through e to its far end that streams (cmd: "TICK <seed> <chunk>
// <ms>" or "STREAM <seed>") and waits for its first bytes.
func openStream(t *testing.T, e *env, cmd string) *streamWatch {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	c, err := e.holDialer()(ctx, e.far.addr)
	if err != nil {
		t.Fatalf("streaming tunnel: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "%s\n", cmd); err != nil {
		t.Fatalf("streaming tunnel: %v", err)
	}
	w := watchStream(c)
	eventually(t, 15*time.Second, "data on the streaming tunnel", func() (bool, string) {
		return w.n.Load() > 0, fmt.Sprintf("%d bytes, ended=%v %s", w.n.Load(), w.ended(), w.errText())
	})
	return w
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// secsOr: d in seconds, or "never" for a negative d.
func secsOr(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return secs(d)
}

func durPercentile(v []time.Duration, p float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// ---------------------------------------------------------------- ours: /agents

type adminAgent struct {
	id      string
	pending float64
	raw     map[string]any
}

// adminAgents reads our server's GET /agents (admin port; src/admin/mod.rs).
func (e *env) adminAgents() ([]adminAgent, error) {
	code, body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/agents", e.adminPort))
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("GET /agents: %d", code)
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		return nil, fmt.Errorf("GET /agents: %v", err)
	}
	out := make([]adminAgent, 0, len(list))
	for _, m := range list {
		id, _ := m["agent_id"].(string)
		p, _ := m["pending_dials"].(float64)
		out = append(out, adminAgent{id: id, pending: p, raw: m})
	}
	return out, nil
}

// ---------------------------------------------------------------- 1. blackhole one of two agents

func scFaultBlackholeAgent(t *testing.T, f *fenv) {
	e, tp := f.e, f.tp
	ours := f.impl == "ours"
	// Agent B alone first: the open tunnel lands on it.
	pb := tp.link("agent-b", e.agentPort)
	b := e.startAgentArgs("faults-b", "", pb)
	e.waitAgentConnected(b)
	e.waitReady()
	open := openStream(t, e, "TICK 4100 1024 100")
	waitEndpointCounts(t, []float64{1}, b)
	pa := tp.link("agent-a", e.agentPort)
	a := e.startAgentArgs("faults-a", "", pa)
	e.waitAgentConnected(a)
	e.waitServerAgentStreams(2)
	eventually(t, 20*time.Second, "ready_backend_connections == 2", func() (bool, string) {
		m, err := e.serverMetrics()
		if err != nil {
			return false, err.Error()
		}
		return m.sum(metricReadyBackends) == 2, fmt.Sprint(m.sum(metricReadyBackends))
	})

	cut := time.Now()
	tp.both("agent-b", "blackhole", "timeout", map[string]any{"timeout": 0})

	// The poller: the server's view of B every fbPollEvery (ours: /agents; both: metrics),
	// and which tunnel of the sequence had a dial pending at B.
	var (
		mu                 sync.Mutex
		retiredAt          = time.Duration(-1) // B gone from /agents (ours)
		readyDropAt        = time.Duration(-1) // ready_backend_connections < 2
		toB                = map[int]bool{}    // tunnel index -> a dial was pending at B (ours)
		basePending        = map[int]float64{}
		firstEntry, lastBE map[string]any
	)
	var cur atomic.Int64
	cur.Store(-1)
	bPending := func() (float64, bool) {
		list, err := e.adminAgents()
		if err != nil {
			return 0, false
		}
		for _, ag := range list {
			if ag.id == b.id {
				mu.Lock()
				if firstEntry == nil {
					firstEntry = ag.raw
				}
				lastBE = ag.raw
				mu.Unlock()
				return ag.pending, true
			}
		}
		return 0, false
	}
	stopPoll := make(chan struct{})
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		for {
			since := time.Since(cut)
			if ours {
				p, present := bPending()
				i := int(cur.Load())
				mu.Lock()
				if !present && retiredAt < 0 {
					retiredAt = since
				}
				if present && i >= 0 && p > basePending[i] {
					toB[i] = true
				}
				mu.Unlock()
			}
			if m, err := e.serverMetrics(); err == nil && m.sum(metricReadyBackends) < 2 {
				mu.Lock()
				if readyDropAt < 0 {
					readyDropAt = since
				}
				mu.Unlock()
			}
			select {
			case <-stopPoll:
				return
			case <-time.After(fbPollEvery):
			}
		}
	}()

	// 40 single-use tunnels, one after another.
	type tres struct {
		at time.Duration // start, since the blackhole
		r  opResult
	}
	var res []tres
	for i := 0; i < fbTunnels && time.Since(cut) < fbSeqBudget; i++ {
		if ours {
			p, _ := bPending()
			mu.Lock()
			basePending[i] = p
			mu.Unlock()
		}
		cur.Store(int64(i))
		at := time.Since(cut)
		r := f.tunnelOp(e, e.far.addr, fbClientTimeout, fetchInto(fbFetchBytes, uint64(4200+i), nil))
		res = append(res, tres{at, r})
		if r.err != nil {
			t.Logf("tunnel %d (started %.2fs after the blackhole): %v after %v", i, at.Seconds(), r.err, r.took.Round(time.Millisecond))
		}
	}
	cur.Store(-1)
	seqEnd := time.Since(cut)

	// The open tunnel's client, and the retirement: watched until their limits.
	for time.Since(cut) < max(fbToldWithin, fbRetireWatch) {
		mu.Lock()
		retired := retiredAt >= 0 || readyDropAt >= 0
		mu.Unlock()
		if open.ended() && retired {
			break
		}
		time.Sleep(fbPollEvery)
	}
	close(stopPoll)
	<-pollDone

	ok, slow, maxTook := 0, 0, time.Duration(0)
	lastToB, nToB := time.Duration(-1), 0
	mu.Lock()
	for i, x := range res {
		if x.r.err == nil {
			ok++
		}
		maxTook = max(maxTook, x.r.took)
		viaB := toB[i] || x.r.err != nil || x.r.took > fbMaxTunnel // pending at B, or inferred
		if x.r.took > fbMaxTunnel {
			slow++
		}
		if viaB {
			nToB++
			lastToB = max(lastToB, x.at)
		}
	}
	tagged := len(toB)
	retired, readyDrop := retiredAt, readyDropAt
	fe, le := firstEntry, lastBE
	mu.Unlock()
	told := time.Duration(-1)
	if ns := open.endedAt.Load(); ns != 0 {
		told = time.Duration(ns - cut.UnixNano())
	}
	// Retired: gone from /agents (ours) or no longer counted as a ready backend, whichever
	// came first (upstream has no /agents: its gauge is the only view).
	retireFig := readyDrop
	if retired >= 0 && (retireFig < 0 || retired < retireFig) {
		retireFig = retired
	}
	src, gone := "inferred", "n/a"
	if ours {
		src, gone = "agents+inferred", secsOr(retired)
	}
	t.Logf("FAULT-FIGURES blackhole_one_of_two_agents %s ok=%d/%d attempted=%d slow_over_%v=%d max_ms=%d to_b=%d(%s; pending_at_b=%d) last_to_b_after=%s retired_after=%s gone_from_agents_after=%s ready_backends_below_2_after=%s open_tunnel_told_after=%s open_tunnel_err=%q seq_took=%s",
		f.impl, ok, fbTunnels, len(res), fbMaxTunnel, slow, maxTook.Milliseconds(), nToB, src, tagged,
		secsOr(lastToB), secsOr(retireFig), gone, secsOr(readyDrop), secsOr(told), open.errText(), secs(seqEnd))
	if ours && fe != nil {
		j1, _ := json.Marshal(fe)
		j2, _ := json.Marshal(le)
		t.Logf("ours: /agents entry of B after the blackhole: first %s, last %s", j1, j2)
	}

	f.check(t, ok == fbTunnels, "%d/%d tunnels succeeded after the blackhole (%d attempted within the %v budget)", ok, fbTunnels, len(res), fbSeqBudget)
	f.check(t, maxTook <= fbMaxTunnel, "slowest tunnel took %v, want <= %v (%d over)", maxTook.Round(time.Millisecond), fbMaxTunnel, slow)
	f.check(t, lastToB <= fbNotPickedWithin, "the last dial sent to B started %s after the blackhole, want <= %v (%d dials went to B)", secsOr(lastToB), fbNotPickedWithin, nToB)
	f.check(t, retireFig >= 0 && retireFig <= fbRetiredWithin, "B retired after %s, want <= %v", secsOr(retireFig), fbRetiredWithin)
	f.check(t, told >= 0 && told <= fbToldWithin, "the tunnel open through B was ended at its client after %s, want <= %v", secsOr(told), fbToldWithin)

	// Back to normal: removing the toxic closes B's connections.
	tp.removeBoth("agent-b", "blackhole")
	open.conn.Close()
	f.quiesce(t, "faults-blackhole-leftover")
}

// ---------------------------------------------------------------- 2. slow link

func scFaultSlowLink(t *testing.T, f *fenv) {
	e, tp := f.e, f.tp
	p := tp.link("agent", e.agentPort)
	a := e.startAgentArgs("faults-slow", "", p)
	e.waitAgentConnected(a)
	e.waitReady()
	tp.both("agent", "slow", "bandwidth", map[string]any{"rate": slowRateKBps})
	dl := openStream(t, e, "STREAM 4300")
	time.Sleep(slowFill)

	n0, t0 := dl.n.Load(), time.Now()
	var took []time.Duration
	failed := 0
	for i := 0; i < slowDials && time.Since(t0) < slowBudget; i++ {
		r := f.tunnelOp(e, e.far.addr, slowDialTimeout, nil)
		d := r.dial
		if r.err != nil {
			failed++
			d = max(d, slowDialTimeout)
			t.Logf("dial %d: %v after %v", i, r.err, r.took.Round(time.Millisecond))
		}
		took = append(took, d)
	}
	rate := float64(dl.n.Load()-n0) / time.Since(t0).Seconds() / 1e3
	p50, mx := durPercentile(took, 0.5), durPercentile(took, 1)
	ms := make([]int64, len(took))
	for i, d := range took {
		ms[i] = d.Milliseconds()
	}
	t.Logf("FAULT-FIGURES slow_link %s rate_kBps=%d dials=%d/%d failed=%d dial_p50_ms=%d dial_max_ms=%d download_kBps=%.0f download_ended=%v dials_ms=%v",
		f.impl, slowRateKBps, len(took), slowDials, failed, p50.Milliseconds(), mx.Milliseconds(), rate, dl.ended(), ms)
	f.check(t, failed == 0, "%d of %d dials failed", failed, len(took))
	f.goal(t, len(took) == slowDials, "%d/%d dials within the budget %v", len(took), slowDials, slowBudget)
	f.goal(t, p50 <= slowP50Limit, "dial p50 %v beside a download on a %d KB/s link, want <= %v", p50.Round(time.Millisecond), slowRateKBps, slowP50Limit)
	f.goal(t, mx <= slowMaxLimit, "slowest dial %v beside a download on a %d KB/s link, want <= %v", mx.Round(time.Millisecond), slowRateKBps, slowMaxLimit)
	if dl.ended() {
		t.Errorf("the download ended during the scenario: %s", dl.errText())
	}

	tp.removeBoth("agent", "slow")
	dl.conn.Close()
	f.quiesce(t, "faults-slow-leftover")
}

// ---------------------------------------------------------------- 3. latency

func scFaultLatency(t *testing.T, f *fenv) {
	e, tp := f.e, f.tp
	p := tp.link("agent", e.agentPort)
	a := e.startAgentArgs("faults-lat", "", p)
	e.waitAgentConnected(a)
	e.waitReady()
	tp.both("agent", "lat", "latency", map[string]any{"latency": latMS, "jitter": latJitter})

	var got, first atomic.Int64 // bytes; UnixNano when the request went out
	fetch := fetchInto(latBytes, 4400, &got)
	r := f.tunnelOp(e, e.far.addr, latCap, func(c net.Conn) error {
		first.Store(time.Now().UnixNano())
		return fetch(c)
	})
	n := got.Load()
	var transfer time.Duration
	if ns := first.Load(); ns != 0 {
		transfer = r.start.Add(r.took).Sub(time.Unix(0, ns))
		if r.hung {
			r.dial = time.Unix(0, ns).Sub(r.start)
		}
	}
	mbps := 0.0
	if transfer > 0 {
		mbps = float64(n) / transfer.Seconds() / 1e6
	}
	complete := r.err == nil
	if f.impl == "upstream" {
		f.shared.publish(mbps)
	}
	goFig := "n/a"
	if f.impl == "ours" {
		select {
		case <-f.shared.upstreamDone:
			if !math.IsNaN(f.shared.upstreamMBps) {
				goFig = fmt.Sprintf("%.2f", f.shared.upstreamMBps)
			}
		case <-time.After(latWaitFor):
		}
	}
	t.Logf("FAULT-FIGURES latency %s latency_ms=%d jitter_ms=%d bytes=%d complete=%v MBps=%.2f transfer=%s dial_ms=%d upstream_MBps=%s err=%v",
		f.impl, latMS, latJitter, n, complete, mbps, secs(transfer), r.dial.Milliseconds(), goFig, r.err)
	if r.err != nil && !(r.hung && n > 0) {
		t.Errorf("64 MiB download: %v", r.err) // a cut (slow) download is a figure, a broken one a failure
	}
	if f.impl == "ours" && goFig != "n/a" {
		f.goal(t, mbps >= latMinRatio*f.shared.upstreamMBps, "64 MiB at %d±%d ms each way: ours %.2f MB/s < %.2f x upstream's %.2f MB/s",
			latMS, latJitter, mbps, latMinRatio, f.shared.upstreamMBps)
	}
	tp.removeBoth("agent", "lat")
	f.quiesce(t, "faults-latency-leftover")
}

// ---------------------------------------------------------------- 4. resets

func scFaultResets(t *testing.T, f *fenv) {
	e, tp := f.e, f.tp
	p := tp.link("agent", e.agentPort)
	a := e.startAgentArgs("faults-rst", "", p)
	e.waitAgentConnected(a)
	e.waitReady()
	for i := 0; i < 10; i++ { // warm-up, then the RSS baseline
		if r := f.tunnelOp(e, e.far.addr, rstOpLimit, fetchInto(rstFetch, uint64(4500+i), nil)); r.err != nil {
			t.Fatalf("warm-up tunnel %d: %v", i, r.err)
		}
	}
	pid := e.server.cmd.Process.Pid
	rss0, _ := rssBytes(pid)

	start := time.Now()
	var cuts atomic.Int64
	cutDone := make(chan struct{})
	go func() {
		defer close(cutDone)
		for k := 0; ; k++ {
			at := start.Add(rstFirstCut + time.Duration(k)*rstPeriod)
			if at.Add(rstCut).After(start.Add(rstTraffic)) {
				return
			}
			time.Sleep(time.Until(at))
			tp.both("agent", "cut", "reset_peer", map[string]any{"timeout": 0})
			cuts.Add(1)
			time.Sleep(rstCut)
			tp.removeBoth("agent", "cut")
		}
	}()
	var (
		mu                     sync.Mutex
		ops, okN, hung         int
		maxOK, maxFail         time.Duration
		failures               = map[string]int{}
		workers                sync.WaitGroup
		seed                   atomic.Uint64
		firstHung, hungExample string
	)
	seed.Store(5000)
	for w := 0; w < rstWorkers; w++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for time.Since(start) < rstTraffic {
				r := f.tunnelOp(e, e.far.addr, rstOpLimit, fetchInto(rstFetch, seed.Add(1), nil))
				mu.Lock()
				ops++
				switch {
				case r.hung:
					hung++
					if firstHung == "" {
						firstHung, hungExample = secs(r.start.Sub(start)), r.err.Error()
					}
				case r.err != nil:
					maxFail = max(maxFail, r.took)
					failures[failureKind(r.err)]++
				default:
					okN++
					maxOK = max(maxOK, r.took)
				}
				mu.Unlock()
				time.Sleep(rstPause)
			}
		}()
	}
	workers.Wait()
	<-cutDone
	trafficTook := time.Since(start)

	// The agent comes back; the gauges return to 0.
	e.waitAgentConnected(a)
	e.waitReady()
	gaugesAt, pend, est := time.Duration(-1), 0.0, 0.0
	settle := time.Now()
	for time.Since(settle) < 20*time.Second {
		if m, err := e.serverMetrics(); err == nil {
			pend, est = m.sum(metricPending), m.sum(metricEstablished)
			if pend == 0 && est == 0 {
				gaugesAt = time.Since(settle)
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := f.tunnelOp(e, e.far.addr, rstOpLimit, fetchInto(rstFetch, 4999, nil))
	f.bg.Wait()
	rss1, _ := rssBytes(pid)
	kinds := []string{}
	for k, v := range failures {
		kinds = append(kinds, fmt.Sprintf("%s:%d", k, v))
	}
	slices.Sort(kinds)
	t.Logf("FAULT-FIGURES resets %s cuts=%d traffic=%s ops=%d ok=%d failed=%d hung=%d max_ok_ms=%d max_fail_ms=%d gauges_zero_after=%s pending=%v established=%v rss_before_mib=%.1f rss_after_mib=%.1f rss_growth_mib=%.1f tunnel_after=%v failures=%s",
		f.impl, cuts.Load(), secs(trafficTook), ops, okN, ops-okN-hung, hung, maxOK.Milliseconds(), maxFail.Milliseconds(),
		secsOr(gaugesAt), pend, est, float64(rss0)/mib, float64(rss1)/mib, float64(rss1-rss0)/mib, after.err == nil, strings.Join(kinds, ","))
	if hung > 0 {
		t.Logf("first hung op started %s into the traffic: %s", firstHung, hungExample)
	}
	f.check(t, hung == 0, "%d/%d clients got no answer within their %v timeout (+%v)", hung, ops, rstOpLimit, rstGrace)
	f.check(t, gaugesAt >= 0, "server gauges not back to 0 within 20 s after the resets: pending=%v established=%v", pend, est)
	f.check(t, after.err == nil, "a tunnel after the resets failed: %v", after.err)
	f.quiesce(t, "faults-resets-leftover")
}

// failureKind: a short name for a tunnel failure, for the figures.
func failureKind(err error) string {
	s := err.Error()
	for _, k := range []string{"No agent available", "context deadline exceeded", "dial timeout", "tunnel closed",
		"connection reset", "EOF", "read after", "Unavailable", "canceled", "sha256"} {
		if strings.Contains(s, k) {
			return strings.ReplaceAll(k, " ", "_")
		}
	}
	if len(s) > 40 {
		s = s[:40]
	}
	return strings.ReplaceAll(s, " ", "_")
}

// ---------------------------------------------------------------- 5. our agent, one of two servers blackholed

func scFaultOurAgentHA(t *testing.T, f *fenv) {
	e, tp := f.e, f.tp
	eb := newEnvWith(t, f.impl, e.serverBin, e.bins, envOpts{serverID: "faults-ha-" + f.impl + "-b", serverCount: 2})
	pa, pb := tp.link("server-a", e.agentPort), tp.link("server-b", eb.agentPort)
	lb := startHAProxy(t, e.dir, pa, pb)
	a := e.startAgentArgs("faults-ha", f.ourAgent, lb)
	watchServer(t, a.proc) // our agent: no panic, no exit of its own
	t0 := time.Now()
	e.waitAgentServers(a, 2, 30*time.Second)
	connected := time.Since(t0)
	for _, s := range []*env{e, eb} {
		s.waitServerAgentStreams(1)
		s.waitReady()
	}
	long := openStream(t, e, "TICK 4600 1024 20") // through server A

	// The agent's view: open_server_connections, sampled every 100 ms.
	var lowAt, backAt atomic.Int64 // ns since cut: first < 2 / first == 2 again after that
	lowAt.Store(-1)
	backAt.Store(-1)
	cut := time.Now()
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if m, err := a.metrics(); err == nil {
				v, since := m.sum(metricAgentServer), int64(time.Since(cut))
				if v < 2 && lowAt.Load() < 0 {
					lowAt.Store(since)
				}
				if v == 2 && lowAt.Load() >= 0 && backAt.Load() < 0 {
					backAt.Store(since)
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	tp.both("server-b", "blackhole", "timeout", map[string]any{"timeout": 0})

	n0 := long.n.Load()
	time.Sleep(3 * time.Second)
	movedDuring := long.n.Load() - n0
	okA, maxA := 0, time.Duration(0)
	for i := 0; i < haDials; i++ {
		r := f.tunnelOp(e, e.far.addr, haDialLimit, fetchInto(64<<10, uint64(4700+i), nil))
		maxA = max(maxA, r.took)
		if r.err == nil && r.took <= haDialLimit {
			okA++
		} else {
			t.Logf("dial %d through A during the blackhole: %v after %v", i, r.err, r.took.Round(time.Millisecond))
		}
	}
	viaB := f.tunnelOp(eb, eb.far.addr, haDialLimit, fetchInto(64<<10, 4710, nil)) // reported only
	time.Sleep(time.Until(cut.Add(haHold)))
	detected := lowAt.Load()

	restored := time.Now()
	tp.removeBoth("server-b", "blackhole")
	back := time.Duration(-1)
	for time.Since(restored) < haReconnectWithin {
		m, err := a.metrics()
		if err == nil && m.sum(metricAgentServer) == 2 && lowAt.Load() >= 0 {
			if sm, err := eb.serverMetrics(); err == nil && sm.sum(metricGRPCConns, `service_method="Connect"`) == 1 {
				if r := f.tunnelOp(eb, eb.far.addr, haDialLimit, fetchInto(64<<10, 4720, nil)); r.err == nil {
					back = time.Since(restored)
					break
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	<-sampled
	n1 := long.n.Load()
	time.Sleep(time.Second)
	movedAfter := long.n.Load() - n1
	ns := func(v int64) string {
		if v < 0 {
			return "never"
		}
		return secs(time.Duration(v))
	}
	reconnectedAfter := "never"
	if b := backAt.Load(); b >= 0 {
		reconnectedAfter = secs(time.Duration(b) - restored.Sub(cut))
	}
	t.Logf("FAULT-FIGURES our_agent_one_of_two_servers_blackholed %s connected_2_after=%s tunnel_a_bytes_in_3s=%d tunnel_a_ended=%v dials_a=%d/%d max_dial_a_ms=%d dial_b_during=%q agent_saw_b_lost_after=%s (hold %v) back_to_2_after_restore=%s b_serving_after_restore=%s tunnel_a_bytes_1s_after=%d",
		f.impl, secs(connected), movedDuring, long.ended(), okA, haDials, maxA.Milliseconds(), errOrOK(viaB), ns(detected), haHold,
		reconnectedAfter, secsOr(back), movedAfter)
	if movedDuring == 0 || long.ended() {
		t.Errorf("the tunnel through server A stopped while B was blackholed (%d bytes in 3 s, ended=%v %s)", movedDuring, long.ended(), long.errText())
	}
	if okA != haDials {
		t.Errorf("%d/%d new dials through server A succeeded within %v while B was blackholed", okA, haDials, haDialLimit)
	}
	if detected < 0 {
		t.Errorf("our agent did not drop the blackholed server B within %v", haHold)
	}
	if back < 0 {
		t.Errorf("our agent did not reconnect to server B within %v of its link's return (open_server_connections low at %s, back at %s)",
			haReconnectWithin, ns(detected), reconnectedAfter)
	}
	if movedAfter == 0 || long.ended() {
		t.Errorf("the tunnel through server A stopped after B returned (ended=%v %s)", long.ended(), long.errText())
	}
	long.conn.Close()
	f.quiesce(t, "faults-ha-leftover")
	f.quiesceEnv(t, eb, "faults-ha-leftover")
	assertAgentsQuiescent(t, e)
}

func errOrOK(r opResult) string {
	if r.err == nil {
		return fmt.Sprintf("ok in %dms", r.took.Milliseconds())
	}
	return fmt.Sprintf("%s after %dms", failureKind(r.err), r.took.Milliseconds())
}
