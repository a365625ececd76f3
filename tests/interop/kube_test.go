package interop

// The Kubernetes-facing features against a REAL kube-apiserver + etcd (tests/kube/start.sh): agent token
// authentication (TokenReview) with upstream's messages, the TokenReview cache (ours only),
// the lease controller, two servers behind haproxy with a lease-counting upstream agent, and
// (metrics_test.go) the HELP/TYPE parity of every konnectivity_* family plus promtool.
//
// Layout: TestKube/<scenario>/{ours,upstream} (the two run in parallel), then
// TestKube/compare_<what> for the cross-implementation comparisons.
//
// Identities: every server gets its own ServiceAccount in namespace "konn-servers", bound to
// exactly the ClusterRole/Role start.sh creates for upstream's RBAC (create tokenreviews; leases
// get/create/update/list/delete in kube-system). The API server's audit log then tells which
// server made which TokenReview (user.username), so scenarios can count reviews per server.

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	agentpb "sigs.k8s.io/apiserver-network-proxy/proto/agent"
)

const (
	konnAudience     = "system:konnectivity-server"
	agentNamespace   = "kube-system"
	agentSA          = "konnectivity-agent"
	serverSANS       = "konn-servers"
	authErrPrefix    = "Failed to validate authentication token, err:"
	metricAgentKnown = "konnectivity_network_proxy_agent_known_server_count"
)

// ---------------------------------------------------------------- fixture

type kubeFixture struct {
	dir      string
	env      map[string]string
	url      string
	caPEM    []byte
	admin    string
	hc       *http.Client
	signKey  *rsa.PrivateKey
	issuer   string
	mu       sync.Mutex
	nameSeq  int
	saUIDs   map[string]string
	leaseSeq int
	stopSh   string
}

// stop stops etcd and kube-apiserver now (stop.sh is idempotent; t.Cleanup calls it again).
func (k *kubeFixture) stop(t *testing.T) {
	t.Helper()
	if o, err := exec.Command(k.stopSh, k.dir).CombinedOutput(); err != nil {
		t.Errorf("stop.sh: %v\n%s", err, o)
	}
}

func kubeBinDir(t *testing.T) string {
	t.Helper()
	d := os.Getenv("KUBE_BIN_DIR")
	if d == "" {
		skipOrFail(t, "KUBE_BIN_DIR is not set: run tests/interop/run.sh (it runs tests/kube/build.sh and sets it)")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if st, err := os.Stat(filepath.Join(d, b)); err != nil || st.Mode()&0o111 == 0 {
			skipOrFail(t, "KUBE_BIN_DIR=%s lacks an executable %s: %v", d, b, err)
		}
	}
	return d
}

// startKube starts etcd + kube-apiserver with tests/kube/start.sh and stops them in t.Cleanup.
func startKube(t *testing.T) *kubeFixture {
	t.Helper()
	k := startKubeWith(t, "")
	k.setup(t)
	return k
}

// startKubeWith starts a fixture with extra kube-apiserver flags (KUBE_APISERVER_EXTRA_ARGS).
func startKubeWith(t *testing.T, extraArgs string) *kubeFixture {
	t.Helper()
	binDir := kubeBinDir(t)
	dir := scenarioDir(t, "konn-kube-")
	startSh, _ := filepath.Abs(filepath.Join("..", "kube", "start.sh"))
	stopSh, _ := filepath.Abs(filepath.Join("..", "kube", "stop.sh"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, startSh, dir)
	cmd.Env = append(os.Environ(), "KUBE_BIN_DIR="+binDir, fmt.Sprintf("KUBE_WATCH_PID=%d", os.Getpid()),
		"KUBE_APISERVER_EXTRA_ARGS="+extraArgs)
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	t.Cleanup(func() {
		// Runs before scenarioDir's cleanup, which removes (or keeps) the directory.
		if o, err := exec.Command(stopSh, dir).CombinedOutput(); err != nil {
			t.Errorf("stop.sh: %v\n%s", err, o)
		}
	})
	if err != nil {
		t.Fatalf("tests/kube/start.sh %s: %v\n%s", dir, err, out)
	}
	t.Logf("kube fixture up in %.1fs (%s)", time.Since(t0).Seconds(), strings.TrimSpace(string(out)))
	k := &kubeFixture{dir: dir, env: map[string]string{}, saUIDs: map[string]string{}, stopSh: stopSh}
	b, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.IndexByte(l, '='); i > 0 {
			k.env[l[:i]] = l[i+1:]
		}
	}
	k.url, k.admin, k.issuer = k.env["APISERVER_URL"], k.env["ADMIN_TOKEN"], k.env["SA_ISSUER"]
	if k.caPEM, err = os.ReadFile(k.env["CA_CERT"]); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.caPEM)
	k.hc = &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	kb, err := os.ReadFile(k.env["SA_SIGNING_KEY"])
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(kb)
	if blk == nil {
		t.Fatalf("no PEM in %s", k.env["SA_SIGNING_KEY"])
	}
	key, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatalf("SA signing key: %v", err)
	}
	k.signKey = key.(*rsa.PrivateKey)
	return k
}

// do calls the API as the cluster admin; out (if non-nil) receives the JSON response.
func (k *kubeFixture) do(method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, k.url+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+k.admin)
	req.Header.Set("Content-Type", "application/json")
	resp, err := k.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decoding: %v", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

func (k *kubeFixture) must(t *testing.T, method, path string, body, out any) {
	t.Helper()
	if _, err := k.do(method, path, body, out); err != nil {
		t.Fatal(err)
	}
}

func obj(kind, apiVersion string, meta map[string]any, rest map[string]any) map[string]any {
	o := map[string]any{"kind": kind, "apiVersion": apiVersion, "metadata": meta}
	for k, v := range rest {
		o[k] = v
	}
	return o
}

func (k *kubeFixture) setup(t *testing.T) {
	t.Helper()
	k.must(t, "POST", "/api/v1/namespaces", obj("Namespace", "v1", map[string]any{"name": serverSANS}, nil), nil)
	for _, sa := range [][2]string{{agentNamespace, agentSA}, {"default", agentSA}, {agentNamespace, "other-agent"}} {
		k.createSA(t, sa[0], sa[1])
	}
	group := []map[string]any{{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:serviceaccounts:" + serverSANS}}
	// The roles start.sh made for system:konnectivity-server (upstream's documented RBAC).
	k.must(t, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
		obj("ClusterRoleBinding", "rbac.authorization.k8s.io/v1", map[string]any{"name": "konn-test-servers"}, map[string]any{
			"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "konnectivity-server:auth-delegator"},
			"subjects": group}), nil)
	k.must(t, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings",
		obj("RoleBinding", "rbac.authorization.k8s.io/v1", map[string]any{"name": "konn-test-servers", "namespace": "kube-system"}, map[string]any{
			"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "konnectivity-server:leases"},
			"subjects": group}), nil)
	// The agent's lease counter (upstream's agent RBAC: get/list/watch leases).
	k.must(t, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles",
		obj("Role", "rbac.authorization.k8s.io/v1", map[string]any{"name": "konn-test-agent-leases", "namespace": "kube-system"}, map[string]any{
			"rules": []map[string]any{{"apiGroups": []string{"coordination.k8s.io"}, "resources": []string{"leases"}, "verbs": []string{"get", "list", "watch"}}}}), nil)
	k.must(t, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings",
		obj("RoleBinding", "rbac.authorization.k8s.io/v1", map[string]any{"name": "konn-test-agent-leases", "namespace": "kube-system"}, map[string]any{
			"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "konn-test-agent-leases"},
			"subjects": []map[string]any{{"kind": "ServiceAccount", "name": agentSA, "namespace": agentNamespace}}}), nil)
}

func (k *kubeFixture) createSA(t *testing.T, ns, name string) string {
	t.Helper()
	var out struct {
		Metadata struct{ UID string } `json:"metadata"`
	}
	k.must(t, "POST", "/api/v1/namespaces/"+ns+"/serviceaccounts", obj("ServiceAccount", "v1", map[string]any{"name": name}, nil), &out)
	k.mu.Lock()
	k.saUIDs[ns+"/"+name] = out.Metadata.UID
	k.mu.Unlock()
	return out.Metadata.UID
}

// tokenRequest asks the API server for a bound service-account token (TokenRequest API).
// An empty audience means the API server's own audiences.
func (k *kubeFixture) tokenRequest(t *testing.T, ns, sa, audience string) string {
	t.Helper()
	spec := map[string]any{"expirationSeconds": 3600}
	if audience != "" {
		spec["audiences"] = []string{audience}
	}
	var out struct {
		Status struct{ Token string } `json:"status"`
	}
	k.must(t, "POST", "/api/v1/namespaces/"+ns+"/serviceaccounts/"+sa+"/token",
		obj("TokenRequest", "authentication.k8s.io/v1", map[string]any{}, map[string]any{"spec": spec}), &out)
	if out.Status.Token == "" {
		t.Fatalf("TokenRequest %s/%s returned no token", ns, sa)
	}
	return out.Status.Token
}

// mint signs a service-account JWT with the fixture's signing key (RS256), like the API
// server's legacy-style bound tokens: iss, sub, aud, iat, nbf, exp and the kubernetes.io claims.
func (k *kubeFixture) mint(t *testing.T, ns, sa, audience string, exp time.Time) string {
	t.Helper()
	k.mu.Lock()
	uid := k.saUIDs[ns+"/"+sa]
	k.mu.Unlock()
	b64 := base64.RawURLEncoding.EncodeToString
	hdr, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT"})
	iat := exp.Add(-time.Hour).Unix()
	claims, _ := json.Marshal(map[string]any{
		"iss": k.issuer, "sub": "system:serviceaccount:" + ns + ":" + sa, "aud": []string{audience},
		"iat": iat, "nbf": iat, "exp": exp.Unix(),
		"kubernetes.io": map[string]any{"namespace": ns, "serviceaccount": map[string]string{"name": sa, "uid": uid}},
	})
	signing := b64(hdr) + "." + b64(claims)
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, k.signKey, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + b64(sig)
}

// serverIdentity creates a ServiceAccount for one server under test and writes a kubeconfig
// with its token. Returns the kubeconfig path and the username the audit log shows.
func (k *kubeFixture) serverIdentity(t *testing.T, name string) (string, string) {
	t.Helper()
	k.createSA(t, serverSANS, name)
	return k.kubeconfigFor(t, name, k.tokenRequest(t, serverSANS, name, "")), "system:serviceaccount:" + serverSANS + ":" + name
}

func (k *kubeFixture) kubeconfigFor(t *testing.T, name, token string) string {
	t.Helper()
	p := filepath.Join(k.dir, name+".kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: fixture
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: fixture
  context:
    cluster: fixture
    user: %s
current-context: fixture
`, k.url, base64.StdEncoding.EncodeToString(k.caPEM), name, token, name)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// uniqueName returns prefix-<n>, unique within this run.
func (k *kubeFixture) uniqueName(prefix string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.nameSeq++
	return fmt.Sprintf("%s-%d", prefix, k.nameSeq)
}

type auditEvent struct {
	Stage string `json:"stage"`
	Verb  string `json:"verb"`
	User  struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef struct {
		Resource  string `json:"resource"`
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
}

func (k *kubeFixture) audit(t *testing.T) []auditEvent {
	t.Helper()
	f, err := os.Open(k.env["AUDIT_LOG"])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var evs []auditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e auditEvent
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Stage == "ResponseComplete" {
			evs = append(evs, e)
		}
	}
	return evs
}

// tokenReviews counts TokenReview creations made by user (the audit log is written in
// blocking mode, so a review that returned is already in it).
func (k *kubeFixture) tokenReviews(t *testing.T, user string) int {
	t.Helper()
	n := 0
	for _, e := range k.audit(t) {
		if e.ObjectRef.Resource == "tokenreviews" && e.Verb == "create" && e.User.Username == user {
			n++
		}
	}
	return n
}

// ---------------------------------------------------------------- leases

type lease struct {
	Metadata struct {
		Name            string            `json:"name"`
		Labels          map[string]string `json:"labels"`
		ResourceVersion string            `json:"resourceVersion"`
	} `json:"metadata"`
	Spec struct {
		HolderIdentity       string `json:"holderIdentity"`
		LeaseDurationSeconds int    `json:"leaseDurationSeconds"`
		AcquireTime          string `json:"acquireTime"`
		RenewTime            string `json:"renewTime"`
	} `json:"spec"`
}

const leasePath = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"

// getLease returns the lease, or nil if it does not exist.
func (k *kubeFixture) getLease(name string) (*lease, error) {
	var l lease
	code, err := k.do("GET", leasePath+"/"+name, nil, &l)
	if code == 404 {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &l, nil
}

func microTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00") }

// createLease creates a labelled lease renewed at renew (a hand-made "other server").
func (k *kubeFixture) createLease(t *testing.T, name string, labels map[string]string, renew time.Time, duration int) {
	t.Helper()
	k.must(t, "POST", leasePath, obj("Lease", "coordination.k8s.io/v1",
		map[string]any{"name": name, "namespace": "kube-system", "labels": labels},
		map[string]any{"spec": map[string]any{"holderIdentity": name, "leaseDurationSeconds": duration,
			"acquireTime": microTime(renew), "renewTime": microTime(renew)}}), nil)
	t.Cleanup(func() { _, _ = k.do("DELETE", leasePath+"/"+name, nil, nil) })
}

func parseLabels(s string) map[string]string {
	m := map[string]string{}
	for _, p := range strings.Split(s, ",") {
		if kv := strings.SplitN(strings.TrimSpace(p), "=", 2); len(kv) == 2 {
			m[kv[0]] = kv[1]
		}
	}
	return m
}

// ---------------------------------------------------------------- servers and agents

type kubeServerOpts struct {
	token      bool   // token authentication (no --cluster-ca-cert)
	mode       string // --mode (default grpc)
	kubeconfig string // --kubeconfig
	serverID   string
	extra      []string
}

// startKubeServer starts one proxy-server (ours or upstream) like newEnvWith, but with the
// flags of these scenarios (token auth needs --cluster-ca-cert empty).
func startKubeServer(t *testing.T, impl, bin string, bins binaries, o kubeServerOpts) *env {
	t.Helper()
	dir := scenarioDir(t, "konn-kube-"+impl+"-")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if o.mode == "" {
		o.mode = "grpc"
	}
	e := &env{t: t, impl: impl, bins: bins, dir: dir, sock: filepath.Join(dir, "konn.sock"), ctx: ctx, mode: o.mode, agentHost: "127.0.0.1"}
	cs := getCerts(t)
	if o.serverID == "" {
		o.serverID = "kube-" + impl
	}
	for attempt := 1; ; attempt++ {
		e.agentPort, e.healthPort, e.adminPort = freePort(t), freePort(t), freePort(t)
		args := []string{"--mode=" + o.mode, "--uds-name=" + e.sock, "--server-port=0",
			"--cluster-cert=" + cs.serverCert, "--cluster-key=" + cs.serverKey}
		if !o.token {
			args = append(args, "--cluster-ca-cert="+cs.ca)
		} else {
			args = append(args, "--agent-namespace="+agentNamespace, "--agent-service-account="+agentSA,
				"--authentication-audience="+konnAudience)
		}
		if o.kubeconfig != "" {
			args = append(args, "--kubeconfig="+o.kubeconfig)
		}
		args = append(args,
			fmt.Sprintf("--agent-port=%d", e.agentPort),
			fmt.Sprintf("--health-port=%d", e.healthPort),
			fmt.Sprintf("--admin-port=%d", e.adminPort),
			"--agent-bind-address=127.0.0.1", "--health-bind-address=127.0.0.1", "--admin-bind-address=127.0.0.1",
			"--server-id="+o.serverID, "--server-count=1")
		args = append(args, o.extra...)
		e.server = startProc(t, fmt.Sprintf("server-%s-%s-%d", impl, o.serverID, attempt), dir, bin, args...)
		watchServer(t, e.server)
		err := e.waitServerUp(20 * time.Second)
		if err == nil {
			break
		}
		e.server.exitExpected.Store(true) // a failed start is reported below, not by watchServer
		if attempt < 3 && e.server.exited() && strings.Contains(e.server.log(), "address already in use") {
			continue
		}
		t.Fatalf("%s server did not come up: %v\n%s", impl, err, e.server.tail(20))
	}
	e.far = startFarEnd(t)
	return e
}

// startAgentOpts starts the upstream v0.36.0 agent against host:port with extra flags
// (token agents: --ca-cert only plus --service-account-token-path; mTLS agents: the certs).
func (e *env) startAgentOpts(id string, port int, extra ...string) *agentProc {
	e.t.Helper()
	e.nAgents++
	hp, ap := freePort(e.t), freePort(e.t)
	args := append([]string{
		"--proxy-server-host=127.0.0.1", fmt.Sprintf("--proxy-server-port=%d", port),
		"--agent-id=" + id, "--agent-identifiers=host=localhost&ipv4=127.0.0.1",
		"--health-server-host=127.0.0.1", fmt.Sprintf("--health-server-port=%d", hp),
		"--admin-bind-address=127.0.0.1", fmt.Sprintf("--admin-server-port=%d", ap),
	}, extra...)
	p := startProc(e.t, fmt.Sprintf("agent%d-%s", e.nAgents, id), e.dir, e.bins.agent, args...)
	return &agentProc{proc: p, id: id, healthPort: hp}
}

// startTokenAgent starts an agent that authenticates with the token (written to a file).
func (e *env) startTokenAgent(id, token string) *agentProc {
	e.t.Helper()
	p := filepath.Join(e.dir, id+".token")
	if err := os.WriteFile(p, []byte(token), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return e.startAgentOpts(id, e.agentPort, "--ca-cert="+getCerts(e.t).ca, "--service-account-token-path="+p)
}

func mtlsAgentArgs(t *testing.T) []string {
	cs := getCerts(t)
	return []string{"--ca-cert=" + cs.ca, "--agent-cert=" + cs.agentCert, "--agent-key=" + cs.agentKey}
}

func (e *env) waitAgentServers(a *agentProc, n float64, timeout time.Duration) {
	e.t.Helper()
	eventually(e.t, timeout, fmt.Sprintf("agent %s open_server_connections == %v", a.id, n), func() (bool, string) {
		if a.exited() {
			e.t.Fatalf("agent %s exited: %v\n%s", a.id, a.exitErr, a.tail(20))
		}
		m, err := a.metrics()
		if err != nil {
			return false, err.Error()
		}
		v, k := m.sum(metricAgentServer), m.sum(metricAgentKnown)
		return v == n, fmt.Sprintf("open=%v known=%v", v, k)
	})
}

// connectResult is what a raw AgentService/Connect call got: the server id on success, or
// the gRPC status code and message.
type connectResult struct {
	OK       bool
	ServerID string
	Code     string
	Message  string
}

// rawConnect opens an agent stream with custom metadata (TLS, server auth only) and reads the
// response headers: how the upstream agent learns that authentication failed.
func rawConnect(ctx context.Context, t *testing.T, port int, md metadata.MD) connectResult {
	t.Helper()
	return rawConnectWith(ctx, t, port, md, nil)
}

// rawConnectWith is rawConnect presenting clientCerts (mTLS agent ports; nil: none).
func rawConnectWith(ctx context.Context, t *testing.T, port int, md metadata.MD, clientCerts []tls.Certificate) connectResult {
	t.Helper()
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(getCerts(t).ca)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(ca)
	conn, err := grpc.NewClient(fmt.Sprintf("passthrough:///127.0.0.1:%d", port),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: clientCerts})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream, err := agentpb.NewAgentServiceClient(conn).Connect(metadata.NewOutgoingContext(ctx, md))
	if err == nil {
		var h metadata.MD
		h, err = stream.Header()
		if err == nil {
			if ids := h.Get("serverid"); len(ids) > 0 {
				return connectResult{OK: true, ServerID: ids[0]}
			}
			_, err = stream.Recv() // trailers-only response: the status comes with Recv
		}
	}
	st, _ := status.FromError(err)
	return connectResult{Code: st.Code().String(), Message: st.Message()}
}

func agentMD(id string, auth ...string) metadata.MD {
	md := metadata.Pairs("agentID", id, "agentIdentifiers", "host=localhost")
	for _, a := range auth {
		md.Append("authorization", a)
	}
	return md
}

// ---------------------------------------------------------------- haproxy

func haproxyBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HAPROXY_BIN"); p != "" {
		return p
	}
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/haproxy", "/usr/local/sbin/haproxy"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	skipOrFail(t, "haproxy not found (tests/interop/tools.sh installs it: apt-get install haproxy)")
	return ""
}

// startHAProxy runs haproxy in the foreground as a TCP load balancer on 127.0.0.1 in front
// of the given loopback ports (round robin) and returns its port.
func startHAProxy(t *testing.T, dir string, backends ...int) int {
	t.Helper()
	bin := haproxyBin(t)
	for attempt := 1; ; attempt++ {
		port := freePort(t)
		var sb strings.Builder
		fmt.Fprintf(&sb, "global\n  maxconn 1000\n\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n\n")
		fmt.Fprintf(&sb, "frontend agents\n  bind 127.0.0.1:%d\n  default_backend servers\n\nbackend servers\n  balance roundrobin\n", port)
		for i, b := range backends {
			fmt.Fprintf(&sb, "  server s%d 127.0.0.1:%d\n", i+1, b)
		}
		cfg := filepath.Join(dir, fmt.Sprintf("haproxy-%d.cfg", attempt))
		if err := os.WriteFile(cfg, []byte(sb.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		p := startProc(t, fmt.Sprintf("haproxy-%d", attempt), dir, bin, "-db", "-f", cfg)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && !p.exited() {
			if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
				c.Close()
				return port
			}
			time.Sleep(50 * time.Millisecond)
		}
		if attempt < 3 && p.exited() {
			continue
		}
		t.Fatalf("haproxy did not listen on %d:\n%s", port, p.tail(20))
	}
}

// ---------------------------------------------------------------- the test

// kubeShared holds results that the compare_* subtests check across implementations.
type kubeShared struct {
	mu       sync.Mutex
	messages map[string]map[string]connectResult // impl -> case -> result
	metrics  map[string]string                   // impl -> /metrics text
	reviews  map[string]string                   // impl -> summary of TokenReview counts
}

func (s *kubeShared) putMessage(impl, c string, r connectResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.messages[impl] == nil {
		s.messages[impl] = map[string]connectResult{}
	}
	s.messages[impl][c] = r
}

type implBin struct{ name, bin string }

func TestKube(t *testing.T) {
	bins := upstreamBinaries(t)
	impls := []implBin{{"ours", os.Getenv("KONNECTIVITY_SERVER_BIN")}, {"upstream", bins.server}}
	k := startKube(t)
	sh := &kubeShared{messages: map[string]map[string]connectResult{}, metrics: map[string]string{}, reviews: map[string]string{}}

	type kubeScenario struct {
		name     string
		oursOnly bool
		run      func(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared)
	}
	scs := []kubeScenario{
		{"token_auth", false, scTokenAuth},
		{"token_review_cache", false, scTokenCache},
		{"leases", false, scLeases},
		{"ha_haproxy_lease_count", false, scHA},
		{"ha_haproxy_lease_count_our_agent", false, scHAOurAgent},
		{"metrics_same_state", false, scMetricsSameState},            // metrics_test.go
		{"egress_selector_grpc", false, scEgressGRPC},                // kube_egress_test.go
		{"egress_selector_http_connect", false, scEgressHTTPConnect}, // kube_egress_test.go
		{"egress_selector_grpc_our_agent", false, scEgressGRPCOurAgent},
		{"egress_selector_http_connect_our_agent", false, scEgressHTTPConnectOurAgent},
	}
	for _, sc := range scs {
		t.Run(sc.name, func(t *testing.T) {
			for _, im := range impls {
				if sc.oursOnly && im.name != "ours" {
					continue
				}
				t.Run(im.name, func(t *testing.T) {
					t.Parallel()
					if im.bin == "" {
						skipOrFail(t, "KONNECTIVITY_SERVER_BIN is not set: not testing our server (pass it to run.sh)")
					}
					sc.run(t, k, im.name, im.bin, bins, sh)
				})
			}
		})
	}
	t.Run("compare_token_messages", func(t *testing.T) { compareMessages(t, sh) })
	t.Run("compare_metrics_help_type", func(t *testing.T) { compareMetrics(t, sh) }) // metrics_test.go
	t.Run("promtool", func(t *testing.T) { runPromtoolAll(t, sh) })                  // metrics_test.go
}

// ---------------------------------------------------------------- scenario: token auth

// authCase is one way an agent can present (or fail to present) a token.
type authCase struct {
	name string
	md   func(id string) metadata.MD
	want string // the exact gRPC status message (upstream v0.36.0)
}

func tokenCases(t *testing.T, k *kubeFixture) (valid string, cases []authCase) {
	t.Helper()
	valid = k.tokenRequest(t, agentNamespace, agentSA, konnAudience)
	bearer := func(tok string) func(string) metadata.MD {
		return func(id string) metadata.MD { return agentMD(id, "Bearer "+tok) }
	}
	wrongNS := k.tokenRequest(t, "default", agentSA, konnAudience)
	wrongSA := k.tokenRequest(t, agentNamespace, "other-agent", konnAudience)
	wrongAud := k.tokenRequest(t, agentNamespace, agentSA, "other-audience")
	// Expired by 5 minutes: well past the API server's 60 s leeway.
	expired := k.mint(t, agentNamespace, agentSA, konnAudience, time.Now().Add(-5*time.Minute))
	cases = []authCase{
		// Review failures are wrapped in authErrPrefix; metadata problems (no token, two
		// tokens, no "Bearer " prefix) are not: upstream returns them bare
		// (authenticateAgentViaToken in pkg/server/server.go wraps only validateAuthToken).
		{"wrong_namespace", bearer(wrongNS), authErrPrefix + `lookup failed: incoming request from "default" namespace. Expected "kube-system"`},
		{"wrong_service_account", bearer(wrongSA), authErrPrefix + `lookup failed: incoming request from "other-agent" service account. Expected "konnectivity-agent"`},
		{"wrong_audience", bearer(wrongAud), authErrPrefix + `lookup failed: [invalid bearer token, token audiences ["other-audience"] is invalid for the target audiences ["system:konnectivity-server"]]`},
		{"expired", bearer(expired), authErrPrefix + `lookup failed: [invalid bearer token, service account token has expired]`},
		{"garbage_token", bearer("abc.def.ghi"), authErrPrefix + `lookup failed: invalid bearer token`},
		{"missing_token", func(id string) metadata.MD { return agentMD(id) }, `Authentication context was not found in metadata`},
		{"no_bearer_prefix", func(id string) metadata.MD { return agentMD(id, valid) }, `received token does not have "Bearer " prefix`},
		{"lowercase_bearer", func(id string) metadata.MD { return agentMD(id, "bearer "+valid) }, `received token does not have "Bearer " prefix`},
		{"two_tokens", func(id string) metadata.MD { return agentMD(id, "Bearer "+valid, "Bearer "+valid) }, `too many (2) tokens are received`},
	}
	return valid, cases
}

func scTokenAuth(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared) {
	kc, _ := k.serverIdentity(t, "auth-"+impl)
	e := startKubeServer(t, impl, bin, bins, kubeServerOpts{token: true, kubeconfig: kc, serverID: "auth-" + impl})
	valid, cases := tokenCases(t, k)

	// 1. The upstream agent with a valid token connects and a tunnel works.
	a := e.startTokenAgent("good-agent", valid)
	e.waitAgentConnected(a)
	e.waitReady()
	if err := fetch(e.ctx, e.singleUse(), e.far.addr, 256<<10, 8); err != nil {
		t.Fatalf("fetch through the token-authenticated agent: %v", err)
	}
	libSingleRequest(t, e, e.startTestServer())

	// 2. The upstream agent with each bad token: never connected, and it logs the server's message.
	agentCases := map[string]*agentProc{}
	for _, c := range cases[:4] { // wrong namespace / service account / audience, expired
		md := c.md("x")
		tok := strings.TrimPrefix(md.Get("authorization")[0], "Bearer ")
		agentCases[c.name] = e.startTokenAgent("bad-"+c.name, tok)
	}
	for _, c := range cases[:4] {
		a := agentCases[c.name]
		// The v0.36.0 agent reads only the response headers (stream.Header()); a rejected
		// stream is a trailers-only response, so it logs "expected one server ID in the
		// context, got []" and never the server's message (same with both servers). The exact
		// message is checked below with a raw Connect.
		eventually(t, 20*time.Second, "agent "+a.id+" rejected twice", func() (bool, string) {
			return strings.Count(a.log(), `"cannot connect once"`) >= 2, "log tail: " + a.tail(3)
		})
		m, err := a.metrics()
		if err != nil || m.sum(metricAgentServer) != 0 {
			t.Errorf("%s: agent should have no server connection: %v %v", c.name, m.sum(metricAgentServer), err)
		}
		line := a.log()[strings.Index(a.log(), `"cannot connect once"`):]
		line = line[:strings.IndexByte(line, '\n')]
		if i := strings.Index(line, "err="); i >= 0 {
			line = line[i:]
		}
		t.Logf("agent with %s token logs: %s", c.name, line)
		sh.putMessage(impl, "agent_log_"+c.name, connectResult{Message: line})
		a.kill()
	}
	// The good agent is the only one the server counts.
	e.waitServerAgentStreams(1)

	// 3. Raw Connect streams with custom metadata: exact gRPC code and message.
	r := rawConnect(e.ctx, t, e.agentPort, agentMD("raw-good", "Bearer "+valid))
	if !r.OK || r.ServerID != "auth-"+impl {
		t.Errorf("valid token, raw Connect: %+v", r)
	}
	sh.putMessage(impl, "valid", r)
	for _, c := range cases {
		r := rawConnect(e.ctx, t, e.agentPort, c.md("raw-"+c.name))
		sh.putMessage(impl, c.name, r)
		want := c.want
		if r.OK || r.Code != "Unknown" || r.Message != want {
			t.Errorf("%s: got %+v\n    want code Unknown, message %q", c.name, r, want)
		} else {
			t.Logf("%s: Unknown %q", c.name, r.Message)
		}
	}
	// The rejected streams are gone; only the good agent remains.
	e.waitServerAgentStreams(1)
	e.assertQuiescent(t)
}

func compareMessages(t *testing.T, sh *kubeShared) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ours, up := sh.messages["ours"], sh.messages["upstream"]
	if len(ours) == 0 || len(up) == 0 {
		skipOrFail(t, "token_auth did not record results for both implementations (ours %d, upstream %d)", len(ours), len(up))
	}
	var names []string
	for n := range up {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		o, u := ours[n], up[n]
		if n == "valid" { // server ids differ by design
			o.ServerID, u.ServerID = "", ""
		}
		if o != u {
			t.Errorf("%s: ours %+v, upstream %+v", n, o, u)
		} else {
			t.Logf("%s: identical (%s %q)", n, u.Code, u.Message)
		}
	}
}

// ---------------------------------------------------------------- scenario: TokenReview cache

func scTokenCache(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared) {
	ident := "cache-" + impl
	kc, user := k.serverIdentity(t, ident)
	e := startKubeServer(t, impl, bin, bins, kubeServerOpts{token: true, kubeconfig: kc, serverID: ident})
	valid, cases := tokenCases(t, k)
	reviews := func() int { return k.tokenReviews(t, user) }
	if n := reviews(); n != 0 {
		t.Fatalf("%d TokenReviews before any agent connected", n)
	}

	// N agent (re)connects with the same token: N agent processes one after the other.
	const nAgents = 4
	for i := 0; i < nAgents; i++ {
		a := e.startTokenAgent(fmt.Sprintf("cache-agent-%d", i), valid)
		e.waitAgentConnected(a)
		e.waitServerAgentStreams(1)
		a.kill()
		e.waitServerAgentStreams(0)
	}
	// M more Connect streams with the same token from our own client.
	const nRaw = 10
	for i := 0; i < nRaw; i++ {
		if r := rawConnect(e.ctx, t, e.agentPort, agentMD(fmt.Sprintf("raw-%d", i), "Bearer "+valid)); !r.OK {
			t.Fatalf("raw connect %d with the valid token: %+v", i, r)
		}
	}
	good := reviews()
	// Failures are never cached: every bad token costs a review, every time.
	const nBad = 3
	for i := 0; i < nBad; i++ {
		for _, c := range cases[:4] {
			if r := rawConnect(e.ctx, t, e.agentPort, c.md("bad")); r.OK {
				t.Fatalf("%s accepted", c.name)
			}
		}
	}
	bad := reviews() - good
	// Prefix/missing-token failures never reach the API server.
	for _, c := range cases[5:] {
		rawConnect(e.ctx, t, e.agentPort, c.md("bad"))
	}
	noReview := reviews() - good - bad
	summary := fmt.Sprintf("%d valid connects (%d agents + %d raw) -> %d TokenReviews; %d bad-token connects -> %d; %d malformed/missing -> %d",
		nAgents+nRaw, nAgents, nRaw, good, nBad*4, bad, len(cases[5:]), noReview)
	t.Logf("TOKENREVIEW-COUNTS[%s]: %s", impl, summary)
	sh.mu.Lock()
	sh.reviews[impl] = summary
	sh.mu.Unlock()
	if bad != nBad*4 {
		t.Errorf("bad tokens: %d reviews for %d attempts (failures must never be cached)", bad, nBad*4)
	}
	if noReview != 0 {
		t.Errorf("malformed/missing tokens caused %d TokenReviews", noReview)
	}
	if impl == "upstream" {
		if good < nAgents+nRaw {
			t.Errorf("upstream: %d reviews for %d connects (upstream has no cache)", good, nAgents+nRaw)
		}
		return
	}
	if good != 1 {
		t.Errorf("ours: %d TokenReviews for %d connects with one token within the TTL, want 1", good, nAgents+nRaw)
	}
	m, err := e.serverMetrics()
	if err != nil {
		t.Fatal(err)
	}
	hits := m.sum("konnectivity_network_proxy_server_token_review_cache_hits_total")
	okReviews := m.sum("konnectivity_network_proxy_server_token_reviews_total", `result="ok"`)
	if hits != nAgents+nRaw-1 || okReviews != float64(good+bad) {
		t.Errorf("ours metrics: cache_hits=%v (want %d) token_reviews_total{ok}=%v (want %d)", hits, nAgents+nRaw-1, okReviews, good+bad)
	}

	t.Run("ttl_expiry", func(t *testing.T) {
		// --agent-token-cache-ttl=4s: the cached review is used within 4 s, then reviewed again.
		kc, user := k.serverIdentity(t, "cache-ttl-ours")
		e := startKubeServer(t, impl, bin, bins, kubeServerOpts{token: true, kubeconfig: kc, serverID: "cache-ttl-ours",
			extra: []string{"--agent-token-cache-ttl=4s"}})
		connect := func() {
			if r := rawConnect(e.ctx, t, e.agentPort, agentMD("ttl", "Bearer "+valid)); !r.OK {
				t.Fatalf("connect: %+v", r)
			}
		}
		t0 := time.Now()
		connect()
		connect()
		if took := time.Since(t0); took > 3*time.Second {
			t.Fatalf("two connects took %v: too slow to test a 4 s TTL", took)
		}
		if n := k.tokenReviews(t, user); n != 1 {
			t.Fatalf("two connects within the 4s TTL: %d reviews, want 1", n)
		}
		time.Sleep(time.Until(t0.Add(4500 * time.Millisecond)))
		connect()
		if n := k.tokenReviews(t, user); n != 2 {
			t.Fatalf("connect after the 4s TTL: %d reviews, want 2", n)
		}
	})
	t.Run("never_past_token_exp", func(t *testing.T) {
		// A token that expires in ~6 s (the API server still accepts it for 60 s more): with the
		// default TTL of 1m the cached review must not outlive the token's exp.
		kc, user := k.serverIdentity(t, "cache-exp-ours")
		e := startKubeServer(t, impl, bin, bins, kubeServerOpts{token: true, kubeconfig: kc, serverID: "cache-exp-ours"})
		exp := time.Now().Add(7 * time.Second).Truncate(time.Second)
		tok := k.mint(t, agentNamespace, agentSA, konnAudience, exp)
		connect := func() {
			if r := rawConnect(e.ctx, t, e.agentPort, agentMD("exp", "Bearer "+tok)); !r.OK {
				t.Fatalf("connect: %+v", r)
			}
		}
		connect()
		connect()
		if time.Now().After(exp) {
			t.Fatalf("two connects took until after the token's exp: too slow to test")
		}
		if n := k.tokenReviews(t, user); n != 1 {
			t.Fatalf("two connects before exp: %d reviews, want 1", n)
		}
		time.Sleep(time.Until(exp.Add(1500 * time.Millisecond)))
		connect()
		if n := k.tokenReviews(t, user); n != 2 {
			t.Fatalf("connect 1.5 s after the token's exp: %d reviews, want 2 (cache must end at exp)", n)
		}
	})
}

// ---------------------------------------------------------------- scenario: leases

func scLeases(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared) {
	id := "lease-" + impl
	labelStr := "k8s-app=konnectivity-server,scenario=leases-" + impl
	labels := parseLabels(labelStr)
	kc, user := k.serverIdentity(t, id)
	e := startKubeServer(t, impl, bin, bins, kubeServerOpts{kubeconfig: kc, serverID: id,
		extra: []string{"--enable-lease-controller", "--lease-namespace=kube-system", "--lease-label=" + labelStr}})
	started := time.Now()
	name := "konnectivity-proxy-server-" + id

	// Controls that the collector must leave alone: an expired lease without our labels, and a
	// live lease with them (another server).
	k.createLease(t, "unlabelled-stale-"+impl, map[string]string{"k8s-app": "other"}, time.Now().Add(-10*time.Minute), 30)
	k.createLease(t, "live-peer-"+impl, labels, time.Now(), 3600)

	// Created: name, holder, duration, labels.
	var first *lease
	eventually(t, 10*time.Second, "lease "+name+" created", func() (bool, string) {
		l, err := k.getLease(name)
		if err != nil {
			return false, err.Error()
		}
		first = l
		return l != nil, "absent"
	})
	t.Logf("LEASE-TIMING[%s]: lease created %.2fs after start: holder=%s duration=%d labels=%v acquireTime=%q renewTime=%q",
		impl, time.Since(started).Seconds(), first.Spec.HolderIdentity, first.Spec.LeaseDurationSeconds, first.Metadata.Labels,
		first.Spec.AcquireTime, first.Spec.RenewTime)
	if first.Spec.HolderIdentity != id || first.Spec.LeaseDurationSeconds != 30 || first.Spec.RenewTime == "" {
		t.Errorf("lease spec: holder=%q duration=%d renewTime=%q, want holder %q, 30, set", first.Spec.HolderIdentity,
			first.Spec.LeaseDurationSeconds, first.Spec.RenewTime, id)
	}
	if fmt.Sprint(first.Metadata.Labels) != fmt.Sprint(labels) {
		t.Errorf("lease labels %v, want %v", first.Metadata.Labels, labels)
	}

	// A stale labelled lease (renewed 2 minutes ago, 30 s duration): collected within ~15 s.
	stale := "stale-" + impl
	k.createLease(t, stale, labels, time.Now().Add(-2*time.Minute), 30)
	staleAt := time.Now()
	var collected time.Duration
	renewDone := make(chan string, 1)
	go func() { // renewal, watched concurrently (needs > 15 s)
		r0 := first.Spec.RenewTime
		deadline := time.Now().Add(25 * time.Second)
		for time.Now().Before(deadline) {
			if l, err := k.getLease(name); err == nil && l != nil && l.Spec.RenewTime != r0 {
				a, _ := time.Parse(time.RFC3339Nano, r0)
				b, _ := time.Parse(time.RFC3339Nano, l.Spec.RenewTime)
				renewDone <- fmt.Sprintf("%.2f|%s -> %s", b.Sub(a).Seconds(), r0, l.Spec.RenewTime)
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		renewDone <- "timeout"
	}()
	eventually(t, 25*time.Second, "stale lease "+stale+" collected", func() (bool, string) {
		l, err := k.getLease(stale)
		if err != nil {
			return false, err.Error()
		}
		collected = time.Since(staleAt)
		return l == nil, "still present"
	})
	t.Logf("LEASE-TIMING[%s]: stale labelled lease collected %.2fs after it was created", impl, collected.Seconds())
	if collected > 18*time.Second {
		t.Errorf("stale lease collected after %v, want within ~15 s (GC interval 15 s)", collected)
	}
	for _, keep := range []string{"unlabelled-stale-" + impl, "live-peer-" + impl} {
		if l, err := k.getLease(keep); err != nil || l == nil {
			t.Errorf("lease %s must not be collected (err %v)", keep, err)
		}
	}

	// Renewed: renewTime advances by ~15 s.
	r := <-renewDone
	if r == "timeout" {
		t.Fatalf("lease %s not renewed within 25 s", name)
	}
	parts := strings.SplitN(r, "|", 2)
	d, _ := strconv.ParseFloat(parts[0], 64)
	t.Logf("LEASE-TIMING[%s]: renewed after %.2fs (%s)", impl, d, parts[1])
	if d < 14 || d > 17.5 {
		t.Errorf("renewTime advanced by %.2fs, want ~15 s (15 s + <=4%% jitter)", d)
	}

	m, err := e.serverMetrics()
	if err != nil {
		t.Fatal(err)
	}
	culled := m.sum("konnectivity_network_proxy_server_culled_leases_count")
	lists := m.sum("konnectivity_network_proxy_server_lease_list_total", `http_status_code="200"`)
	deletes := m.sum("konnectivity_network_proxy_server_lease_delete_total", `http_status_code="200"`)
	t.Logf("lease metrics: culled_leases_count=%v lease_list_total{200}=%v lease_delete_total{200}=%v", culled, lists, deletes)
	if culled != 1 || lists < 1 || deletes != 1 {
		t.Errorf("lease metrics: culled_leases_count=%v (want 1) lease_list_total{200}=%v (want >=1) lease_delete_total{200}=%v (want 1)", culled, lists, deletes)
	}

	// Own lease deleted on SIGTERM.
	e.server.signal(syscall.SIGTERM)
	termAt := time.Now()
	eventually(t, 15*time.Second, "own lease deleted after SIGTERM", func() (bool, string) {
		l, err := k.getLease(name)
		if err != nil {
			return false, err.Error()
		}
		return l == nil, "still present"
	})
	gone := time.Since(termAt)
	select {
	case <-e.server.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("server still running 15 s after SIGTERM")
	}
	t.Logf("LEASE-TIMING[%s]: own lease deleted %.2fs after SIGTERM; exit: %v", impl, gone.Seconds(), e.server.exitErr)

	// The API calls it made, from the audit log.
	verbs := map[string]int{}
	for _, ev := range k.audit(t) {
		if ev.User.Username == user && ev.ObjectRef.Resource == "leases" {
			verbs[ev.Verb+"/"+strconv.Itoa(ev.ResponseStatus.Code)]++
		}
	}
	t.Logf("lease API calls by %s (verb/status: count): %v", user, verbs)
}

// ---------------------------------------------------------------- scenario: HA behind haproxy

func scHA(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared) {
	scHAWith(t, k, impl, bin, bins, impl)
}

// scHAOurAgent is scHA with our agent counting the leases (--count-server-leases).
func scHAOurAgent(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, sh *kubeShared) {
	scHAWith(t, k, impl, bin, withOurAgent(t, bins), impl+"-ra")
}

// scHAWith runs the HA scenario; tag keeps its leases, ids and identities apart from another
// run's with the same server.
func scHAWith(t *testing.T, k *kubeFixture, impl, bin string, bins binaries, tag string) {
	labelStr := "k8s-app=konnectivity-server,ha=" + tag
	var servers []*env
	for i := 1; i <= 2; i++ {
		id := fmt.Sprintf("ha-%s-%d", tag, i)
		kc, _ := k.serverIdentity(t, id)
		servers = append(servers, startKubeServer(t, impl, bin, bins, kubeServerOpts{kubeconfig: kc, serverID: id,
			extra: []string{"--enable-lease-controller", "--lease-namespace=kube-system", "--lease-label=" + labelStr}}))
		name := "konnectivity-proxy-server-" + id
		eventually(t, 10*time.Second, "lease "+name, func() (bool, string) {
			l, err := k.getLease(name)
			return err == nil && l != nil, fmt.Sprint(err)
		})
	}
	lb := startHAProxy(t, servers[0].dir, servers[0].agentPort, servers[1].agentPort)
	agentKC := k.kubeconfigFor(t, "agent-"+tag, k.tokenRequest(t, agentNamespace, agentSA, ""))
	e := servers[0]
	a := e.startAgentOpts("ha-agent", lb, append(mtlsAgentArgs(t),
		"--count-server-leases", "--kubeconfig="+agentKC, "--lease-namespace=kube-system", "--lease-label="+labelStr)...)
	t0 := time.Now()
	e.waitAgentServers(a, 2, 60*time.Second)
	t.Logf("HA-LB[%s]: agent connected to both servers through haproxy :%d after %.1fs", impl, lb, time.Since(t0).Seconds())
	m, _ := a.metrics()
	if v := m.sum(metricAgentKnown); v != 2 {
		t.Errorf("agent known_server_count = %v, want 2 (from the leases; --server-count is 1)", v)
	}
	for i, s := range servers {
		s.waitServerAgentStreams(1)
		s.waitReady()
		if err := fetch(s.ctx, s.singleUse(), s.far.addr, 128<<10, uint64(10+i)); err != nil {
			t.Errorf("tunnel through server %d: %v", i+1, err)
		}
	}
	// Server 2 leaves (SIGTERM deletes its lease): the agent is left with one connection.
	servers[1].server.signal(syscall.SIGTERM)
	e.waitAgentServers(a, 1, 30*time.Second)
	eventually(t, 30*time.Second, "agent known_server_count == 1", func() (bool, string) {
		m, err := a.metrics()
		if err != nil {
			return false, err.Error()
		}
		v := m.sum(metricAgentKnown)
		return v == 1, fmt.Sprint(v)
	})
	if err := fetch(e.ctx, e.singleUse(), e.far.addr, 64<<10, 20); err != nil {
		t.Errorf("tunnel through the remaining server: %v", err)
	}
}
