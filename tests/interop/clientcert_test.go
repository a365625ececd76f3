package interop

// Client-certificate enforcement on the agent port: with --cluster-ca-cert, a TLS client
// without a certificate, or with one from another CA, must get no HTTP/2 connection, at
// start (both implementations) and after every reload (ours: lifecycle_test.go calls
// expectClientCertEnforced after each SIGHUP reload, each of which rebuilds the TLS config).

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
)

func clientCertScenarios() []scenarioX {
	return []scenarioX{
		{scenario: scenario{"agent_port_client_cert", scAgentPortClientCert}},
		{scenario: scenario{"agent_metadata_rejections", scAgentMetadataRejections}},
	}
}

// metadataCases: how an agent's Connect metadata can be malformed. want is the exact gRPC
// status message tests/tunnel/misbehaving.rs expects from ours (misbehaving_agent_*); the same table is
// asserted against the upstream binary, and the upstream run also diffs every code and
// message against ours' (metadataSeen).
var metadataCases = []struct {
	name string
	md   metadata.MD
	want string // "" = accepted; a trailing "*" = prefix match
}{
	{"two_agent_ids", metadata.Pairs("agentid", "a", "agentid", "b"), "expected one agent ID in the context, got [a b]"},
	{"no_agent_id", metadata.MD{}, "expected one agent ID in the context, got []"},
	{"empty_agent_id", metadata.Pairs("agentid", ""), ""},
	{"malformed_identifiers", metadata.Pairs("agentid", "a", "agentidentifiers", "host=%zz"), "fail to parse url encoded string: *"},
	{"two_identifier_sets", metadata.Pairs("agentid", "a", "agentidentifiers", "host=x", "agentidentifiers", "host=y"),
		"expected at most one set of agent identifiers in the context, got [host=x host=y]"},
	{"unknown_identifier_keys", metadata.Pairs("agentid", "a", "agentidentifiers", "host=localhost&ipv4=10.0.0.1&default-route=true&future-key=1"), ""},
}

var (
	metadataMu   sync.Mutex
	metadataSeen = map[string]map[string]connectResult{} // impl -> case -> result
)

func scAgentMetadataRejections(t *testing.T, e *env) {
	cs := getCerts(t)
	cert, err := tls.LoadX509KeyPair(cs.agentCert, cs.agentKey)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]connectResult{}
	for _, c := range metadataCases {
		r := rawConnectWith(e.ctx, t, e.agentPort, c.md, []tls.Certificate{cert})
		got[c.name] = r
		t.Logf("METADATA[%s] %s: ok=%v code=%s message=%q", e.impl, c.name, r.OK, r.Code, r.Message)
		switch {
		case c.want == "":
			if !r.OK {
				t.Errorf("%s: want accepted, got %s %q", c.name, r.Code, r.Message)
			}
		case strings.HasSuffix(c.want, "*"):
			if r.OK || r.Code != "Unknown" || !strings.HasPrefix(r.Message, strings.TrimSuffix(c.want, "*")) {
				t.Errorf("%s: want Unknown %q..., got ok=%v %s %q", c.name, strings.TrimSuffix(c.want, "*"), r.OK, r.Code, r.Message)
			}
		default:
			if r.OK || r.Code != "Unknown" || r.Message != c.want {
				t.Errorf("%s: want Unknown %q, got ok=%v %s %q", c.name, c.want, r.OK, r.Code, r.Message)
			}
		}
	}
	metadataMu.Lock()
	defer metadataMu.Unlock()
	metadataSeen[e.impl] = got
	ours, upstream := metadataSeen["ours"], metadataSeen["upstream"]
	if ours == nil || upstream == nil {
		return
	}
	for _, c := range metadataCases {
		o, u := ours[c.name], upstream[c.name]
		if o.OK != u.OK || o.Code != u.Code || o.Message != u.Message {
			t.Errorf("%s: ours ok=%v %s %q, upstream ok=%v %s %q", c.name, o.OK, o.Code, o.Message, u.OK, u.Code, u.Message)
		}
	}
}

func scAgentPortClientCert(t *testing.T, e *env) {
	e.expectClientCertEnforced(t, "at start, no agent yet")
	e.withAgent("a1", "")
	e.expectClientCertEnforced(t, "with an agent connected")
	if err := fetch(e.ctx, e.singleUse(), e.far.addr, 64<<10, 5); err != nil {
		t.Fatalf("tunnel through the accepted agent: %v", err)
	}
}

var (
	foreignOnce sync.Once
	foreignCert tls.Certificate
	foreignErr  error
)

// foreignClientCert is a clientAuth certificate (CN proxy-agent) issued by a CA the server
// does not trust; made once per run.
func foreignClientCert(t *testing.T) tls.Certificate {
	t.Helper()
	foreignOnce.Do(func() {
		now := time.Now().Add(-time.Hour)
		caKey, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			foreignErr = err
			return
		}
		caTmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "konn-interop-foreign-ca"},
			NotBefore: now, NotAfter: now.Add(10 * 24 * time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}
		caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
		if err != nil {
			foreignErr = err
			return
		}
		ca, _ := x509.ParseCertificate(caDER)
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			foreignErr = err
			return
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "proxy-agent"},
			NotBefore: now, NotAfter: now.Add(10 * 24 * time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			foreignErr = err
			return
		}
		foreignCert = tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key}
	})
	if foreignErr != nil {
		t.Fatalf("foreign client certificate: %v", foreignErr)
	}
	return foreignCert
}

// h2Preface is the HTTP/2 client preface followed by an empty SETTINGS frame.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// agentPortOutcome connects to the agent port as an agent would (trusting the harness CA,
// ALPN h2) with cert as the client certificate (nil: none), sends the HTTP/2 preface and
// reports "accepted" (the server answered with bytes: its SETTINGS), "refused" (handshake
// error, alert or EOF) or "no answer". Under TLS 1.3 the client's handshake completes before
// the server has checked the client certificate, so a refusal often shows only on the read.
func (e *env) agentPortOutcome(cert *tls.Certificate) (string, string) {
	cs := getCerts(e.t)
	pool := x509.NewCertPool()
	pool.AddCert(cs.caCert)
	cfg := &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"h2"}}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	addr := net.JoinHostPort(e.agentHost, strconv.Itoa(e.agentPort))
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return "refused", "handshake: " + err.Error()
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(h2Preface)); err != nil {
		return "refused", "write: " + err.Error()
	}
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if n > 0 {
		return "accepted", fmt.Sprintf("%d bytes from the server (ALPN %q)", n, conn.ConnectionState().NegotiatedProtocol)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "no answer", "nothing read within 5 s"
	}
	return "refused", fmt.Sprintf("read: %v", err)
}

// expectClientCertEnforced: the harness agent certificate is accepted; no certificate and a
// certificate from another CA are refused.
func (e *env) expectClientCertEnforced(t *testing.T, when string) {
	t.Helper()
	cs := getCerts(t)
	good, err := tls.LoadX509KeyPair(cs.agentCert, cs.agentKey)
	if err != nil {
		t.Fatal(err)
	}
	foreign := foreignClientCert(t)
	for _, c := range []struct {
		name string
		cert *tls.Certificate
		want string
	}{
		{"the cluster CA's agent certificate", &good, "accepted"},
		{"no client certificate", nil, "refused"},
		{"a client certificate from another CA", &foreign, "refused"},
	} {
		got, detail := e.agentPortOutcome(c.cert)
		if got != c.want {
			t.Fatalf("%s: agent port with %s: %s (%s), want %s", when, c.name, got, detail, c.want)
		}
	}
}
