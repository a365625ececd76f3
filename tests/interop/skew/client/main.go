// Command skew-client drives one tunnel through a Konnectivity proxy-server's
// UDS frontend using an OLDER konnectivity-client release (pinned in go.mod),
// exactly as kube-apiserver does (single-use gRPC tunnel, insecure creds over
// a unix socket). It is invoked by the interop test driver for version-skew
// scenarios and prints one JSON line with the result.
//
// Modes:
//
//	get   : HTTP GET http://<addr><path> through the tunnel; reports status, byte count, sha256 of the body.
//	fetch : far-end protocol "GET <n> <seed>\n"; reads until EOF; reports byte count and sha256.
//	dial  : only dial; reports the dial error (if any).
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

type result struct {
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
	Status int    `json:"status,omitempty"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256,omitempty"`
}

func main() {
	uds := flag.String("uds", "", "proxy-server UDS path")
	addr := flag.String("addr", "", "target host:port")
	mode := flag.String("mode", "get", "get|fetch|dial")
	path := flag.String("path", "/success", "HTTP path for mode=get")
	n := flag.Int64("n", 0, "bytes for mode=fetch")
	seed := flag.Uint64("seed", 1, "seed for mode=fetch")
	timeout := flag.Duration("timeout", 60*time.Second, "overall timeout")
	flag.Parse()

	res := run(*uds, *addr, *mode, *path, *n, *seed, *timeout)
	_ = json.NewEncoder(os.Stdout).Encode(res)
	if !res.OK {
		os.Exit(1)
	}
}

func run(uds, addr, mode, path string, n int64, seed uint64, timeout time.Duration) result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tunnel, err := client.CreateSingleUseGrpcTunnelWithContext(ctx, ctx, uds,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", uds)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent("interop-skew-client"),
	)
	if err != nil {
		return result{Error: "create tunnel: " + err.Error()}
	}
	conn, err := tunnel.DialContext(ctx, "tcp", addr)
	if err != nil {
		return result{Error: err.Error()}
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	h := sha256.New()
	switch mode {
	case "dial":
		return result{OK: true}
	case "get":
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		req.Close = true
		if err := req.Write(conn); err != nil {
			return result{Error: "write: " + err.Error()}
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), req)
		if err != nil {
			return result{Error: "read response: " + err.Error()}
		}
		defer resp.Body.Close()
		nb, err := io.Copy(h, resp.Body)
		if err != nil {
			return result{Error: "read body: " + err.Error(), Bytes: nb}
		}
		return result{OK: true, Status: resp.StatusCode, Bytes: nb, SHA256: hex.EncodeToString(h.Sum(nil))}
	case "fetch":
		if _, err := fmt.Fprintf(conn, "GET %d %d\n", n, seed); err != nil {
			return result{Error: "write: " + err.Error()}
		}
		nb, err := io.Copy(h, conn)
		if err != nil {
			return result{Error: "read: " + err.Error(), Bytes: nb}
		}
		return result{OK: nb == n, Bytes: nb, SHA256: hex.EncodeToString(h.Sum(nil))}
	}
	return result{Error: "unknown mode " + mode}
}
