package interop

// The admin port's per-tunnel view with the unchanged upstream peers: a tunnel from upstream's
// konnectivity-client through upstream's proxy-agent is listed by /tunnels with its
// destination, agent, bytes and a stalled reader, printed by `konnectivity-server tunnels`,
// and closed from the admin port (--enable-tunnel-close): its client is told, the agent closes
// the far end, and every gauge returns to zero. Upstream has no such view: ours only.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func tunnelsScenarios() []scenarioX {
	return []scenarioX{
		{scenario: scenario{"tunnels_view_and_close", scTunnelsView}, oursOnly: true, opts: func(string) envOpts {
			return envOpts{extraArgs: []string{"--enable-tunnel-close"}}
		}},
	}
}

// tunnelEntry: the /tunnels fields this scenario checks.
type tunnelEntry struct {
	ConnectionID *int64 `json:"connection_id"`
	Frontend     *struct {
		Kind string `json:"kind"`
	} `json:"frontend"`
	AgentID       string  `json:"agent_id"`
	Destination   *string `json:"destination"`
	State         string  `json:"state"`
	BytesToAgent  int64   `json:"bytes_to_agent"`
	QueuedBytes   int64   `json:"queued_bytes"`
	ReaderStalled bool    `json:"reader_stalled"`
}

func (e *env) tunnels(t *testing.T, query string) []tunnelEntry {
	t.Helper()
	code, body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/tunnels%s", e.adminPort, query))
	if err != nil || code != 200 {
		t.Fatalf("GET /tunnels%s: %d %v\n%s", query, code, err, body)
	}
	var list []tunnelEntry
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("/tunnels is not the JSON list expected: %v\n%s", err, body)
	}
	return list
}

func scTunnelsView(t *testing.T, e *env) {
	e.withAgent("a1", "")
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	conn, _, err := e.dial(ctx, e.far.addr)
	if err != nil {
		t.Fatalf("dial %s: %v", e.far.addr, err)
	}
	defer conn.Close()
	// An open-ended stream (32 KiB every 10 ms) that the client never reads: its reader
	// stalls, and the far end keeps the tunnel open, so the view cannot miss it. (A fixed
	// amount could be queued whole and the agent's side closed before the first look: the
	// entry then leaves /tunnels with the agent's route, its queue still draining.) The client
	// gives up after its own 10 s read timeout; the checks are done well before.
	request := "TICK 7 32768 10\n"
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatalf("request: %v", err)
	}
	var entry tunnelEntry
	eventually(t, 20*time.Second, "/tunnels shows the tunnel with a stalled reader", func() (bool, string) {
		list := e.tunnels(t, "")
		if len(list) != 1 {
			return false, fmt.Sprintf("%d entries", len(list))
		}
		entry = list[0]
		return entry.ReaderStalled && entry.QueuedBytes > 0, fmt.Sprintf("%+v", entry)
	})
	if entry.ConnectionID == nil || entry.Destination == nil || *entry.Destination != e.far.addr ||
		entry.State != "established" || entry.AgentID != "a1" || entry.Frontend == nil ||
		entry.Frontend.Kind != "grpc" || entry.BytesToAgent != int64(len(request)) {
		t.Fatalf("/tunnels entry: %+v, want connection id, destination %s, established, agent a1, grpc, %d bytes to the agent",
			entry, e.far.addr, len(request))
	}
	id := *entry.ConnectionID
	if n := len(e.tunnels(t, "?agent=a1&destination="+e.far.addr)); n != 1 {
		t.Fatalf("/tunnels filtered by its agent and destination: %d entries, want 1", n)
	}
	if n := len(e.tunnels(t, "?agent=another")); n != 0 {
		t.Fatalf("/tunnels?agent=another: %d entries, want 0", n)
	}

	// The subcommand's table, from the same admin port.
	out, err := exec.CommandContext(ctx, e.serverBin, "tunnels", "--admin-address=127.0.0.1",
		fmt.Sprintf("--admin-port=%d", e.adminPort)).CombinedOutput()
	table := string(out)
	if err != nil || !strings.Contains(table, "DESTINATION") {
		t.Fatalf("konnectivity-server tunnels: %v\n%s", err, table)
	}
	row := ""
	for _, line := range strings.Split(table, "\n") {
		if strings.Contains(line, e.far.addr) {
			row = line
		}
	}
	if !strings.Contains(row, fmt.Sprint(id)) || !strings.Contains(row, "established") || !strings.Contains(row, "a1") {
		t.Fatalf("konnectivity-server tunnels: no row for connection %d to %s:\n%s", id, e.far.addr, table)
	}
	t.Logf("konnectivity-server tunnels:\n%s", table)

	// Close it from the admin port: the client's read ends, the agent closes the far end.
	url := fmt.Sprintf("http://127.0.0.1:%d/tunnels/%d/close", e.adminPort, id)
	resp, err := http.Post(url, "text/plain", nil)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d, want 200", url, resp.StatusCode)
	}
	readDone := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, conn)
		readDone <- err
	}()
	select {
	case <-readDone:
	case <-time.After(20 * time.Second):
		t.Fatalf("the client's read did not end within 20 s of the close")
	}
	eventually(t, 20*time.Second, "/tunnels empty after the close", func() (bool, string) {
		list := e.tunnels(t, "")
		return len(list) == 0, fmt.Sprintf("%+v", list)
	})
}
