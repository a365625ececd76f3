//go:build upstreamsuite_external

// This file is ours, not upstream's. build.sh --external compiles it into upstream's
// package sigs.k8s.io/apiserver-network-proxy/tests: a throwaway copy of that package's
// files from the Go module cache, built with -tags upstreamsuite_external. It replaces the
// suite's in-process Go proxy server by an external server binary, given with
// -server-path, started once per ProxyServerRunner.Start the way ExternalAgentRunner
// starts an agent: a fresh process with the same options the in-process server
// would get, passed as --name=value flags.

package tests

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/wait"

	serveropts "sigs.k8s.io/apiserver-network-proxy/cmd/server/app/options"
	metricstest "sigs.k8s.io/apiserver-network-proxy/pkg/testing/metrics"
	"sigs.k8s.io/apiserver-network-proxy/tests/framework"
)

var (
	serverPath = flag.String("server-path", "", "Path to the proxy-server binary to test against (upstreamsuite_external builds only).")
	// How long Stop waits after SIGTERM before SIGKILL. The options leave
	// --graceful-shutdown-timeout at its default 0 (immediate shutdown), as in-process.
	serverStopGrace = flag.Duration("server-stop-grace", 10*time.Second, "Time between SIGTERM and SIGKILL when stopping an external server.")
)

// Every HTTP request this file makes to a server, and the suite's own scrapes of its
// Metrics() endpoint (promtest.ScrapeAndCompare: http.Get), use connections that are not
// kept alive. The suite checks for leaked goroutines (goleak.IgnoreCurrent ... VerifyNone)
// around such scrapes; an idle keep-alive connection opened in between would be reported
// (its persistConn read and write loops). With the in-process server those scrapes read
// the process's own registry and open no connection. Metrics() therefore hands the suite
// an endpoint of the scheme noReuseScheme, registered on http.DefaultTransport, which
// sends the request as plain http through noReuseTransport.
const noReuseScheme = "http-noreuse"

var (
	noReuseTransport = &http.Transport{DisableKeepAlives: true}
	noReuseClient    = &http.Client{Transport: noReuseTransport, Timeout: 30 * time.Second}
)

type noReuseRoundTripper struct{}

func (noReuseRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	u := *req.URL
	u.Scheme = "http"
	r.URL = &u
	return noReuseTransport.RoundTrip(r)
}

// The count that the in-process runner reads from the BackendManagers (sum of
// NumBackends: distinct agent IDs per strategy) is exported by the server as this gauge,
// one sample per proxy strategy.
const readyBackendsMetric = "konnectivity_network_proxy_server_ready_backends"

func init() {
	// Package variables (Framework, in main_test.go) are initialised before any init().
	Framework.ProxyServerRunner = &externalProxyServerRunner{}
	http.DefaultTransport.(*http.Transport).RegisterProtocol(noReuseScheme, noReuseRoundTripper{})
}

type externalProxyServerRunner struct{}

// externalServerOptions builds the options exactly as framework.serverOptions (unexported)
// does for the in-process server: UDS frontend in CertsDir, the suite's test certs,
// loopback listeners on free ports.
func externalServerOptions(opts framework.ProxyServerOpts) (*serveropts.ProxyRunOptions, error) {
	o := serveropts.NewProxyRunOptions()
	o.ServerCount = opts.ServerCount
	o.Mode = opts.Mode
	o.UdsName = filepath.Join(framework.CertsDir, fmt.Sprintf("server-%s.sock", uuid.New().String()))
	o.ServerPort = 0 // Required for UDS
	o.ClusterCert = filepath.Join(framework.CertsDir, framework.TestServerCertFile)
	o.ClusterKey = filepath.Join(framework.CertsDir, framework.TestServerKeyFile)
	o.ClusterCaCert = filepath.Join(framework.CertsDir, framework.TestCAFile)
	const localhost = "127.0.0.1"
	o.AgentBindAddress = localhost
	o.HealthBindAddress = localhost
	o.AdminBindAddress = localhost
	ports, err := framework.FreePorts(3)
	if err != nil {
		return nil, err
	}
	if opts.AgentPort != 0 {
		o.AgentPort = opts.AgentPort
	} else {
		o.AgentPort = ports[0]
	}
	o.HealthPort = ports[1]
	o.AdminPort = ports[2]
	return o, nil
}

// serverArgs passes every flag as --name=value, like ExternalAgentRunner does for the
// agent, except that list flags are written comma-separated: pflag prints them as
// "[a,b]" ("[]" when empty), which does not parse back to the same value.
func serverArgs(o *serveropts.ProxyRunOptions) []string {
	var args []string
	o.Flags().VisitAll(func(f *pflag.Flag) {
		v := f.Value.String()
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			v = strings.Join(sv.GetSlice(), ",")
		}
		args = append(args, fmt.Sprintf("--%s=%s", f.Name, v))
	})
	return args
}

func (*externalProxyServerRunner) Start(t testing.TB, opts framework.ProxyServerOpts) (framework.ProxyServer, error) {
	if *serverPath == "" {
		return nil, errors.New("this test binary was built for an external server: -server-path is required")
	}
	o, err := externalServerOptions(opts)
	if err != nil {
		return nil, fmt.Errorf("error building server options: %w", err)
	}
	args := serverArgs(o)
	t.Logf("starting external proxy server %s %s", *serverPath, strings.Join(args, " "))

	cmd := exec.Command(*serverPath, args...)
	cmd.Stdout = os.Stdout // Forward stdout & stderr, as ExternalAgentRunner does.
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ps := &externalProxyServer{
		t:          t,
		cmd:        cmd,
		exited:     make(chan struct{}),
		healthAddr: net.JoinHostPort(o.HealthBindAddress, strconv.Itoa(o.HealthPort)),
		agentAddr:  net.JoinHostPort(o.AgentBindAddress, strconv.Itoa(o.AgentPort)),
		frontAddr:  o.UdsName,
	}
	ps.metrics = &metricstest.Tester{Endpoint: fmt.Sprintf("%s://%s/metrics", noReuseScheme, ps.healthAddr)}
	go func() {
		ps.waitErr = cmd.Wait()
		close(ps.exited)
	}()
	t.Cleanup(ps.Stop)

	// As the in-process runner: poll /healthz every 100ms for up to ForeverTestTimeout,
	// but give up at once if the process exits.
	err = wait.PollImmediate(100*time.Millisecond, framework.ForeverTestTimeout, func() (bool, error) {
		select {
		case <-ps.exited:
			return false, fmt.Errorf("external proxy server exited before it was live: %v", ps.waitErr)
		default:
		}
		resp, err := noReuseClient.Get(fmt.Sprintf("http://%s/healthz", ps.healthAddr))
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		ps.Stop()
		return nil, fmt.Errorf("server never came up: %v", err)
	}
	return ps, nil
}

type externalProxyServer struct {
	t       testing.TB
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error

	stopOnce sync.Once

	healthAddr, agentAddr, frontAddr string
	metrics                          *metricstest.Tester
}

// Stop is SIGTERM (the server's own shutdown path), then SIGKILL after
// -server-stop-grace. It returns once the process has exited, so that its ports are
// free again (TestServerRestartAgentReconnect restarts on the same agent port).
func (ps *externalProxyServer) Stop() {
	ps.stopOnce.Do(func() {
		select {
		case <-ps.exited:
			ps.t.Logf("external proxy server (pid %d) had already exited: %v", ps.cmd.Process.Pid, ps.waitErr)
			return
		default:
		}
		_ = ps.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-ps.exited:
		case <-time.After(*serverStopGrace):
			ps.t.Logf("external proxy server (pid %d) still running %v after SIGTERM: SIGKILL", ps.cmd.Process.Pid, *serverStopGrace)
			_ = ps.cmd.Process.Kill()
			<-ps.exited
		}
	})
}

func (ps *externalProxyServer) AgentAddr() string { return ps.agentAddr }
func (ps *externalProxyServer) FrontAddr() string { return ps.frontAddr }

func (ps *externalProxyServer) Ready() bool {
	resp, err := noReuseClient.Get(fmt.Sprintf("http://%s/readyz", ps.healthAddr))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (ps *externalProxyServer) Metrics() metricstest.ServerTester { return ps.metrics }

// ConnectedBackends sums the ready_backends gauge over its proxy_strategy samples.
// A missing metric is an error (which aborts waitForConnectedAgentCount), as a
// missing agent gauge is for ExternalAgentRunner.
func (ps *externalProxyServer) ConnectedBackends() (int, error) {
	url := fmt.Sprintf("http://%s/metrics", ps.healthAddr)
	resp, err := noReuseClient.Get(url)
	if err != nil {
		return 0, fmt.Errorf("failed to scrape metrics from %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("unexpected %q status scraping metrics from %s", resp.Status, url)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("failed to parse metrics: %w", err)
	}
	mf, ok := mfs[readyBackendsMetric]
	if !ok || len(mf.GetMetric()) == 0 {
		return 0, fmt.Errorf("missing %s metric", readyBackendsMetric)
	}
	n := 0
	for _, m := range mf.GetMetric() {
		n += int(m.GetGauge().GetValue())
	}
	return n, nil
}
