package interop

// Lifecycle scenarios: --config file, SIGHUP reload (sd_notify, new certificates under
// load, failed reloads) and the SIGTERM drain. Reload scenarios are ours-only (upstream
// has no reload); the drain scenarios also run against upstream, whose differences are
// logged as KNOWN-UPSTREAM-DIFF lines.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

const (
	metricReloads   = "konnectivity_network_proxy_server_reloads_total"
	shuttingDownErr = "konnectivity-server is shutting down: no new dials accepted"

	// Pace of one streaming tunnel (both directions use it): 8 KiB every 25 ms.
	streamChunk = 8 << 10
	streamEvery = 25 * time.Millisecond
)

func lifecycleScenarios() []scenarioX {
	return []scenarioX{
		{scenario: scenario{"reload_under_load", scReloadUnderLoad}, oursOnly: true, opts: reloadOpts},
		{scenario: scenario{"invalid_reload_keeps_serving", scInvalidReload}, oursOnly: true, opts: reloadOpts},
		{scenario: scenario{"drain_finishes_within_timeout", scDrainFinishes}, oursOnly: false, opts: drainOpts("10s")},
		{scenario: scenario{"drain_times_out", scDrainTimesOut}, oursOnly: false, opts: drainOpts("2s")},
		{scenario: scenario{"drain_zero_timeout", scDrainZero}, oursOnly: false, opts: drainOpts("0s")},
		{scenario: scenario{"second_sigterm_exits_at_once", scSecondSigterm}, oursOnly: false, opts: drainOpts("60s")},
	}
}

// ---------------------------------------------------------------- config file

// lcConfig is the TOML file our server reads with --config (keys = flag names in snake_case).
type lcConfig struct {
	cert, key  string
	ciphers    []string
	strategies string
	v          int
	graceful   string
	// decoyHealthPort goes into the file as health_port; --health-port must override it.
	decoyHealthPort int
	// extra is appended to the file as written (policy_test.go).
	extra string
}

func baseConfig(e *env, graceful string) lcConfig {
	cs := getCerts(e.t)
	return lcConfig{
		cert: cs.serverCert, key: cs.serverKey, strategies: "default", v: 4, graceful: graceful,
		// The admin port is in use by this very server: if the file won over the
		// --health-port flag, the server could not bind and would not come up.
		decoyHealthPort: e.adminPort,
	}
}

func (c lcConfig) toml() string {
	var b strings.Builder
	b.WriteString("# written by tests/interop/lifecycle_test.go\n")
	fmt.Fprintf(&b, "cluster_cert = %q\ncluster_key = %q\ncluster_ca_cert = %q\n", c.cert, c.key, certs.ca)
	fmt.Fprintf(&b, "proxy_strategies = %q\n", c.strategies)
	quoted := make([]string, len(c.ciphers))
	for i, s := range c.ciphers {
		quoted[i] = strconv.Quote(s)
	}
	fmt.Fprintf(&b, "cipher_suites = [%s]\n", strings.Join(quoted, ", "))
	fmt.Fprintf(&b, "v = %d\nwatch_files = false\ngraceful_shutdown_timeout = %q\n", c.v, c.graceful)
	fmt.Fprintf(&b, "health_port = %d\n", c.decoyHealthPort)
	b.WriteString(c.extra)
	return b.String()
}

// writeAtomic writes path via a temporary file and rename, as a config manager would.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func (e *env) writeConfig(t *testing.T, c lcConfig) {
	t.Helper()
	writeAtomic(t, e.configPath, []byte(c.toml()))
}

func reloadOpts(string) envOpts {
	return envOpts{config: func(e *env) string { return baseConfig(e, "10s").toml() }, notify: true}
}

// drainOpts: ours reads the timeout from its config file (and talks sd_notify);
// upstream gets the same value as a flag.
func drainOpts(graceful string) func(impl string) envOpts {
	return func(impl string) envOpts {
		if impl == "ours" {
			return envOpts{config: func(e *env) string { return baseConfig(e, graceful).toml() }, notify: true}
		}
		return envOpts{extraArgs: []string{"--graceful-shutdown-timeout=" + graceful}}
	}
}

// ---------------------------------------------------------------- certificates

// issueAgentPortCert writes a new server certificate (signed by the harness CA, same SANs)
// for the agent port: both files are written under temporary names and renamed into place.
func issueAgentPortCert(t *testing.T, key *rsa.PrivateKey, serial int64, certPath, keyPath string) {
	t.Helper()
	cs := getCerts(t)
	now := time.Now().Add(-time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: fmt.Sprintf("proxy-server-%d", serial)},
		NotBefore: now, NotAfter: now.Add(10 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, cs.caCert, &key.PublicKey, cs.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	writeAtomic(t, certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func genKeys(t *testing.T, n int) []*rsa.PrivateKey {
	t.Helper()
	keys := make([]*rsa.PrivateKey, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() { defer wg.Done(); keys[i], errs[i] = rsa.GenerateKey(rand.Reader, 2048) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return keys
}

// agentTLSProbe makes a fresh mTLS handshake (as an agent would) on the agent port and
// returns the presented certificate and the negotiated suite.
func (e *env) agentTLSProbe(tls12 bool) (*x509.Certificate, uint16, error) {
	cs := getCerts(e.t)
	pool := x509.NewCertPool()
	pool.AddCert(cs.caCert)
	cert, err := tls.LoadX509KeyPair(cs.agentCert, cs.agentKey)
	if err != nil {
		return nil, 0, err
	}
	cfg := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: "localhost", NextProtos: []string{"h2"}}
	if tls12 {
		cfg.MaxVersion = tls.VersionTLS12
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp",
		fmt.Sprintf("127.0.0.1:%d", e.agentPort), cfg)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()
	st := conn.ConnectionState()
	return st.PeerCertificates[0], st.CipherSuite, nil
}

func (e *env) expectAgentSerial(t *testing.T, want int64) {
	t.Helper()
	c, _, err := e.agentTLSProbe(false)
	if err != nil {
		t.Fatalf("fresh TLS handshake on the agent port: %v", err)
	}
	if c.SerialNumber.Cmp(big.NewInt(want)) != 0 {
		t.Fatalf("agent port presents certificate serial %v (%s), want %d", c.SerialNumber, c.Subject.CommonName, want)
	}
}

// ---------------------------------------------------------------- sd_notify

type notifyMsg struct {
	at   time.Time
	text string
	kv   map[string]string
}

// periodic: a heartbeat (STATUS= and/or WATCHDOG=1 only), skipped by next.
func (m notifyMsg) periodic() bool {
	for k := range m.kv {
		if k != "STATUS" && k != "WATCHDOG" {
			return false
		}
	}
	return true
}

// notifier is the $NOTIFY_SOCKET end (a unixgram socket, as systemd binds it).
type notifier struct {
	path string
	conn *net.UnixConn
	ch   chan notifyMsg
	mu   sync.Mutex
	all  []string
}

func newNotifier(t *testing.T, path string) *notifier {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatalf("binding NOTIFY_SOCKET %s: %v", path, err)
	}
	n := &notifier{path: path, conn: conn, ch: make(chan notifyMsg, 8192)}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				close(n.ch)
				return
			}
			m := notifyMsg{at: time.Now(), text: string(buf[:k]), kv: map[string]string{}}
			for _, line := range strings.Split(strings.TrimRight(m.text, "\n"), "\n") {
				if k, v, ok := strings.Cut(line, "="); ok {
					m.kv[k] = v
				}
			}
			n.mu.Lock()
			n.all = append(n.all, fmt.Sprintf("%s %q", m.at.Format("15:04:05.000"), m.text))
			n.mu.Unlock()
			n.ch <- m
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		if t.Failed() {
			n.mu.Lock()
			all := n.all
			if len(all) > 30 {
				all = all[len(all)-30:]
			}
			t.Logf("---- last sd_notify messages ----\n%s", strings.Join(all, "\n"))
			n.mu.Unlock()
		}
	})
	return n
}

// next returns the next message that is not a periodic STATUS/WATCHDOG one.
func (n *notifier) next(t *testing.T, timeout time.Duration, what string) notifyMsg {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case m, ok := <-n.ch:
			if !ok {
				t.Fatalf("NOTIFY_SOCKET closed while waiting for %s", what)
			}
			if m.periodic() {
				continue
			}
			return m
		case <-deadline.C:
			t.Fatalf("no sd_notify message within %v while waiting for %s", timeout, what)
		}
	}
}

// expectStartReady checks the first non-periodic message: READY=1, STATUS=serving: ...
func (e *env) expectStartReady(t *testing.T) {
	t.Helper()
	m := e.notify.next(t, 20*time.Second, "READY=1 at start")
	if m.kv["READY"] != "1" || !strings.HasPrefix(m.kv["STATUS"], "serving: ") {
		t.Fatalf("first sd_notify message: want READY=1 and STATUS=serving: ..., got %q", m.text)
	}
	t.Logf("start: %q", m.text)
}

// reload sends SIGHUP and waits for RELOADING=1 (with MONOTONIC_USEC) and then READY=1.
// It returns the READY message and the time from the signal to its arrival.
func (e *env) reload(t *testing.T) (notifyMsg, time.Duration) {
	t.Helper()
	start := time.Now()
	e.server.signal(syscall.SIGHUP)
	m := e.notify.next(t, 20*time.Second, "RELOADING=1 after SIGHUP")
	if m.kv["RELOADING"] != "1" || m.kv["MONOTONIC_USEC"] == "" {
		t.Fatalf("after SIGHUP: want RELOADING=1 with MONOTONIC_USEC, got %q", m.text)
	}
	r := e.notify.next(t, 20*time.Second, "READY=1 after RELOADING=1")
	if r.kv["READY"] != "1" {
		t.Fatalf("after RELOADING=1: want READY=1, got %q", r.text)
	}
	return r, r.at.Sub(start)
}

func (e *env) reloadCounts(t *testing.T) (success, failure float64) {
	t.Helper()
	m, err := e.serverMetrics()
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	return m.sum(metricReloads, `result="success"`), m.sum(metricReloads, `result="failure"`)
}

func (e *env) established(t *testing.T) float64 {
	t.Helper()
	m, err := e.serverMetrics()
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	return m.sum(metricEstablished)
}

// ---------------------------------------------------------------- far end: framed streams

// serveExtra adds two framed, open-ended streams to the far end (frame = u32 length + data,
// length 0 ends; trailer = u64 total + sha256 of all data):
//
//	"TICK <seed> <chunk> <ms>\n" -> one frame of <chunk> ChaCha8 bytes every <ms> until the
//	                                peer sends a line (or goes away), then frame 0 + trailer
//	"SINK\n" + frames            -> after frame 0: trailer of what was received
func serveExtra(f []string, c net.Conn, br *bufio.Reader) {
	switch f[0] {
	case "TICK":
		if len(f) != 4 {
			return
		}
		seed, _ := strconv.ParseUint(f[1], 10, 64)
		chunk, _ := strconv.Atoi(f[2])
		ms, _ := strconv.Atoi(f[3])
		stop := make(chan struct{})
		go func() { _, _ = br.ReadString('\n'); close(stop) }()
		r, h, total := dataStream(seed), sha256.New(), uint64(0)
		buf := make([]byte, 4+chunk)
		tick := time.NewTicker(time.Duration(ms) * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				_, _ = c.Write(trailer(total, h.Sum(nil)))
				return
			case <-tick.C:
			}
			binary.BigEndian.PutUint32(buf, uint32(chunk))
			_, _ = io.ReadFull(r, buf[4:])
			h.Write(buf[4:])
			total += uint64(chunk)
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	case "SINK":
		h, total := sha256.New(), uint64(0)
		hdr := make([]byte, 4)
		for {
			if _, err := io.ReadFull(br, hdr); err != nil {
				return
			}
			n := binary.BigEndian.Uint32(hdr)
			if n == 0 {
				_, _ = c.Write(trailer(total, h.Sum(nil))[4:])
				return
			}
			if _, err := io.CopyN(h, br, int64(n)); err != nil {
				return
			}
			total += uint64(n)
		}
	}
}

// trailer = frame 0, u64 total, sha256.
func trailer(total uint64, sum []byte) []byte {
	b := make([]byte, 4+8, 4+8+32)
	binary.BigEndian.PutUint64(b[4:], total)
	return append(b, sum...)
}

// ---------------------------------------------------------------- client side: streaming tunnels

// streamDown reads TICK frames, compares every byte with the expected ChaCha8 stream, and
// after stop checks the far end's total and sha256. progress counts verified bytes.
func streamDown(conn net.Conn, seed uint64, stop <-chan struct{}, progress *atomic.Int64) error {
	if _, err := fmt.Fprintf(conn, "TICK %d %d %d\n", seed, streamChunk, streamEvery.Milliseconds()); err != nil {
		return fmt.Errorf("write TICK: %w", err)
	}
	var stopSent atomic.Bool
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		select {
		case <-stop:
			stopSent.Store(true)
			_, _ = conn.Write([]byte("STOP\n"))
		case <-quit:
		}
	}()
	exp, h, total := dataStream(seed), sha256.New(), int64(0)
	hdr, buf, want := make([]byte, 4), make([]byte, streamChunk), make([]byte, streamChunk)
	for {
		if _, err := io.ReadFull(conn, hdr); err != nil {
			return fmt.Errorf("tunnel closed early after %d verified bytes (STOP sent: %v): %v", total, stopSent.Load(), err)
		}
		n := int(binary.BigEndian.Uint32(hdr))
		if n == 0 {
			tr := make([]byte, 40)
			if _, err := io.ReadFull(conn, tr); err != nil {
				return fmt.Errorf("reading trailer after %d bytes: %v", total, err)
			}
			if !stopSent.Load() {
				return fmt.Errorf("far end ended the stream without STOP")
			}
			if got := int64(binary.BigEndian.Uint64(tr)); got != total {
				return fmt.Errorf("far end sent %d bytes, %d arrived", got, total)
			}
			if !bytes.Equal(tr[8:], h.Sum(nil)) {
				return fmt.Errorf("sha256 of the %d bytes received differs from the far end's", total)
			}
			return nil
		}
		if n != streamChunk {
			return fmt.Errorf("bad frame length %d after %d bytes", n, total)
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			return fmt.Errorf("tunnel closed early inside a frame after %d verified bytes: %v", total, err)
		}
		_, _ = io.ReadFull(exp, want)
		if !bytes.Equal(buf, want) {
			return fmt.Errorf("data mismatch in the frame at offset %d", total)
		}
		h.Write(buf)
		total += int64(n)
		progress.Store(total)
	}
}

// streamUp sends SINK frames until stop, then checks the far end's total and sha256.
func streamUp(conn net.Conn, seed uint64, stop <-chan struct{}, progress *atomic.Int64) error {
	if _, err := fmt.Fprintf(conn, "SINK\n"); err != nil {
		return fmt.Errorf("write SINK: %w", err)
	}
	r, h, total := dataStream(seed), sha256.New(), int64(0)
	buf := make([]byte, 4+streamChunk)
	tick := time.NewTicker(streamEvery)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-stop:
			done = true
			continue
		case <-tick.C:
		}
		binary.BigEndian.PutUint32(buf, streamChunk)
		_, _ = io.ReadFull(r, buf[4:])
		if _, err := conn.Write(buf); err != nil {
			return fmt.Errorf("tunnel write failed after %d bytes: %v", total, err)
		}
		h.Write(buf[4:])
		total += streamChunk
		progress.Store(total)
	}
	if _, err := conn.Write(make([]byte, 4)); err != nil {
		return fmt.Errorf("writing the end frame after %d bytes: %v", total, err)
	}
	tr := make([]byte, 40)
	if _, err := io.ReadFull(conn, tr); err != nil {
		return fmt.Errorf("reading the far end's checksum after %d bytes: %v", total, err)
	}
	if got := int64(binary.BigEndian.Uint64(tr)); got != total {
		return fmt.Errorf("sent %d bytes, far end received %d", total, got)
	}
	if !bytes.Equal(tr[8:], h.Sum(nil)) {
		return fmt.Errorf("far end sha256 of %d bytes differs", total)
	}
	return nil
}

// streamSet is n single-use tunnels streaming (even: download, odd: upload) until stopped.
type streamSet struct {
	n        int
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
	errs     []error
	ends     []time.Time
	progress []atomic.Int64
	tunnels  []client.Tunnel
	failed   atomic.Int64
	firstErr atomic.Pointer[string]
}

// startStreams opens n tunnels (16 dials at a time) and returns once every one of them
// has moved its first chunk.
func startStreams(t *testing.T, e *env, n int, seedBase uint64) *streamSet {
	t.Helper()
	s := &streamSet{n: n, stop: make(chan struct{}), done: make(chan struct{}),
		errs: make([]error, n), ends: make([]time.Time, n), progress: make([]atomic.Int64, n),
		tunnels: make([]client.Tunnel, n)}
	t.Cleanup(s.halt)
	ready := make(chan int, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := func() error {
				sem <- struct{}{}
				ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
				conn, tunnel, err := e.dial(ctx, e.far.addr)
				cancel()
				<-sem
				s.tunnels[i] = tunnel
				if err != nil {
					return fmt.Errorf("dial: %w", err)
				}
				defer conn.Close()
				// Report readiness after the first chunk moved.
				go func() {
					for s.progress[i].Load() == 0 {
						select {
						case <-s.stop:
							return
						case <-time.After(5 * time.Millisecond):
						}
					}
					ready <- i
				}()
				if i%2 == 0 {
					return streamDown(conn, seedBase+uint64(i), s.stop, &s.progress[i])
				}
				return streamUp(conn, seedBase+uint64(i), s.stop, &s.progress[i])
			}()
			s.ends[i] = time.Now()
			s.errs[i] = err
			if err != nil {
				if s.failed.Add(1) == 1 {
					msg := fmt.Sprintf("tunnel %d: %v", i, err)
					s.firstErr.Store(&msg)
				}
			}
		}()
	}
	go func() { wg.Wait(); close(s.done) }()
	deadline := time.After(60 * time.Second)
	for got := 0; got < n; got++ {
		select {
		case <-ready:
		case <-s.done:
			s.check(t)
			t.Fatalf("all tunnels ended before streaming")
		case <-deadline:
			s.check(t)
			t.Fatalf("only %d/%d tunnels streaming after 60s", got, n)
		}
		s.check(t)
	}
	return s
}

func (s *streamSet) halt() { s.stopOnce.Do(func() { close(s.stop) }) }

// check fails the test if any tunnel has failed so far.
func (s *streamSet) check(t *testing.T) {
	t.Helper()
	if n := s.failed.Load(); n > 0 {
		t.Fatalf("%d/%d streaming tunnels failed; first: %s", n, s.n, *s.firstErr.Load())
	}
}

func (s *streamSet) bytes() int64 {
	var sum int64
	for i := range s.progress {
		sum += s.progress[i].Load()
	}
	return sum
}

// waitProgress waits until every tunnel moved more data than in snapshot.
func (s *streamSet) waitProgress(t *testing.T, what string) {
	t.Helper()
	snap := make([]int64, s.n)
	for i := range snap {
		snap[i] = s.progress[i].Load()
	}
	eventually(t, 20*time.Second, "every tunnel moving data "+what, func() (bool, string) {
		s.check(t)
		behind := 0
		for i := range snap {
			if s.progress[i].Load() <= snap[i] {
				behind++
			}
		}
		return behind == 0, fmt.Sprintf("%d tunnels without progress", behind)
	})
}

// finish stops every tunnel, waits for them, and fails on any error. Returns the bytes verified.
func (s *streamSet) finish(t *testing.T, timeout time.Duration) int64 {
	t.Helper()
	s.halt()
	s.wait(t, timeout)
	s.check(t)
	return s.bytes()
}

func (s *streamSet) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(timeout):
		t.Fatalf("streaming tunnels did not end within %v", timeout)
	}
}

func (s *streamSet) lastEnd() time.Time {
	var last time.Time
	for _, e := range s.ends {
		if e.After(last) {
			last = e
		}
	}
	return last
}

// ---------------------------------------------------------------- reload scenarios

func scReloadUnderLoad(t *testing.T, e *env) {
	const nTunnels, nReloads = 200, 100
	e.expectStartReady(t)
	e.withAgent("a1", "")
	keys := genKeys(t, 3)
	e.expectAgentSerial(t, 2)

	s := startStreams(t, e, nTunnels, 10_000)
	eventually(t, 10*time.Second, fmt.Sprintf("established_connections == %d", nTunnels), func() (bool, string) {
		v := e.established(t)
		return v == nTunnels, fmt.Sprint(v)
	})
	before := e.established(t)
	bytesAtStart := s.bytes()

	cfg := baseConfig(e, "10s")
	cipherSets := [][]string{
		{"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"},
		{"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"},
	}
	cipherIDs := []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384}
	fixedCert, fixedKey := filepath.Join(e.dir, "agent-port.crt"), filepath.Join(e.dir, "agent-port.key")
	var lat []time.Duration
	serial, certChanges, cipherChanges := int64(100), 0, 0
	wantStatus := fmt.Sprintf("serving: 1 agents, %d tunnels", nTunnels)
	badStatus := 0
	verbosityDials := map[int][]string{}
	var kindTime [4]time.Duration
	for i := 0; i < nReloads; i++ {
		kind := i % 4
		kindStart := time.Now()
		switch kind {
		case 0: // new certificate for the agent port (same CA)
			serial++
			certChanges++
			if certChanges%2 == 1 { // new file names, referenced by the rewritten config
				cfg.cert = filepath.Join(e.dir, fmt.Sprintf("agent-port-%d.crt", serial))
				cfg.key = filepath.Join(e.dir, fmt.Sprintf("agent-port-%d.key", serial))
			} else { // renamed over the same paths
				cfg.cert, cfg.key = fixedCert, fixedKey
			}
			issueAgentPortCert(t, keys[certChanges%len(keys)], serial, cfg.cert, cfg.key)
		case 1:
			cfg.ciphers = cipherSets[cipherChanges%2]
			cipherChanges++
		case 2:
			if cfg.strategies == "default" {
				cfg.strategies = "destHost,default"
			} else {
				cfg.strategies = "default"
			}
		case 3:
			cfg.v = 9 - cfg.v // 4 <-> 5
		}
		e.writeConfig(t, cfg)
		ready, d := e.reload(t)
		lat = append(lat, d)
		if !strings.HasPrefix(ready.kv["STATUS"], "serving: ") {
			t.Fatalf("reload %d (kind %d): READY=1 with STATUS %q", i+1, kind, ready.kv["STATUS"])
		}
		if ready.kv["STATUS"] != wantStatus {
			badStatus++
			if badStatus <= 3 {
				t.Errorf("reload %d: STATUS %q, want %q", i+1, ready.kv["STATUS"], wantStatus)
			}
		}
		switch kind {
		case 0:
			e.expectAgentSerial(t, serial)
		case 3:
			// A dial to a fresh closed port: logged at debug level ("dialing through
			// agent") only while v=5 is in force; checked against the log at the end.
			addr := closedPort(t)
			dctx, dcancel := context.WithTimeout(e.ctx, 10*time.Second)
			if c, _, err := e.dial(dctx, addr); err == nil {
				c.Close()
				t.Fatalf("dial to closed port %s succeeded", addr)
			}
			dcancel()
			verbosityDials[cfg.v] = append(verbosityDials[cfg.v], addr)
		case 1:
			_, suite, err := e.agentTLSProbe(true)
			if err != nil {
				t.Fatalf("reload %d: TLS 1.2 handshake with cipher_suites=%v: %v", i+1, cfg.ciphers, err)
			}
			if want := cipherIDs[(cipherChanges-1)%2]; suite != want {
				t.Fatalf("reload %d: TLS 1.2 negotiated %s, want %s (cipher_suites=%v)", i+1,
					tls.CipherSuiteName(suite), tls.CipherSuiteName(want), cfg.ciphers)
			}
		}
		// Every reload rebuilds the agent port's TLS configuration: the client-certificate
		// check must survive each one.
		e.expectClientCertEnforced(t, fmt.Sprintf("after reload %d (kind %d)", i+1, kind))
		s.check(t)
		kindTime[kind] += time.Since(kindStart)
	}
	t.Logf("time per reload kind (cert, cipher, strategies, v): %v", kindTime)
	// v: every dial made under v=5 is logged at V5 ("DIAL_REQ sent to backend", as upstream),
	// none made under v=4 is (the last toggle leaves v=5, so once its line is there, every
	// earlier line is too).
	// Under v=5 the server logs every data frame too, so by now its log holds hundreds of MB:
	// it is read once per look, line by line, and only the dial lines are matched.
	dialed := append(slices.Clone(verbosityDials[4]), verbosityDials[5]...)
	dialLogged := func() map[string]bool {
		logged := map[string]bool{}
		f, err := os.Open(e.server.logPath)
		if err != nil {
			t.Fatalf("server log: %v", err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, "DIAL_REQ sent to backend") {
				continue
			}
			for _, a := range dialed {
				if regexp.MustCompile(regexp.QuoteMeta(a) + `\b`).MatchString(line) {
					logged[a] = true
				}
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("reading the server log: %v", err)
		}
		return logged
	}
	if cfg.v != 5 || len(verbosityDials[5]) == 0 {
		t.Fatalf("test bug: expected to end with v=5")
	}
	var logged map[string]bool
	eventually(t, 5*time.Second, "debug lines of dials made under v=5 in the server log", func() (bool, string) {
		logged = dialLogged()
		missing := 0
		for _, a := range verbosityDials[5] {
			if !logged[a] {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d/%d missing", missing, len(verbosityDials[5]))
	})
	for _, a := range verbosityDials[4] {
		if logged[a] {
			t.Errorf("dial to %s made under v=4 was logged at debug level", a)
		}
	}
	after := e.established(t)
	if before != nTunnels || after != nTunnels {
		t.Fatalf("established_connections before=%v after=%v, want %d", before, after, nTunnels)
	}
	if ok, bad := e.reloadCounts(t); ok != nReloads || bad != 0 {
		t.Fatalf("reloads_total success=%v failure=%v, want %d and 0", ok, bad, nReloads)
	}
	s.waitProgress(t, "after the reloads")
	// A new tunnel through the last configuration.
	if err := fetch(e.ctx, e.singleUse(), e.far.addr, 256<<10, 4242); err != nil {
		t.Fatalf("new tunnel after %d reloads: %v", nReloads, err)
	}
	total := s.finish(t, 30*time.Second)

	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	t.Logf("verbosity: %d dials under v=5 logged at debug level, %d under v=4 not", len(verbosityDials[5]), len(verbosityDials[4]))
	t.Logf("RELOAD-FIGURES: reloads=%d (cert changes %d, cipher %d) latency SIGHUP->READY=1 median=%v p90=%v worst=%v; "+
		"tunnels alive before=%v after=%v; bytes checked=%d (%.1f MiB, %.1f MiB during reloads)",
		nReloads, certChanges, cipherChanges, sorted[len(sorted)/2].Round(10*time.Microsecond),
		sorted[len(sorted)*9/10].Round(10*time.Microsecond), sorted[len(sorted)-1].Round(10*time.Microsecond),
		before, after, total, float64(total)/mib, float64(total-bytesAtStart)/mib)
}

func scInvalidReload(t *testing.T, e *env) {
	e.expectStartReady(t)
	e.withAgent("a1", "")
	e.expectAgentSerial(t, 2)
	s := startStreams(t, e, 10, 20_000)
	cfg := baseConfig(e, "10s")

	stillServing := func(what string) {
		t.Helper()
		s.waitProgress(t, what)
		e.waitReadyz(200, 5*time.Second)
		e.expectAgentSerial(t, 2)
		e.expectClientCertEnforced(t, what)
		if err := fetch(e.ctx, e.singleUse(), e.far.addr, 128<<10, 77); err != nil {
			t.Fatalf("new tunnel %s: %v", what, err)
		}
	}
	failedReload := func(what, contains string) {
		t.Helper()
		ready, d := e.reload(t)
		st := ready.kv["STATUS"]
		if !strings.HasPrefix(st, "reload failed: ") {
			t.Fatalf("%s: want READY=1 with STATUS=reload failed: ..., got %q", what, ready.text)
		}
		if !strings.Contains(st, contains) {
			t.Errorf("%s: failure cause %q does not mention %q", what, st, contains)
		}
		t.Logf("%s: %q after %v", what, st, d.Round(time.Microsecond))
		stillServing("after " + what)
	}

	// 1. Broken TOML.
	writeAtomic(t, e.configPath, []byte(cfg.toml()+"cluster_key = \"unterminated\nv = [\n"))
	failedReload("broken TOML", filepath.Base(e.configPath))

	// 2. Valid TOML naming a key file that does not exist.
	missing := cfg
	missing.cert = filepath.Join(e.dir, "new.crt")
	missing.key = filepath.Join(e.dir, "does-not-exist.key")
	issueAgentPortCert(t, genKeys(t, 1)[0], 300, missing.cert, filepath.Join(e.dir, "new.key"))
	e.writeConfig(t, missing)
	failedReload("missing key file", "does-not-exist.key")

	// 3. The next valid configuration applies.
	valid := cfg
	valid.cert, valid.key = missing.cert, filepath.Join(e.dir, "new.key")
	e.writeConfig(t, valid)
	ready, d := e.reload(t)
	if !strings.HasPrefix(ready.kv["STATUS"], "serving: ") {
		t.Fatalf("valid reload after failures: %q", ready.text)
	}
	t.Logf("valid reload: %q after %v", ready.kv["STATUS"], d.Round(time.Microsecond))
	e.expectAgentSerial(t, 300)
	e.expectClientCertEnforced(t, "after the valid reload")
	if ok, bad := e.reloadCounts(t); ok != 1 || bad != 2 {
		t.Fatalf("reloads_total success=%v failure=%v, want 1 and 2", ok, bad)
	}
	s.waitProgress(t, "after the valid reload")
	if est := e.established(t); est != 10 {
		t.Fatalf("established_connections = %v, want 10", est)
	}
	total := s.finish(t, 30*time.Second)
	t.Logf("10 tunnels streamed through 2 failed and 1 good reload, %d bytes verified", total)
}

// ---------------------------------------------------------------- drain scenarios

func (e *env) sigterm(t *testing.T) time.Time {
	t.Helper()
	at := time.Now()
	e.server.signal(syscall.SIGTERM)
	if e.notify != nil {
		m := e.notify.next(t, 10*time.Second, "STOPPING=1 after SIGTERM")
		if m.kv["STOPPING"] != "1" {
			t.Fatalf("after SIGTERM: want STOPPING=1, got %q", m.text)
		}
		t.Logf("sd_notify after SIGTERM: %q", m.text)
	}
	return at
}

// waitExit waits for the server to exit and returns when it did and its exit code.
func (e *env) waitExit(t *testing.T, timeout time.Duration) (time.Time, int) {
	t.Helper()
	e.server.exitExpected.Store(true)
	select {
	case <-e.server.done:
	case <-time.After(timeout):
		t.Fatalf("server still running %v later", timeout)
	}
	at := time.Now()
	return at, e.server.cmd.ProcessState.ExitCode()
}

func (e *env) udsRefused() (bool, string) {
	c, err := net.DialTimeout("unix", e.sock, 2*time.Second)
	if err != nil {
		return true, err.Error()
	}
	c.Close()
	return false, "UDS connect succeeded"
}

func (e *env) readyzCode() string {
	code, body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", e.healthPort))
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%d %q", code, strings.TrimSpace(body))
}

func scDrainFinishes(t *testing.T, e *env) {
	ours := e.impl == "ours"
	if ours {
		e.expectStartReady(t)
	}
	e.withAgent("a1", "")
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	rt, err := client.CreateGRPCTunnel(ctx, e.sock, e.grpcOpts()...)
	if err != nil {
		t.Fatalf("CreateGRPCTunnel: %v", err)
	}
	defer rt.Close()
	rtDial := func(ctx context.Context, addr string) (net.Conn, error) { return rt.DialContext(ctx, "tcp", addr) }
	if err := fetch(ctx, rtDial, e.far.addr, 64<<10, 5); err != nil {
		t.Fatalf("fetch over the reusable tunnel before SIGTERM: %v", err)
	}
	s := startStreams(t, e, 10, 30_000)

	sigAt := e.sigterm(t)
	// /readyz
	if ours {
		e.waitReadyz(500, 2*time.Second)
		t.Logf("/readyz during the drain: %s", e.readyzCode())
	} else {
		time.Sleep(200 * time.Millisecond) // only to observe, nothing depends on it
		knownDiff(t, "drain-readyz", "upstream /readyz during the drain: %s (its health server shuts down)", e.readyzCode())
	}
	// A new dial on the existing reusable-tunnel connection.
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := rt.DialContext(dctx, "tcp", e.far.addr)
	dcancel()
	if err == nil {
		conn.Close()
		t.Fatalf("new dial on an existing frontend connection succeeded during the drain")
	}
	if ours {
		if !strings.Contains(err.Error(), shuttingDownErr) {
			t.Fatalf("new dial during the drain: want error containing %q, got %q", shuttingDownErr, err)
		}
		t.Logf("new dial during the drain: %v", err)
	} else {
		knownDiff(t, "drain-dial", "upstream new dial on an existing connection during the drain: %v", err)
	}
	// New UDS connections and new agents are refused.
	eventually(t, 2*time.Second, "new UDS connections refused", func() (bool, string) { return e.udsRefused() })
	_, _, uerr := e.dial(ctx, e.far.addr)
	if uerr == nil {
		t.Fatalf("new single-use tunnel over a new UDS connection succeeded during the drain")
	}
	t.Logf("new UDS tunnel during the drain: %v", uerr)
	eventually(t, 2*time.Second, "new agent TLS connections refused", func() (bool, string) {
		_, _, err := e.agentTLSProbe(false)
		if err == nil {
			return false, "agent-port TLS handshake succeeded"
		}
		return true, err.Error()
	})
	if !ours {
		// Upstream's agent server GracefulStop sends GOAWAY; the agent drops that server
		// connection at its next connection sync (~1s) and every tunnel through it closes.
		// Whether our tunnels finish first is timing, so upstream is observed, not judged.
		s.halt()
		s.wait(t, 30*time.Second)
		if err := errors.Join(s.errs...); err != nil {
			knownDiff(t, "drain-agent-leaves", "upstream tunnels did not all finish %v after SIGTERM: %v", time.Since(sigAt).Round(time.Millisecond), err)
		}
		exitAt, code := e.waitExit(t, 20*time.Second)
		knownDiff(t, "drain-exit", "upstream exited with code %d %v after SIGTERM (%v after the last tunnel ended; graceful timeout 10s)",
			code, exitAt.Sub(sigAt).Round(time.Millisecond), exitAt.Sub(s.lastEnd()).Round(time.Millisecond))
		return
	}
	// Live tunnels keep moving data, then finish and verify.
	s.waitProgress(t, "during the drain")
	if e.server.exited() {
		t.Fatalf("server exited during the drain with tunnels open: %v", e.server.exitErr)
	}
	total := s.finish(t, 30*time.Second)
	last := s.lastEnd()
	exitAt, code := e.waitExit(t, 20*time.Second)
	afterLast, afterSig := exitAt.Sub(last).Round(time.Millisecond), exitAt.Sub(sigAt).Round(time.Millisecond)
	t.Logf("10 tunnels finished %v after SIGTERM (%d bytes verified); exit code %d, %v after the last tunnel, %v after SIGTERM",
		last.Sub(sigAt).Round(time.Millisecond), total, code, afterLast, afterSig)
	if code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if afterLast > 3*time.Second || afterSig > 8*time.Second {
		t.Fatalf("exit %v after the last tunnel ended (%v after SIGTERM); want well before the 10s timeout", afterLast, afterSig)
	}
}

func scDrainTimesOut(t *testing.T, e *env) {
	ours := e.impl == "ours"
	if ours {
		e.expectStartReady(t)
	}
	e.withAgent("a1", "")
	s := startStreams(t, e, 3, 40_000) // never told to stop
	sigAt := e.sigterm(t)
	if ours {
		s.waitProgress(t, "during the drain")
	}
	s.wait(t, 2*time.Second+15*time.Second)
	for i, err := range s.errs {
		end := s.ends[i].Sub(sigAt).Round(time.Millisecond)
		t.Logf("tunnel %d ended %v after SIGTERM: %v", i, end, err)
		if err == nil || strings.Contains(err.Error(), "mismatch") || strings.Contains(err.Error(), "differs") {
			t.Errorf("tunnel %d: want a clean early close, got %v", i, err)
		}
		if !ours {
			if end < 1900*time.Millisecond {
				knownDiff(t, "drain-agent-leaves", "upstream tunnel %d closed %v after SIGTERM, before its 2s graceful timeout (the agent leaves on GOAWAY): %v", i, end, err)
			}
			continue
		}
		if end < 1900*time.Millisecond {
			t.Errorf("tunnel %d closed %v after SIGTERM, before the 2s graceful timeout", i, end)
		}
		if end > 2*time.Second+3*time.Second {
			t.Errorf("tunnel %d closed only %v after SIGTERM (timeout 2s)", i, end)
		}
		select {
		case <-s.tunnels[i].Done():
		case <-time.After(5 * time.Second):
			t.Errorf("tunnel %d: Done() not closed", i)
		}
	}
	exitAt, code := e.waitExit(t, 15*time.Second)
	t.Logf("exit code %d, %v after SIGTERM; %d bytes verified before the close",
		code, exitAt.Sub(sigAt).Round(time.Millisecond), s.bytes())
	if code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

func scDrainZero(t *testing.T, e *env) {
	ours := e.impl == "ours"
	if ours {
		e.expectStartReady(t)
	}
	e.withAgent("a1", "")
	s := startStreams(t, e, 3, 50_000)
	sigAt := e.sigterm(t)
	if !ours {
		// Upstream's timeout-0 path stops the frontend with GracefulStop, which waits for
		// the open streams. Observe for 4s, then end the tunnels ourselves.
		select {
		case <-e.server.done:
			knownDiff(t, "drain-zero", "upstream exited %v after SIGTERM with live tunnels", time.Since(sigAt).Round(time.Millisecond))
		case <-time.After(4 * time.Second):
			s.check(t)
			knownDiff(t, "drain-zero", "upstream with --graceful-shutdown-timeout=0 still running 4s after SIGTERM, tunnels alive (%d bytes so far); ending the tunnels from the client", s.bytes())
			s.halt()
		}
		s.wait(t, 15*time.Second)
		exitAt, code := e.waitExit(t, 15*time.Second)
		knownDiff(t, "drain-zero", "upstream exit code %d, %v after SIGTERM; tunnel errors: %v", code, exitAt.Sub(sigAt).Round(time.Millisecond), errors.Join(s.errs...))
		return
	}
	s.wait(t, 10*time.Second)
	for i, err := range s.errs {
		end := s.ends[i].Sub(sigAt).Round(time.Millisecond)
		t.Logf("tunnel %d ended %v after SIGTERM: %v", i, end, err)
		if err == nil || strings.Contains(err.Error(), "mismatch") || strings.Contains(err.Error(), "differs") {
			t.Errorf("tunnel %d: want a clean early close, got %v", i, err)
		}
		if end > 2*time.Second {
			t.Errorf("tunnel %d closed only %v after SIGTERM with timeout 0", i, end)
		}
	}
	exitAt, code := e.waitExit(t, 10*time.Second)
	t.Logf("exit code %d, %v after SIGTERM", code, exitAt.Sub(sigAt).Round(time.Millisecond))
	if code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

func scSecondSigterm(t *testing.T, e *env) {
	ours := e.impl == "ours"
	if ours {
		e.expectStartReady(t)
	}
	e.withAgent("a1", "")
	s := startStreams(t, e, 2, 60_000)
	sigAt := e.sigterm(t)
	// The first SIGTERM is being handled once new connections are refused.
	eventually(t, 5*time.Second, "new UDS connections refused", func() (bool, string) { return e.udsRefused() })
	s.waitProgress(t, "during the drain")
	if e.server.exited() {
		t.Fatalf("server exited before the second SIGTERM: %v", e.server.exitErr)
	}
	second := time.Now()
	e.server.signal(syscall.SIGTERM)
	exitAt, code := e.waitExit(t, 10*time.Second)
	took := exitAt.Sub(second).Round(time.Millisecond)
	t.Logf("second SIGTERM %v after the first: exit code %d after %v", second.Sub(sigAt).Round(time.Millisecond), code, took)
	if took > 2*time.Second {
		t.Fatalf("exit %v after the second SIGTERM (graceful timeout 60s); want at once", took)
	}
	s.wait(t, 10*time.Second)
}
