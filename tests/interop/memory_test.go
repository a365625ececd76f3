package interop

// Memory under slow readers (ours only): eight tunnels whose clients read nothing after the
// dial, each fed by an endless source through the upstream agent, and one healthy neighbour,
// all with the default queue settings. The server-wide queue budget must bound the server's
// memory, close the stalled tunnels (most unread bytes first), leave the neighbour's
// throughput alone, and give the memory back once they are closed. Upstream v0.36 stalls the
// whole agent instead (see hol_test.go), so it has no figure to compare here.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// memStalled is how many tunnels stop reading; KONN_MEM_STALLED overrides it for manual
// measurements (the closing notes give figures for 1 and 8).
var memStalled = func() int {
	if n, err := strconv.Atoi(os.Getenv("KONN_MEM_STALLED")); err == nil && n > 0 {
		return n
	}
	return 8
}()

const (
	memBudget        = 256 << 20 // --frontend-queue-budget-bytes default
	memSlack         = 64 << 20
	metricQueued     = "konnectivity_network_proxy_server_frontend_queued_bytes"
	metricBudgetClos = "konnectivity_network_proxy_server_frontend_queue_budget_closes_total"
	metricResident   = "konnectivity_network_proxy_server_allocator_resident_bytes"
)

func memoryScenarios() []scenarioX {
	opts := func(mode string) func(string) envOpts {
		return func(string) envOpts { return envOpts{mode: mode} }
	}
	return []scenarioX{
		{scenario: scenario{"memory_budget_grpc", func(t *testing.T, e *env) { scMemory(t, e, e.singleUse()) }}, opts: opts("grpc"), oursOnly: true},
		{scenario: scenario{"memory_budget_http_connect", func(t *testing.T, e *env) { scMemory(t, e, e.connectDialer()) }}, opts: opts("http-connect"), oursOnly: true},
	}
}

// rssBytes reads VmRSS of pid from /proc.
func rssBytes(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kib << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

func fmtMiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func scMemory(t *testing.T, e *env, d dialer) {
	e.withAgent("mem", "")
	pid := e.server.cmd.Process.Pid
	rss := func() int64 {
		r, err := rssBytes(pid)
		if err != nil {
			t.Fatalf("server RSS: %v", err)
		}
		return r
	}
	ctx, cancel := context.WithTimeout(e.ctx, 120*time.Second)
	defer cancel()

	// The healthy neighbour, reading all the time.
	var neighbourBytes atomic.Int64
	neighbourEnded := make(chan error, 1)
	nb, err := d(ctx, e.far.addr)
	if err != nil {
		t.Fatalf("neighbour: %v", err)
	}
	defer nb.Close()
	if _, err := fmt.Fprintf(nb, "STREAM %d\n", 900); err != nil {
		t.Fatalf("neighbour: %v", err)
	}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			k, err := nb.Read(buf)
			neighbourBytes.Add(int64(k))
			if err != nil {
				neighbourEnded <- err
				return
			}
		}
	}()
	rate := func(window time.Duration) float64 {
		before, t0 := neighbourBytes.Load(), time.Now()
		time.Sleep(window)
		return float64(neighbourBytes.Load()-before) / time.Since(t0).Seconds() / 1e6
	}
	time.Sleep(time.Second) // warm-up
	baseRate := rate(2 * time.Second)
	base := rss()

	// Eight clients that dial, ask for an endless stream, and never read.
	stalled := make([]interface{ Close() error }, 0, memStalled)
	for i := 0; i < memStalled; i++ {
		c, err := d(ctx, e.far.addr)
		if err != nil {
			t.Fatalf("stalled tunnel %d: %v", i, err)
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "STREAM %d\n", 910+i); err != nil {
			t.Fatalf("stalled tunnel %d: %v", i, err)
		}
		stalled = append(stalled, c)
	}

	// Until the budget has closed all eight: the peak RSS, the queued bytes, the neighbour.
	var peak, peakQueued, rssAtPeakQueued int64
	closedAt := time.Time{}
	stallRates := []float64{}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		r := rate(500 * time.Millisecond)
		stallRates = append(stallRates, r)
		now := rss()
		if now > peak {
			peak = now
		}
		m, err := e.serverMetrics()
		if err != nil {
			continue
		}
		if q := int64(m.sum(metricQueued)); q > peakQueued {
			peakQueued, rssAtPeakQueued = q, now
		}
		// Closed by our budget or limits, or by the client: konnectivity-client gives up on a
		// gRPC tunnel its application has not read for 10 s (its readTimeout).
		if m.sum(metricEstablished) <= 1 {
			closedAt = time.Now()
			break
		}
	}
	if closedAt.IsZero() {
		t.Logf("MEM-FIGURES mode=%s stalled=%d baseline_rss=%s peak_rss=%s (not all closed)", e.mode, memStalled, fmtMiB(base), fmtMiB(peak))
		m, _ := e.serverMetrics()
		t.Fatalf("the stalled tunnels were not all closed within 90 s: budget closes %v, overflows %v, established %v, queued %v",
			m.sum(metricBudgetClos), m.sum(metricOverfl), m.sum(metricEstablished), fmtMiB(int64(m.sum(metricQueued))))
	}
	duringRate := median(stallRates)

	// Memory given back: within 15 s of the closes, RSS is within baseline + 64 MiB.
	var after int64
	for giveBack := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		after = rss()
		if after <= base+memSlack || time.Now().After(giveBack) {
			break
		}
	}
	// For the figures: RSS 15 s after the closes, however soon it met the bound.
	time.Sleep(time.Until(closedAt.Add(15 * time.Second)))
	settled := rss()
	m, _ := e.serverMetrics()
	t.Logf("MEM-FIGURES mode=%s stalled=%d budget=%s baseline_rss=%s peak_rss=%s after_close_rss=%s rss_15s_after=%s peak_queued=%s rss_at_peak_queued=%s budget_closes=%v overflows=%v allocator_resident=%s neighbour_MBps base=%.2f during=%.2f",
		e.mode, memStalled, fmtMiB(memBudget), fmtMiB(base), fmtMiB(peak), fmtMiB(after), fmtMiB(settled), fmtMiB(peakQueued), fmtMiB(rssAtPeakQueued),
		m.sum(metricBudgetClos), m.sum(metricOverfl), fmtMiB(int64(m.sum(metricResident))), baseRate, duringRate)

	if after > base+memSlack {
		t.Errorf("15 s after the stalled tunnels closed, RSS is %s: more than baseline %s + 64 MiB", fmtMiB(after), fmtMiB(base))
	}
	if peak > base+memBudget+memSlack {
		t.Errorf("peak RSS %s exceeds baseline %s + budget %s + 64 MiB", fmtMiB(peak), fmtMiB(base), fmtMiB(memBudget))
	}
	if m.sum(metricBudgetClos) < 1 {
		t.Errorf("%s = %v, want >= 1: the budget never closed a tunnel", metricBudgetClos, m.sum(metricBudgetClos))
	}
	// Honest accounting: with a large queue, the queued bytes the server counts agree with
	// what its RSS grew by, within 25%.
	if peakQueued < 64<<20 {
		t.Errorf("queued bytes peaked at %s: too little to compare with RSS", fmtMiB(peakQueued))
	} else {
		grown := float64(rssAtPeakQueued - base)
		if q := float64(peakQueued); q < 0.75*grown || q > 1.25*grown {
			t.Errorf("queued %s but RSS grew by %s: not within 25%%", fmtMiB(peakQueued), fmtMiB(rssAtPeakQueued-base))
		}
	}
	if baseRate < 1 {
		t.Fatalf("neighbour baseline is only %.2f MB/s", baseRate)
	}
	if duringRate < 0.9*baseRate {
		t.Errorf("neighbour kept only %.0f%% of its throughput (%.2f of %.2f MB/s)", 100*duringRate/baseRate, duringRate, baseRate)
	}
	select {
	case err := <-neighbourEnded:
		t.Fatalf("the neighbour's tunnel ended: %v", err)
	default:
	}

	for _, c := range stalled {
		c.Close()
	}
	nb.Close()
	eventually(t, 20*time.Second, "pending, established and queued bytes == 0", func() (bool, string) {
		m, err := e.serverMetrics()
		if err != nil {
			return false, err.Error()
		}
		p, es, q := m.sum(metricPending), m.sum(metricEstablished), m.sum(metricQueued)
		return p == 0 && es == 0 && q == 0, fmt.Sprintf("pending=%v established=%v queued=%v", p, es, q)
	})
}
