package interop

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

const (
	metricPending     = "konnectivity_network_proxy_server_pending_backend_dials"
	metricEstablished = "konnectivity_network_proxy_server_established_connections"
	metricGRPCConns   = "konnectivity_network_proxy_server_grpc_connections"
	metricAgentServer = "konnectivity_network_proxy_agent_open_server_connections"
	metricAgentEndpts = "konnectivity_network_proxy_agent_open_endpoint_connections"

	skewAgentVersion  = "v0.34.0"
	skewClientVersion = "v0.31.2"
)

// ---------------------------------------------------------------- CI / skip

func ciMode() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v == "true" || v == "1" || v == "yes"
}

// skipOrFail skips the test, except under CI=true where a skip is a failure.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if ciMode() {
		t.Fatalf("CI=true forbids skipping: "+format, args...)
	}
	t.Skipf(format, args...)
}

// ---------------------------------------------------------------- binaries

type binaries struct {
	dir                                                          string
	server, agent, testClient, testServer, skewAgent, skewClient string
}

func upstreamBinaries(t *testing.T) binaries {
	t.Helper()
	dir := os.Getenv("UPSTREAM_BIN_DIR")
	if dir == "" {
		skipOrFail(t, "UPSTREAM_BIN_DIR is not set; run tests/interop/run.sh (it runs build.sh and sets it)")
	}
	b := binaries{
		dir:        dir,
		server:     filepath.Join(dir, "proxy-server"),
		agent:      filepath.Join(dir, "proxy-agent"),
		testClient: filepath.Join(dir, "proxy-test-client"),
		testServer: filepath.Join(dir, "http-test-server"),
		skewAgent:  filepath.Join(dir, "proxy-agent-"+skewAgentVersion),
		skewClient: filepath.Join(dir, "skew-client-"+skewClientVersion),
	}
	for _, p := range []string{b.server, b.agent, b.testClient, b.testServer, b.skewAgent, b.skewClient} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			skipOrFail(t, "upstream binary missing or not executable: %s (%v); run build.sh", p, err)
		}
	}
	return b
}

// ---------------------------------------------------------------- ports

var (
	portMu    sync.Mutex
	portsUsed = map[int]bool{}
)

// freePort returns a random currently-free TCP port on 127.0.0.1 in [1024, 32767]
// (below the kernel ephemeral range, and upstream rejects > 49151).
func freePort(t *testing.T) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for i := 0; i < 2000; i++ {
		p := 1024 + mrand.IntN(32767-1024+1)
		if portsUsed[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		l.Close()
		portsUsed[p] = true
		return p
	}
	t.Fatal("no free port found in [1024, 32767]")
	return 0
}

// ---------------------------------------------------------------- certificates

type certSet struct {
	dir, ca, serverCert, serverKey, agentCert, agentKey string
	// The CA itself, to issue more server certificates (lifecycle_test.go).
	caCert *x509.Certificate
	caKey  *rsa.PrivateKey
}

var (
	certsOnce sync.Once
	certs     certSet
	certsErr  error
	certsDir  string
)

func getCerts(t *testing.T) certSet {
	t.Helper()
	certsOnce.Do(func() {
		certsDir, certsErr = os.MkdirTemp("", "konn-interop-certs-")
		if certsErr == nil {
			certs, certsErr = genCerts(certsDir)
		}
	})
	if certsErr != nil {
		t.Fatalf("generating certificates: %v", certsErr)
	}
	return certs
}

func genCerts(dir string) (certSet, error) {
	cs := certSet{dir: dir}
	now := time.Now().Add(-time.Hour)
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return cs, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "konn-interop-ca"},
		NotBefore: now, NotAfter: now.Add(10 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return cs, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	cs.caCert, cs.caKey = caCert, caKey
	write := func(name, typ string, der []byte) (string, error) {
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
	}
	if cs.ca, err = write("ca.crt", "CERTIFICATE", caDER); err != nil {
		return cs, err
	}
	leaf := func(serial int64, cn string, eku x509.ExtKeyUsage, server bool) (string, string, error) {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now, NotAfter: now.Add(10 * 24 * time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage: []x509.ExtKeyUsage{eku},
		}
		if server {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			return "", "", err
		}
		kder, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return "", "", err
		}
		c, err := write(cn+".crt", "CERTIFICATE", der)
		if err != nil {
			return "", "", err
		}
		kp, err := write(cn+".key", "PRIVATE KEY", kder)
		return c, kp, err
	}
	if cs.serverCert, cs.serverKey, err = leaf(2, "proxy-server", x509.ExtKeyUsageServerAuth, true); err != nil {
		return cs, err
	}
	cs.agentCert, cs.agentKey, err = leaf(3, "proxy-agent", x509.ExtKeyUsageClientAuth, false)
	return cs, err
}

// ---------------------------------------------------------------- processes

type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	exitErr error
	// exitExpected: the scenario stops this process itself (SIGTERM/SIGINT/SIGKILL, waitExit,
	// a failed start); a server that exits without it fails the scenario (watchServer).
	exitExpected atomic.Bool
}

// startProc starts bin in its own process group; t.Cleanup kills the group
// (SIGKILL) and dumps the log tail if the test failed.
func startProc(t *testing.T, name, logDir, bin string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, name, logDir, nil, bin, args...)
}

// startProcEnv is startProc with extra environment variables ("K=V").
func startProcEnv(t *testing.T, name, logDir string, extraEnv []string, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	if len(extraEnv) > 0 {
		cmd.Env = append(os.Environ(), extraEnv...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s (%s): %v", name, bin, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.exitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("---- last lines of %s log (%s) ----\n%s", name, logPath, p.tail(40))
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig; SIGTERM, SIGINT and SIGKILL mean the scenario expects the exit.
func (p *proc) signal(sig syscall.Signal) {
	if sig == syscall.SIGTERM || sig == syscall.SIGINT || sig == syscall.SIGKILL {
		p.exitExpected.Store(true)
	}
	_ = syscall.Kill(p.cmd.Process.Pid, sig)
}

// panicMarkers: a Rust panic message (any thread or task) and a Go runtime panic or fatal error.
var panicMarkers = []string{"panicked at", "\npanic: ", "\nfatal error: "}

// panicked returns the log around the first panic marker, or "".
func (p *proc) panicked() string {
	log := "\n" + p.log()
	for _, m := range panicMarkers {
		if i := strings.Index(log, m); i >= 0 {
			start, end := max(0, i-300), min(len(log), i+1200)
			return log[start:end]
		}
	}
	return ""
}

// watchServer makes the scenario fail when the server process panicked (a Rust task panic
// does not end the process; only the log shows it) or exited without the scenario expecting
// it. Registered right after the start, so it runs before startProcEnv's kill cleanup.
func watchServer(t *testing.T, p *proc) {
	t.Helper()
	t.Cleanup(func() {
		if msg := p.panicked(); msg != "" {
			t.Errorf("%s PANICKED (log %s):\n%s", p.name, p.logPath, msg)
		}
		if p.exited() && !p.exitExpected.Load() {
			t.Errorf("%s exited during the scenario, which did not stop it: %v\n%s", p.name, p.exitErr, p.tail(30))
		}
	})
}

// kill SIGKILLs the process group and waits for the process to be reaped.
func (p *proc) kill() {
	p.exitExpected.Store(true)
	if !p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func (p *proc) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---------------------------------------------------------------- polling / metrics

// eventually polls cond every 50ms until it returns true or timeout expires.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, detail := cond()
		if ok {
			return
		}
		last = detail
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last: %s)", timeout, what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var httpc = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func httpGet(url string) (int, string, error) {
	resp, err := httpc.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

type metrics map[string]float64

func scrape(url string) (metrics, error) {
	code, body, err := httpGet(url)
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("GET %s: status %d", url, code)
	}
	m := metrics{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, nil
}

// sum returns the sum over all series of name whose label set contains every labels substring.
// A metric that is absent counts as 0 (upstream's label-less GaugeVecs appear only after first use).
func (m metrics) sum(name string, labels ...string) float64 {
	var s float64
	for k, v := range m {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(k, l) {
				ok = false
			}
		}
		if ok {
			s += v
		}
	}
	return s
}

// ---------------------------------------------------------------- far-end server

// farEnd is a loopback TCP server with a tiny line protocol:
//
//	"GET <n> <seed>\n" -> n bytes of deterministic ChaCha8 data, then close
//	"PUT <n>\n" + n bytes -> "<hex sha256>\n", then close
//	"STREAM <seed>\n" -> 32 KiB every 5 ms until the peer goes away
//	"HOLD\n" -> keep the connection open until the peer closes it
//	"ECHO\n" -> send back everything received until the peer closes it
type farEnd struct {
	ln     net.Listener
	addr   string
	active atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

// closeAll closes the listener and every accepted connection.
func (fe *farEnd) closeAll() {
	fe.ln.Close()
	fe.mu.Lock()
	defer fe.mu.Unlock()
	for c := range fe.conns {
		c.Close()
	}
}

func startFarEnd(t *testing.T) *farEnd {
	t.Helper()
	return startFarEndOn(t, "127.0.0.1")
}

// startFarEndOn starts a far end on host (a loopback address, or one inside a netns).
func startFarEndOn(t *testing.T, host string) *farEnd {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	fe := &farEnd{ln: ln, addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	fe.wg.Add(1)
	go func() {
		defer fe.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fe.active.Add(1)
			fe.wg.Add(1)
			fe.mu.Lock()
			fe.conns[c] = true
			fe.mu.Unlock()
			go func() {
				defer fe.wg.Done()
				defer fe.active.Add(-1)
				defer func() { fe.mu.Lock(); delete(fe.conns, c); fe.mu.Unlock() }()
				defer c.Close()
				fe.serve(c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return fe
}

func (fe *farEnd) serve(c net.Conn) {
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	switch f[0] {
	case "GET":
		n, _ := strconv.ParseInt(f[1], 10, 64)
		seed, _ := strconv.ParseUint(f[2], 10, 64)
		_, _ = io.CopyBuffer(c, io.LimitReader(dataStream(seed), n), make([]byte, 32<<10))
	case "PUT":
		n, _ := strconv.ParseInt(f[1], 10, 64)
		h := sha256.New()
		got, _ := io.CopyN(h, br, n)
		if got == n {
			fmt.Fprintf(c, "%s\n", hex.EncodeToString(h.Sum(nil)))
		}
	case "STREAM":
		seed, _ := strconv.ParseUint(f[1], 10, 64)
		r := dataStream(seed)
		buf := make([]byte, 32<<10)
		for {
			_, _ = io.ReadFull(r, buf)
			if _, err := c.Write(buf); err != nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	case "HOLD":
		_, _ = io.Copy(io.Discard, br)
	case "ECHO":
		_, _ = io.Copy(c, br)
	default:
		serveExtra(f, c, br) // lifecycle_test.go
	}
}

func dataStream(seed uint64) io.Reader {
	var s [32]byte
	copy(s[:], fmt.Sprintf("konn-interop-%016x", seed))
	return mrand.NewChaCha8(s)
}

func expectedSHA(n int64, seed uint64) string {
	h := sha256.New()
	_, _ = io.CopyN(h, dataStream(seed), n)
	return hex.EncodeToString(h.Sum(nil))
}

// ---------------------------------------------------------------- "hanging" dial target

// hangingAddr returns a loopback address whose listener never accepts and whose
// accept queue is full, so further TCP connects hang (SYNs are dropped).
func hangingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for i := 0; i < 32; i++ {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr // accept queue full: connects now hang
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatalf("could not fill the accept queue of %s", addr)
	return ""
}

// ---------------------------------------------------------------- environment

type agentProc struct {
	*proc
	id         string
	healthPort int
	healthHost string // default 127.0.0.1 (network_test.go runs agents in a netns)
}

func (a *agentProc) metrics() (metrics, error) {
	host := a.healthHost
	if host == "" {
		host = "127.0.0.1"
	}
	return scrape(fmt.Sprintf("http://%s/metrics", net.JoinHostPort(host, strconv.Itoa(a.healthPort))))
}

// env is one proxy-server instance (ours or upstream) plus its agents.
type env struct {
	t                                *testing.T
	impl                             string
	bins                             binaries
	dir, sock                        string
	agentPort, healthPort, adminPort int
	server                           *proc
	far                              *farEnd
	ctx                              context.Context
	nAgents                          int
	configPath                       string    // --config file (envOpts.config)
	notify                           *notifier // $NOTIFY_SOCKET listener (envOpts.notify)
	// Frontend (frontends_test.go): mode, and the TCP+mTLS frontend port (0 = UDS frontend).
	mode       string
	serverPort int
	// secondFrontendPort: the HTTP-CONNECT [[frontend]] of grpc_uds_and_http_connect_tcp_one_process.
	secondFrontendPort int
	// agentHost is the address agents dial (default 127.0.0.1).
	agentHost string
	// The server's command line, for restartServer (agent_test.go: HA).
	serverBin             string
	serverArgs, serverEnv []string
	nStarts               int
	// agents: every agent startAgent* started; checkAgents (TestAgentInterop) also fails the
	// scenario when one of them panics or exits unasked, and requires their
	// open_endpoint_connections to return to 0.
	agents      []*agentProc
	checkAgents bool
}

// envOpts changes how newEnvWith starts the server (lifecycle scenarios).
type envOpts struct {
	// config, if set, returns the TOML written to <dir>/server.toml before the start; the
	// server gets --config=<that file> and no --cluster-* flags (the file names the certs).
	config func(e *env) string
	// notify binds a unixgram socket and passes it as $NOTIFY_SOCKET.
	notify bool
	// extraArgs are appended to the server command line.
	extraArgs []string
	// mode is --mode (default grpc).
	mode string
	// tcpFrontend serves the frontend on a TCP port with mTLS (--server-cert/--server-key/
	// --server-ca-cert, no --uds-name) instead of the UDS.
	tcpFrontend bool
	// agentBind, if non-nil, is --agent-bind-address (default 127.0.0.1); agentHost is the
	// address agents then dial (default 127.0.0.1).
	agentBind *string
	agentHost string
	// clusterCert/clusterKey, if set, replace the agent-port certificate.
	clusterCert, clusterKey string
	// serverID / serverCount: --server-id (default interop-<impl>) and --server-count
	// (default 1).
	serverID    string
	serverCount int
}

func newEnv(t *testing.T, impl, serverBin string, bins binaries) *env {
	t.Helper()
	return newEnvWith(t, impl, serverBin, bins, envOpts{})
}

// scenarioDir is the one temporary directory helper of the harness: a fresh directory named
// prefix*, removed when the test passes and kept (and named in the log) when it fails.
func scenarioDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

func newEnvWith(t *testing.T, impl, serverBin string, bins binaries, opts envOpts) *env {
	t.Helper()
	dir := scenarioDir(t, "konn-")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, impl: impl, bins: bins, dir: dir, sock: filepath.Join(dir, "konn.sock"), ctx: ctx,
		mode: opts.mode, agentHost: opts.agentHost}
	if e.mode == "" {
		e.mode = "grpc"
	}
	if e.agentHost == "" {
		e.agentHost = "127.0.0.1"
	}
	agentBind := "127.0.0.1"
	if opts.agentBind != nil {
		agentBind = *opts.agentBind
	}
	cs := getCerts(t)
	var extraEnv []string
	if opts.notify {
		e.notify = newNotifier(t, filepath.Join(dir, "notify.sock"))
		extraEnv = append(extraEnv, "NOTIFY_SOCKET="+e.notify.path)
	}
	for attempt := 1; ; attempt++ {
		e.agentPort, e.healthPort, e.adminPort = freePort(t), freePort(t), freePort(t)
		clusterCert, clusterKey := cs.serverCert, cs.serverKey
		if opts.clusterCert != "" {
			clusterCert, clusterKey = opts.clusterCert, opts.clusterKey
		}
		certArgs := []string{
			"--cluster-cert=" + clusterCert,
			"--cluster-key=" + clusterKey,
			"--cluster-ca-cert=" + cs.ca,
		}
		if opts.config != nil {
			e.configPath = filepath.Join(dir, "server.toml")
			if err := os.WriteFile(e.configPath, []byte(opts.config(e)), 0o600); err != nil {
				t.Fatal(err)
			}
			certArgs = []string{"--config=" + e.configPath}
		}
		frontendArgs := []string{"--uds-name=" + e.sock, "--server-port=0"}
		if opts.tcpFrontend {
			e.sock = ""
			e.serverPort = freePort(t)
			frontendArgs = []string{"--uds-name=", fmt.Sprintf("--server-port=%d", e.serverPort),
				"--server-bind-address=127.0.0.1",
				"--server-cert=" + cs.serverCert, "--server-key=" + cs.serverKey, "--server-ca-cert=" + cs.ca}
		}
		args := append(append([]string{"--mode=" + e.mode}, frontendArgs...), certArgs...)
		serverID, serverCount := opts.serverID, opts.serverCount
		if serverID == "" {
			serverID = "interop-" + impl
		}
		if serverCount == 0 {
			serverCount = 1
		}
		args = append(args,
			fmt.Sprintf("--agent-port=%d", e.agentPort),
			fmt.Sprintf("--health-port=%d", e.healthPort),
			fmt.Sprintf("--admin-port=%d", e.adminPort),
			"--agent-bind-address="+agentBind,
			"--health-bind-address=127.0.0.1",
			"--admin-bind-address=127.0.0.1",
			"--server-id="+serverID,
			fmt.Sprintf("--server-count=%d", serverCount),
		)
		args = append(args, opts.extraArgs...)
		e.serverBin, e.serverArgs, e.serverEnv, e.nStarts = serverBin, args, extraEnv, attempt
		e.server = startProcEnv(t, fmt.Sprintf("server-%s-%d", impl, attempt), dir, extraEnv, serverBin, args...)
		watchServer(t, e.server)
		err := e.waitServerUp(20 * time.Second)
		if err == nil {
			break
		}
		e.server.exitExpected.Store(true) // a failed start is reported below, not by watchServer
		if attempt < 3 && e.server.exited() && strings.Contains(e.server.log(), "address already in use") {
			t.Logf("port clash on attempt %d, retrying with new ports", attempt)
			continue
		}
		t.Fatalf("%s server did not come up: %v", impl, err)
	}
	e.far = startFarEnd(t)
	return e
}

func (e *env) waitServerUp(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if e.server.exited() {
			return fmt.Errorf("server exited: %v", e.server.exitErr)
		}
		code, _, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/healthz", e.healthPort))
		if err == nil && code == 200 && e.serverPort != 0 {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", e.serverPort), time.Second)
			if err == nil {
				c.Close()
				return nil
			}
			last = fmt.Errorf("frontend port %d: %v", e.serverPort, err)
		} else if err == nil && code == 200 {
			if _, err := os.Stat(e.sock); err == nil {
				return nil
			}
			last = fmt.Errorf("UDS %s not present yet", e.sock)
		} else {
			last = fmt.Errorf("healthz: code=%d err=%v", code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("timeout: %v", last)
}

func (e *env) serverMetrics() (metrics, error) {
	return scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", e.healthPort))
}

// startAgent starts an agent binary (default: e.bins.agent, the upstream v0.36.0 agent in
// TestInterop, ours in TestAgentInterop) against this server's agent port.
func (e *env) startAgent(id, bin string) *agentProc {
	e.t.Helper()
	return e.startAgentArgs(id, bin, e.agentPort)
}

// startAgentArgs starts an agent binary (default e.bins.agent) with the harness certificates
// against e.agentHost:port, plus extra flags.
func (e *env) startAgentArgs(id, bin string, port int, extra ...string) *agentProc {
	e.t.Helper()
	if bin == "" {
		bin = e.bins.agent
	}
	cs := getCerts(e.t)
	e.nAgents++
	hp, ap := freePort(e.t), freePort(e.t)
	args := append([]string{
		"--ca-cert=" + cs.ca,
		"--agent-cert=" + cs.agentCert,
		"--agent-key=" + cs.agentKey,
		"--proxy-server-host=" + e.agentHost,
		fmt.Sprintf("--proxy-server-port=%d", port),
		"--agent-id=" + id,
		"--agent-identifiers=host=localhost&ipv4=127.0.0.1",
		"--health-server-host=127.0.0.1",
		fmt.Sprintf("--health-server-port=%d", hp),
		"--admin-bind-address=127.0.0.1",
		fmt.Sprintf("--admin-server-port=%d", ap),
	}, extra...)
	p := startProc(e.t, fmt.Sprintf("agent%d-%s", e.nAgents, id), e.dir, bin, args...)
	if e.checkAgents {
		watchServer(e.t, p)
	}
	a := &agentProc{proc: p, id: id, healthPort: hp}
	e.agents = append(e.agents, a)
	return a
}

// waitAgentConnected waits until the agent reports one open server connection.
func (e *env) waitAgentConnected(a *agentProc) {
	e.t.Helper()
	eventually(e.t, 20*time.Second, "agent "+a.id+" connected", func() (bool, string) {
		if a.exited() {
			e.t.Fatalf("agent %s exited: %v\n%s", a.id, a.exitErr, a.tail(20))
		}
		m, err := a.metrics()
		if err != nil {
			return false, err.Error()
		}
		v := m.sum(metricAgentServer)
		return v == 1, fmt.Sprintf("%s=%v", metricAgentServer, v)
	})
}

// waitReady waits for /readyz = 200 "ok".
func (e *env) waitReady() {
	e.t.Helper()
	e.waitReadyz(200, 20*time.Second)
}

func (e *env) waitReadyz(want int, timeout time.Duration) {
	e.t.Helper()
	eventually(e.t, timeout, fmt.Sprintf("server /readyz == %d", want), func() (bool, string) {
		code, body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", e.healthPort))
		if err != nil {
			return false, err.Error()
		}
		if want == 200 {
			return code == 200 && strings.TrimSpace(body) == "ok", fmt.Sprintf("%d %q", code, body)
		}
		return code == want, fmt.Sprintf("%d %q", code, body)
	})
}

// waitServerAgentStreams waits until the server counts n agent Connect streams.
func (e *env) waitServerAgentStreams(n int) {
	e.t.Helper()
	eventually(e.t, 20*time.Second, fmt.Sprintf("server grpc_connections{Connect} == %d", n), func() (bool, string) {
		m, err := e.serverMetrics()
		if err != nil {
			return false, err.Error()
		}
		v := m.sum(metricGRPCConns, `service_method="Connect"`)
		return v == float64(n), fmt.Sprintf("%v", v)
	})
}

// withAgent starts one agent and waits until the server is ready.
func (e *env) withAgent(id, bin string) *agentProc {
	e.t.Helper()
	a := e.startAgent(id, bin)
	e.waitAgentConnected(a)
	e.waitReady()
	return a
}

// assertQuiescent checks that both server gauges and the far end return to 0.
func (e *env) assertQuiescent(t *testing.T) {
	t.Helper()
	e.assertServerAlive(t)
	if !e.server.exited() { // drain scenarios end with the server gone (and expected that)
		e.assertServerQuiescent(t)
	}
	eventually(t, 20*time.Second, "far-end connections closed", func() (bool, string) {
		n := e.far.active.Load()
		return n == 0, fmt.Sprintf("%d open", n)
	})
}

// quiescentOrKnownDiff is assertQuiescent for upstream's known leak: a gauge left above zero
// after 10 s is logged as a known upstream difference, not failed.
func (e *env) quiescentOrKnownDiff(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	leaked := false
	for {
		m, err := e.serverMetrics()
		if err == nil {
			p, es := m.sum(metricPending), m.sum(metricEstablished)
			if p == 0 && es == 0 {
				break
			}
			if time.Now().After(deadline) {
				knownDiff(t, id, "upstream left pending=%v established=%v after the scenario", p, es)
				leaked = true
				break
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("metrics: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if leaked {
		// The leaked tunnel may hold its endpoint connection open at the agent as well.
		if n := e.far.active.Load(); n != 0 {
			knownDiff(t, id, "with it, %d far-end connection(s) stay open", n)
		}
		return
	}
	eventually(t, 20*time.Second, "far-end connections closed", func() (bool, string) {
		n := e.far.active.Load()
		return n == 0, fmt.Sprintf("%d open", n)
	})
}

// assertServerAlive fails when the server panicked or exited without the scenario stopping it.
func (e *env) assertServerAlive(t *testing.T) {
	t.Helper()
	if msg := e.server.panicked(); msg != "" {
		t.Fatalf("%s server PANICKED:\n%s", e.impl, msg)
	}
	if e.server.exited() && !e.server.exitExpected.Load() {
		t.Fatalf("%s server exited during the scenario: %v\n%s", e.impl, e.server.exitErr, e.server.tail(30))
	}
}

func (e *env) assertServerQuiescent(t *testing.T) {
	t.Helper()
	eventually(t, 20*time.Second, "pending_backend_dials and established_connections == 0", func() (bool, string) {
		m, err := e.serverMetrics()
		if err != nil {
			return false, err.Error()
		}
		p, es := m.sum(metricPending), m.sum(metricEstablished)
		return p == 0 && es == 0, fmt.Sprintf("pending=%v established=%v", p, es)
	})
}

// ---------------------------------------------------------------- konnectivity-client (as kube-apiserver uses it)

func (e *env) grpcOpts() []grpc.DialOption {
	sock := e.sock
	return []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent("konnectivity-interop-driver"),
	}
}

// dial creates a single-use tunnel and dials addr through it.
func (e *env) dial(ctx context.Context, addr string) (net.Conn, client.Tunnel, error) {
	tunnel, err := client.CreateSingleUseGrpcTunnelWithContext(ctx, e.ctx, e.sock, e.grpcOpts()...)
	if err != nil {
		return nil, nil, fmt.Errorf("create tunnel: %w", err)
	}
	conn, err := tunnel.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, tunnel, err
	}
	return conn, tunnel, nil
}

type dialer func(ctx context.Context, addr string) (net.Conn, error)

func (e *env) singleUse() dialer {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		c, _, err := e.dial(ctx, addr)
		return c, err
	}
}

// fetch downloads n bytes with seed through a new tunnel and checks the sha256.
func fetch(ctx context.Context, d dialer, addr string, n int64, seed uint64) error {
	conn, err := d(ctx, addr)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "GET %d %d\n", n, seed); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	h := sha256.New()
	got, err := io.Copy(h, conn)
	if err != nil {
		return fmt.Errorf("read after %d bytes: %w", got, err)
	}
	if got != n {
		return fmt.Errorf("got %d bytes, want %d", got, n)
	}
	if sum, want := hex.EncodeToString(h.Sum(nil)), expectedSHA(n, seed); sum != want {
		return fmt.Errorf("sha256 mismatch: got %s want %s", sum, want)
	}
	return nil
}

// upload sends n bytes with seed through a new tunnel; the far end returns the sha256.
func upload(ctx context.Context, d dialer, addr string, n int64, seed uint64) error {
	conn, err := d(ctx, addr)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "PUT %d\n", n); err != nil {
		return fmt.Errorf("write header: %w", err)
	}
	// 32 KiB writes, like TLS records from kube-apiserver; a single huge Write would
	// become one DATA packet above the 4 MiB gRPC receive limit.
	if _, err := io.CopyBuffer(writerOnly{conn}, io.LimitReader(dataStream(seed), n), make([]byte, 32<<10)); err != nil {
		return fmt.Errorf("write body: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read checksum: %w", err)
	}
	if got, want := strings.TrimSpace(line), expectedSHA(n, seed); got != want {
		return fmt.Errorf("far end sha256 %s, want %s", got, want)
	}
	return nil
}

type writerOnly struct{ io.Writer }

// httpGetVia issues GET http://addr/path through d and returns status and body.
func httpGetVia(ctx context.Context, d dialer, addr, path string) (int, string, error) {
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, a string) (net.Conn, error) { return d(ctx, a) },
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// startTestServer starts the upstream http-test-server on a free port.
func (e *env) startTestServer() string {
	e.t.Helper()
	port := freePort(e.t)
	p := startProc(e.t, "http-test-server", e.dir, e.bins.testServer, fmt.Sprintf("--server-port=%d", port))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	eventually(e.t, 10*time.Second, "http-test-server listening", func() (bool, string) {
		if p.exited() {
			e.t.Fatalf("http-test-server exited: %v\n%s", p.exitErr, p.tail(10))
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	return addr
}

// closedPort returns a loopback address with nothing listening.
func closedPort(t *testing.T) string {
	return fmt.Sprintf("127.0.0.1:%d", freePort(t))
}
