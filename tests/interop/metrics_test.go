package interop

// Metrics parity, so dashboards and alerts built on upstream keep working: ours and the upstream Go server are started in the same state
// (token authentication, lease controller, the same upstream agent flags, the same traffic:
// two tunnels and one failed dial, one expired lease culled) and the HELP and TYPE lines of
// every konnectivity_* family on each health port's /metrics are diffed. Only our documented
// additions, and the 0.37 families the v0.36.0 upstream binary predates, may differ; a family
// upstream has and ours lacks is a failure. Then `promtool check metrics` on both outputs:
// lint findings on ours are allowed only for names inherited from upstream, listed below.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

const serverPrefix = "konnectivity_network_proxy_server_"

// ourAdditions are families ours has and upstream (any version) has not: documented in the
// README's metrics section.
var ourAdditions = map[string]bool{
	serverPrefix + "relayed_bytes_total":                   true,
	serverPrefix + "frontend_queue_overflows_total":        true,
	serverPrefix + "reloads_total":                         true,
	serverPrefix + "last_reload_success_timestamp_seconds": true,
	serverPrefix + "build_info":                            true,
	serverPrefix + "token_reviews_total":                   true,
	serverPrefix + "token_review_cache_hits_total":         true,
	serverPrefix + "frontend_queued_bytes":                 true,
	serverPrefix + "frontend_queue_budget_closes_total":    true,
	serverPrefix + "dial_startup_waits_total":              true,
	serverPrefix + "dials_waiting_for_agent":               true,
	serverPrefix + "peer_violations_total":                 true,
	serverPrefix + "suspect_agents":                        true,
	serverPrefix + "unanswered_agent_retirements_total":    true,
	serverPrefix + "dial_retries_total":                    true,
	serverPrefix + "announced_servers":                     true,
	serverPrefix + "destinations_refused_total":            true,
	serverPrefix + "frontend_accepted_connections_total":   true,
	serverPrefix + "allocator_allocated_bytes":             true,
	serverPrefix + "allocator_active_bytes":                true,
	serverPrefix + "allocator_resident_bytes":              true,
}

// newerThanUpstreamBinary are upstream v0.37 families (after the v0.36.0 we can build): ours
// must carry them with upstream's exact HELP and TYPE (upstream-behaviour.md 6.3 and the
// frontend-write-queue section), which the live v0.36.0 server cannot show.
var newerThanUpstreamBinary = map[string][2]string{
	serverPrefix + "connection_duration_seconds":     {"Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed.", "histogram"},
	serverPrefix + "full_frontend_write_queues":      {"Number of per-connection HTTP CONNECT frontend write queues currently at capacity.", "gauge"},
	serverPrefix + "blocked_frontend_write_channels": {"Number of backend receive loops currently blocked enqueueing to a full HTTP CONNECT frontend write channel.", "gauge"},
}

// promtoolAllowed are the lint findings allowed on our output: names inherited from upstream,
// which cannot be renamed without breaking operators' dashboards.
var promtoolAllowed = map[string][]string{
	serverPrefix + "culled_leases_count": {`counter metrics should have "_total" suffix`, `non-histogram and non-summary metrics should not have "_count" suffix`},
	serverPrefix + "dial_failure_count":  {`counter metrics should have "_total" suffix`, `non-histogram and non-summary metrics should not have "_count" suffix`},
}

// family is one metric family's HELP and TYPE lines.
type family struct{ help, typ string }

func parseFamilies(text, prefix string) map[string]family {
	fams := map[string]family{}
	for _, l := range strings.Split(text, "\n") {
		for _, kind := range []string{"# HELP ", "# TYPE "} {
			if !strings.HasPrefix(l, kind) {
				continue
			}
			rest := l[len(kind):]
			name, val, _ := strings.Cut(rest, " ")
			if !strings.HasPrefix(name, prefix) {
				continue
			}
			f := fams[name]
			if kind == "# HELP " {
				f.help = val
			} else {
				f.typ = val
			}
			fams[name] = f
		}
	}
	return fams
}

func scMetricsSameState(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared) {
	id := "metrics-" + impl
	labelStr := "k8s-app=konnectivity-server,scenario=metrics-" + impl
	kc, _ := k.serverIdentity(t, id)
	// An expired lease with the server's labels: its collector culls it (lease_delete_* and
	// culled_leases_count then exist on both sides).
	k.createLease(t, "stale-metrics-"+impl, parseLabels(labelStr), time.Now().Add(-5*time.Minute), 30)
	e := startKubeServer(t, impl, bin, bins, kubeServerOpts{token: true, kubeconfig: kc, serverID: id,
		extra: []string{"--enable-lease-controller", "--lease-namespace=kube-system", "--lease-label=" + labelStr}})
	a := e.startTokenAgent("metrics-agent", k.tokenRequest(t, agentNamespace, agentSA, konnAudience))
	e.waitAgentConnected(a)
	e.waitReady()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	for i, n := range []int64{64 << 10, 4 << 20} {
		if err := fetch(ctx, e.singleUse(), e.far.addr, n, uint64(30+i)); err != nil {
			t.Fatalf("tunnel %d: %v", i, err)
		}
	}
	if _, _, err := e.dial(ctx, closedPort(t)); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("dial to a closed port: want connection refused, got %v", err)
	}
	e.assertQuiescent(t)
	eventually(t, 20*time.Second, "expired lease culled", func() (bool, string) {
		m, err := e.serverMetrics()
		if err != nil {
			return false, err.Error()
		}
		c := m.sum(serverPrefix + "culled_leases_count")
		return c == 1, fmt.Sprintf("culled_leases_count=%v", c)
	})
	code, health, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/metrics", e.healthPort))
	if err != nil || code != 200 {
		t.Fatalf("health /metrics: %d %v", code, err)
	}
	code, admin, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/metrics", e.adminPort))
	if err != nil || code != 200 {
		t.Fatalf("admin /metrics: %d %v", code, err)
	}
	hf, af := parseFamilies(health, "konnectivity_"), parseFamilies(admin, "konnectivity_")
	if fmt.Sprint(hf) != fmt.Sprint(af) {
		t.Errorf("health and admin /metrics expose different konnectivity_* families:\nhealth %v\nadmin  %v", hf, af)
	}
	m, _ := e.serverMetrics()
	t.Logf("state: dial_failure_count{error_response}=%v grpc_connections{Connect}=%v culled=%v",
		m.sum(serverPrefix+"dial_failure_count", `reason="error_response"`), m.sum(metricGRPCConns, `service_method="Connect"`),
		m.sum(serverPrefix+"culled_leases_count"))
	sh.mu.Lock()
	sh.metrics[impl] = health
	sh.mu.Unlock()
	// Kept with the fixture when the run fails (evidence for the diff).
	_ = os.WriteFile(filepath.Join(k.dir, "metrics-"+impl+".txt"), []byte(health), 0o644)
}

func compareMetrics(t *testing.T, sh *kubeShared) {
	sh.mu.Lock()
	ours, up := sh.metrics["ours"], sh.metrics["upstream"]
	sh.mu.Unlock()
	if ours == "" || up == "" {
		skipOrFail(t, "metrics_same_state did not record /metrics for both implementations")
	}
	of, uf := parseFamilies(ours, "konnectivity_"), parseFamilies(up, "konnectivity_")
	names := map[string]bool{}
	for n := range of {
		names[n] = true
	}
	for n := range uf {
		names[n] = true
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	var same, additions, newer, onlyUpstream, onlyOurs, differ []string
	for _, n := range sorted {
		o, inO := of[n]
		u, inU := uf[n]
		switch {
		case inO && inU:
			if o != u {
				differ = append(differ, fmt.Sprintf("%s:\n      ours     HELP %q TYPE %q\n      upstream HELP %q TYPE %q", n, o.help, o.typ, u.help, u.typ))
			} else {
				same = append(same, n)
			}
		case inU:
			onlyUpstream = append(onlyUpstream, n)
		case ourAdditions[n]:
			additions = append(additions, n)
		case newerThanUpstreamBinary[n] != [2]string{}:
			want := newerThanUpstreamBinary[n]
			if o.help != want[0] || o.typ != want[1] {
				differ = append(differ, fmt.Sprintf("%s (upstream 0.37): ours HELP %q TYPE %q, want HELP %q TYPE %q", n, o.help, o.typ, want[0], want[1]))
			} else {
				newer = append(newer, n)
			}
		default:
			onlyOurs = append(onlyOurs, n)
		}
	}
	t.Logf("METRICS-DIFF: %d families with identical HELP+TYPE in both: %s", len(same), strings.Join(same, " "))
	t.Logf("METRICS-DIFF: our documented additions present: %s", strings.Join(additions, " "))
	t.Logf("METRICS-DIFF: upstream-0.37 families (not in the v0.36.0 binary) with 0.37's HELP/TYPE: %s", strings.Join(newer, " "))
	for n := range ourAdditions {
		if _, ok := of[n]; !ok {
			t.Logf("METRICS-DIFF: documented addition not exposed in this state: %s", n)
		}
	}
	if len(onlyUpstream) > 0 {
		t.Errorf("families upstream has and ours lacks: %s", strings.Join(onlyUpstream, " "))
	}
	if len(onlyOurs) > 0 {
		t.Errorf("undocumented families only ours has: %s", strings.Join(onlyOurs, " "))
	}
	if len(differ) > 0 {
		t.Errorf("HELP/TYPE differ:\n    %s", strings.Join(differ, "\n    "))
	}
	compareSeries(t, ours, up)
	// Process metrics as the Go server exposes them (informational: names and types).
	op, up2 := parseFamilies(ours, "process_"), parseFamilies(up, "process_")
	var pm []string
	for n, u := range up2 {
		if o, ok := op[n]; !ok {
			pm = append(pm, n+" (missing in ours)")
		} else if o.typ != u.typ {
			pm = append(pm, fmt.Sprintf("%s (type %s vs %s)", n, o.typ, u.typ))
		}
	}
	sort.Strings(pm)
	if len(pm) > 0 {
		t.Logf("METRICS-DIFF: process_* differences (informational): %s", strings.Join(pm, ", "))
	}
}

// sameValueFamilies are the families whose values the shared scenario fixes (one agent, two
// tunnels closed again, one refused dial, one culled lease): their series must have equal
// values in both. Other values (byte and packet counts, latencies, timestamps) are
// implementation detail and only logged when they differ.
var sameValueFamilies = []string{
	serverPrefix + "pending_backend_dials",
	serverPrefix + "established_connections",
	serverPrefix + "dial_failure_count",
	serverPrefix + "grpc_connections",
	serverPrefix + "ready_backend_connections",
	serverPrefix + "culled_leases_count",
}

// series parses the sample lines of every konnectivity_* series: "name{labels}" -> value,
// and, per sample name, the set of label names seen.
func series(text string) (map[string]string, map[string]map[string]bool) {
	values, labels := map[string]string{}, map[string]map[string]bool{}
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "konnectivity_") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		key, val := l[:i], l[i+1:]
		values[key] = val
		name, rest, _ := strings.Cut(key, "{")
		if labels[name] == nil {
			labels[name] = map[string]bool{}
		}
		for _, kv := range splitLabels(strings.TrimSuffix(rest, "}")) {
			if k, _, ok := strings.Cut(kv, "="); ok {
				labels[name][k] = true
			}
		}
	}
	return values, labels
}

// splitLabels splits `a="x",b="y,z"` at the commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// compareSeries diffs the label names of every sample name both expose, and the values of
// the sameValueFamilies series, after the same traffic.
func compareSeries(t *testing.T, ours, up string) {
	t.Helper()
	ov, ol := series(ours)
	uv, ul := series(up)
	var labelDiffs, valueDiffs, informational []string
	for name, u := range ul {
		o, ok := ol[name]
		if !ok {
			continue // a family missing on one side is reported by the HELP/TYPE diff
		}
		if a, b := strings.Join(sortedKeys(o), ","), strings.Join(sortedKeys(u), ","); a != b {
			labelDiffs = append(labelDiffs, fmt.Sprintf("%s: ours {%s}, upstream {%s}", name, a, b))
		}
	}
	checked := 0
	for key, u := range uv {
		o, ok := ov[key]
		name, _, _ := strings.Cut(key, "{")
		must := false
		for _, f := range sameValueFamilies {
			must = must || name == f
		}
		switch {
		case must && !ok:
			valueDiffs = append(valueDiffs, fmt.Sprintf("%s: upstream %s, ours has no such series", key, u))
		case must && o != u:
			valueDiffs = append(valueDiffs, fmt.Sprintf("%s: ours %s, upstream %s", key, o, u))
		case must:
			checked++
		case ok && o != u:
			informational = append(informational, fmt.Sprintf("%s ours=%s upstream=%s", key, o, u))
		}
	}
	sort.Strings(informational)
	t.Logf("METRICS-DIFF: %d series of %v have equal values; other differing values (informational): %s",
		checked, sameValueFamilies, strings.Join(informational, "; "))
	if checked == 0 {
		t.Errorf("no series of %v found in upstream's output to compare", sameValueFamilies)
	}
	if len(labelDiffs) > 0 {
		sort.Strings(labelDiffs)
		t.Errorf("label names differ:\n    %s", strings.Join(labelDiffs, "\n    "))
	}
	if len(valueDiffs) > 0 {
		sort.Strings(valueDiffs)
		t.Errorf("values differ after the same traffic:\n    %s", strings.Join(valueDiffs, "\n    "))
	}
}

func promtoolBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	home, _ := os.UserHomeDir()
	for _, p := range []string{filepath.Join(home, ".cache", "konnectivity-tools", "promtool")} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	skipOrFail(t, "promtool not found (tests/interop/tools.sh extracts it from Debian's prometheus package)")
	return ""
}

// promtoolCheck runs `promtool check metrics` on text: (lint findings name -> messages, error).
func promtoolCheck(t *testing.T, text string) (map[string][]string, string, error) {
	cmd := exec.Command(promtoolBin(t), "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	findings := map[string][]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		// "<metric name> <problem>" (promtool 2.x), or "<metric name>: <problem>".
		name, msg, ok := strings.Cut(l, " ")
		name = strings.TrimSuffix(name, ":")
		if !ok || !strings.HasPrefix(name, "konnectivity_") && !strings.HasPrefix(name, "process_") &&
			!strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "promhttp_") {
			continue
		}
		findings[name] = append(findings[name], msg)
	}
	return findings, out.String(), err
}

func runPromtoolAll(t *testing.T, sh *kubeShared) {
	for _, impl := range []string{"ours", "upstream"} {
		t.Run(impl, func(t *testing.T) {
			sh.mu.Lock()
			text := sh.metrics[impl]
			sh.mu.Unlock()
			if text == "" {
				skipOrFail(t, "no /metrics output recorded for %s", impl)
			}
			findings, out, err := promtoolCheck(t, text)
			if strings.Contains(out, "error while linting") || (err != nil && len(findings) == 0) {
				t.Fatalf("promtool could not parse the %s output: %v\n%s", impl, err, out)
			}
			var names []string
			for n := range findings {
				names = append(names, n)
			}
			sort.Strings(names)
			var bad []string
			for _, n := range names {
				for _, msg := range findings[n] {
					t.Logf("PROMTOOL[%s]: %s: %s", impl, n, msg)
					allowed := false
					for _, a := range promtoolAllowed[n] {
						allowed = allowed || a == msg
					}
					if !allowed {
						bad = append(bad, n+": "+msg)
					}
				}
			}
			if len(findings) == 0 && err != nil {
				t.Fatalf("promtool failed without findings: %v\n%s", err, out)
			}
			if impl == "ours" && len(bad) > 0 {
				t.Errorf("promtool lint findings on names not inherited from upstream:\n  %s", strings.Join(bad, "\n  "))
			}
			if impl == "upstream" && len(bad) > 0 {
				t.Logf("upstream has findings outside our allowed list (informational): %s", strings.Join(bad, "; "))
			}
		})
	}
}
