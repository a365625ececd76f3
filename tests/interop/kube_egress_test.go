package interop

// The whole path through Kubernetes: a real kube-apiserver configured with an EgressSelectorConfiguration
// (cluster egress to the proxy-server's UDS, GRPC or HTTPConnect) proxies a
// `pods/<name>:<port>/proxy/...` request through the proxy-server and the upstream agent
// to a test HTTP server. The API server refuses to proxy to loopback addresses
// (IsProxyableIP), so the test host lives in a network namespace this test creates, reached
// over a private veth pair (10.214.N.x/30) that exists only inside this machine.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const egressBody = "egress selector reached the test host"

func scEgressGRPC(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared) {
	scEgress(t, impl, bin, bins, "grpc", "GRPC", 0)
}

func scEgressHTTPConnect(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared) {
	scEgress(t, impl, bin, bins, "http-connect", "HTTPConnect", 1)
}

// withOurAgent is bins with our agent (KONNECTIVITY_AGENT_BIN) in place of upstream's.
func withOurAgent(t *testing.T, bins binaries) binaries {
	t.Helper()
	agent := os.Getenv("KONNECTIVITY_AGENT_BIN")
	if agent == "" {
		skipOrFail(t, "KONNECTIVITY_AGENT_BIN is not set: not testing our agent behind kube-apiserver")
	}
	bins.agent = agent
	return bins
}

// The same egress scenarios with our agent in place of upstream's, behind both servers.
func scEgressGRPCOurAgent(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared) {
	scEgress(t, impl, bin, withOurAgent(t, bins), "grpc", "GRPC", 4)
}

func scEgressHTTPConnectOurAgent(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared) {
	scEgress(t, impl, bin, withOurAgent(t, bins), "http-connect", "HTTPConnect", 5)
}

// netnsHost is a network namespace with a veth pair to the host.
type netnsHost struct{ ns, hostIf, hostAddr, nsAddr string }

func newNetnsHost(t *testing.T, idx int) *netnsHost {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		skipOrFail(t, "egress: the ip command is not available (iproute2): %v", err)
	}
	pid := os.Getpid() % 100000
	sub := 1 + pid%250
	h := &netnsHost{
		ns:       fmt.Sprintf("konneg%d-%d", pid, idx),
		hostIf:   fmt.Sprintf("keg%d%dh", pid, idx),
		hostAddr: fmt.Sprintf("10.214.%d.%d", sub, idx*4+1),
		nsAddr:   fmt.Sprintf("10.214.%d.%d", sub, idx*4+2),
	}
	nsIf := fmt.Sprintf("keg%d%dn", pid, idx)
	if err := ipCmd("netns", "add", h.ns); err != nil {
		skipOrFail(t, "egress: cannot create a network namespace here (needs root/CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() {
		_ = ipCmd("link", "del", h.hostIf)
		if err := ipCmd("netns", "del", h.ns); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	for _, s := range [][]string{
		{"link", "add", h.hostIf, "type", "veth", "peer", "name", nsIf},
		{"link", "set", nsIf, "netns", h.ns},
		{"addr", "add", h.hostAddr + "/30", "dev", h.hostIf},
		{"link", "set", h.hostIf, "up"},
		{"-n", h.ns, "addr", "add", h.nsAddr + "/30", "dev", nsIf},
		{"-n", h.ns, "link", "set", nsIf, "up"},
		{"-n", h.ns, "link", "set", "lo", "up"},
	} {
		if err := ipCmd(s...); err != nil {
			t.Fatalf("netns setup: %v", err)
		}
	}
	return h
}

// listen opens a TCP listener inside the namespace: an OS thread joins the namespace just
// long enough to create the socket (the socket stays in that namespace), then returns.
func (h *netnsHost) listen(t *testing.T) net.Listener {
	t.Helper()
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked if restoring fails: the thread is then discarded
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + h.ns)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer target.Close()
		if err := setns(target.Fd()); err != nil {
			ch <- result{nil, fmt.Errorf("setns %s: %w", h.ns, err)}
			return
		}
		ln, lerr := net.Listen("tcp", net.JoinHostPort(h.nsAddr, "0"))
		if err := setns(orig.Fd()); err != nil {
			ch <- result{nil, fmt.Errorf("setns back: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{ln, lerr}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen in netns %s: %v", h.ns, r.err)
	}
	t.Cleanup(func() { r.ln.Close() })
	return r.ln
}

func setns(fd uintptr) error { return unix.Setns(int(fd), unix.CLONE_NEWNET) }

func scEgress(t *testing.T, impl, bin string, bins binaries, mode, protocol string, idx int) {
	if impl == "upstream" {
		idx += 2
	}
	h := newNetnsHost(t, idx)
	ln := h.listen(t)
	port := ln.Addr().(*net.TCPAddr).Port
	hits := make(chan string, 16)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits <- r.URL.Path
		fmt.Fprint(w, egressBody)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	// The proxy-server (UDS frontend in the egress mode) and an upstream agent.
	e := startKubeServer(t, impl, bin, bins, kubeServerOpts{mode: mode, serverID: "egress-" + impl})
	a := e.startAgentOpts("egress-agent", e.agentPort, mtlsAgentArgs(t)...)
	e.waitAgentConnected(a)
	e.waitReady()

	// Direct dial from the host to the namespace must work (the agent's path).
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(h.nsAddr, fmt.Sprint(port)), 5*time.Second); err != nil {
		t.Fatalf("host cannot reach the test host in the netns: %v", err)
	} else {
		c.Close()
	}

	cfg := filepath.Join(e.dir, "egress-selector.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: %s
    transport:
      uds:
        udsName: %s
`, protocol, e.sock)), 0o600); err != nil {
		t.Fatal(err)
	}
	k := startKubeWith(t, "--egress-selector-config-file="+cfg)

	// A Pod whose status names the test host (no kubelet here: the status is written by the
	// test). A selector-less Service with hand-made Endpoints/EndpointSlice answered "no
	// endpoints available" on v1.37.2, so the pods/<name>:<port>/proxy path is used.
	k.must(t, "POST", "/api/v1/namespaces/default/pods", obj("Pod", "v1", map[string]any{"name": "egress-test"},
		map[string]any{"spec": map[string]any{"containers": []map[string]any{{"name": "c", "image": "none"}}}}), nil)
	req, _ := http.NewRequest("PATCH", k.url+"/api/v1/namespaces/default/pods/egress-test/status",
		strings.NewReader(fmt.Sprintf(`{"status":{"podIP":%q,"podIPs":[{"ip":%q}]}}`, h.nsAddr, h.nsAddr)))
	req.Header.Set("Authorization", "Bearer "+k.admin)
	req.Header.Set("Content-Type", "application/merge-patch+json")
	if resp, err := k.hc.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("patching the pod status: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}

	before, _ := e.serverMetrics()
	dialsBefore := before.sum("konnectivity_network_proxy_server_stream_packets_total", `segment="to_agent"`, `packet_type="DIAL_REQ"`)
	path := fmt.Sprintf("/api/v1/namespaces/default/pods/egress-test:%d/proxy/hello", port)
	var code int
	var body string
	eventually(t, 30*time.Second, "GET "+path+" through the egress selector", func() (bool, string) {
		req, _ := http.NewRequest("GET", k.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+k.admin)
		resp, err := k.hc.Do(req)
		if err != nil {
			return false, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		code, body = resp.StatusCode, string(b)
		return code == 200, fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
	})
	if body != egressBody {
		t.Fatalf("proxied body %q, want %q", body, egressBody)
	}
	select {
	case p := <-hits:
		if p != "/hello" {
			t.Errorf("test host saw path %q, want /hello", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the test host saw no request")
	}
	after, _ := e.serverMetrics()
	dials := after.sum("konnectivity_network_proxy_server_stream_packets_total", `segment="to_agent"`, `packet_type="DIAL_REQ"`) - dialsBefore
	m, _ := a.metrics()
	t.Logf("EGRESS[%s/%s]: kube-apiserver %s -> %s UDS -> agent -> %s:%d: 200 %q; DIAL_REQ to agent +%v; agent endpoint dials %v",
		impl, protocol, path, impl, h.nsAddr, port, body, dials, m.sum("konnectivity_network_proxy_agent_dial_duration_seconds_count"))
	if dials < 1 {
		t.Errorf("the proxied request did not go through the proxy-server (DIAL_REQ to agent +%v)", dials)
	}
	if strings.Contains(k.tail("APISERVER_LOG"), "egress") {
		t.Logf("apiserver log mentions egress: %s", k.tail("APISERVER_LOG"))
	}
	// The API server keeps its proxy connection to the pod alive (one established tunnel);
	// once it is gone the tunnel must be torn down.
	if m, _ := e.serverMetrics(); m.sum(metricEstablished) > 0 {
		t.Logf("established tunnels while kube-apiserver runs: %v (its idle keep-alive connection)", m.sum(metricEstablished))
	}
	k.stop(t)
	if impl == "upstream" {
		deadline := time.Now().Add(10 * time.Second)
		for {
			m, err := e.serverMetrics()
			if err == nil && m.sum(metricEstablished) == 0 && m.sum(metricPending) == 0 {
				return
			}
			if time.Now().After(deadline) {
				knownDiff(t, "egress-frontend-killed", "upstream (%s) still counts %v established tunnel(s) 10 s after kube-apiserver exited",
					protocol, m.sum(metricEstablished))
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	e.assertServerQuiescent(t)
}

// tail returns the last lines of one of the fixture's logs that mention errors.
func (k *kubeFixture) tail(key string) string {
	b, _ := os.ReadFile(k.env[key])
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var out []string
	for _, l := range lines {
		if strings.Contains(l, "egress") && strings.HasPrefix(l, "E") {
			out = append(out, l)
		}
	}
	if len(out) > 5 {
		out = out[len(out)-5:]
	}
	return strings.Join(out, "\n")
}
