//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestStreaming runs streamed answers and WebSocket upgrades through the
// default data path, over a split with a shadow, with replicas on two nodes
// so that some cross the inbound hop: every token reaches the client as it
// is made (the first long before the last), in order, as lines and as
// server-sent events; an upgraded connection echoes both ways.
func TestStreaming(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "streaming")
	n1 := mesh.n1
	for name, replicas := range map[string]int{"gen-a": 2, "gen-b": 1, "gen-shadow": 1} {
		mesh.createBackends(t, meshspec.Backend{Name: name, Config: meshspec.BackendConfig{NumReplicas: replicas, CPUs: 1}, Process: demoProcess(name, false)})
	}
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "gen", Route: "/gen", Traffic: map[string]float64{"gen-a": 0.5, "gen-b": 0.5},
		Shadows: map[string]float64{"gen-shadow": 0.5}}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + n1.public + "/gen"
	waitReplicasAnswer(t, "every replica of the split to answer through n1", url, 3, 30)

	const tokens, every = 10, 200 * time.Millisecond
	t.Run("tokens arrive as they are made, lines and server-sent events", func(t *testing.T) {
		replicas := map[string]bool{}
		for i := range 6 {
			sse := i%2 == 1
			replica, first, last, got := streamTokens(t, fmt.Sprintf("%s?tokens=%d&every_ms=%d", url, tokens, every.Milliseconds()), sse)
			replicas[replica] = true
			if len(got) != tokens {
				t.Fatalf("request %d (sse %v): %d tokens, want %d: %q", i, sse, len(got), tokens, got)
			}
			for j, tok := range got {
				if tok != fmt.Sprintf("token %d", j) {
					t.Fatalf("request %d: token %d is %q: out of order", i, j, tok)
				}
			}
			// The replica spends (tokens-1)*every making them: the first must
			// arrive long before the last, not all at the end.
			if first > time.Second || last-first < (tokens-3)*every {
				t.Errorf("request %d (sse %v): first token after %s, last %s later; want the first within 1 s and the rest spread over about %s",
					i, sse, first, last-first, (tokens-1)*every)
			}
		}
		// The split is random: six streams all went to one replica in about
		// one run of 64. Short streams until a second replica answers.
		for i := 0; len(replicas) < 2 && i < 40; i++ {
			replica, _, _, got := streamTokens(t, url+"?tokens=3&every_ms=20", i%2 == 1)
			if len(got) != 3 {
				t.Fatalf("short stream %d: %q, want 3 tokens", i, got)
			}
			replicas[replica] = true
		}
		if len(replicas) < 2 {
			t.Errorf("the streams reached %v; want replicas on both nodes", replicas)
		}
	})
	t.Run("a mirrored copy is marked for its replica and its node's log; clients cannot forge the mark", func(t *testing.T) {
		nodes := []*mtlsNode{mesh.n1, mesh.n2}
		for i := range 40 {
			req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+nodes[i%2].public+"/gen", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(wire.ShadowHeader, "forged")
			var r demoreplica.Response
			if err := doJSON(req, &r); err != nil {
				t.Fatal(err)
			}
			if r.Shadow != "" {
				t.Fatalf("replica %s of %s was told the request is a shadow of %q: a client's mark reached it", r.Replica, r.Backend, r.Shadow)
			}
		}
		// Half the requests mirror a copy to gen-shadow; those entering the
		// node without its replica cross that node's inbound listener.
		copies := func(n *mtlsNode, backend, shadow string) int {
			count := 0
			for _, e := range accessLog(t, n) {
				if e["listener"] == "inbound" && e["backend"] == wire.InboundClusterName(backend) && fmt.Sprint(e["shadow"]) == shadow {
					count++
				}
			}
			return count
		}
		testutil.WaitFor(t, 10*time.Second, "the node of gen-shadow's replica to log copies marked as shadows of gen", func() bool {
			return copies(mesh.n1, "gen-shadow", "gen")+copies(mesh.n2, "gen-shadow", "gen") > 0
		})
		if n := copies(mesh.n1, "gen-a", "gen") + copies(mesh.n2, "gen-a", "gen"); n > 0 {
			t.Errorf("%d requests to gen-a (the split, not a shadow) were logged as shadows", n)
		}
	})
	t.Run("a WebSocket upgrade passes through both ways", func(t *testing.T) {
		replicas := map[string]bool{}
		for i := 0; i < 8 || (len(replicas) < 2 && i < 40); i++ { // the split is random: on until two replicas echoed
			replicas[echoThroughUpgrade(t, n1.public, fmt.Sprintf("hello %d", i))] = true
		}
		if len(replicas) < 2 {
			t.Errorf("the upgrades reached %v; want replicas on both nodes", replicas)
		}
	})
}

// streamTokens reads a streamed answer token by token and returns the
// replica that answered, when the first and the last token arrived (from the
// request's start), and the tokens.
func streamTokens(t *testing.T, url string, sse bool) (string, time.Duration, time.Duration, []string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sse {
		req.Header.Set("Accept", "text/event-stream")
	}
	start := time.Now()
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != 200 || (sse && resp.Header.Get("Content-Type") != "text/event-stream") {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var got []string
	var first, last time.Duration
	_ = scanTokens(resp.Body, sse, func(token string) {
		last = time.Since(start)
		if len(got) == 0 {
			first = last
		}
		got = append(got, token)
	})
	return resp.Header.Get(demoreplica.ReplicaHeader), first, last, got
}

// scanTokens calls each with every token of a streamed answer as it
// comes: its lines, or its server-sent events' data if sse; it returns
// the error that ended the reading, if any.
func scanTokens(body io.Reader, sse bool, each func(token string)) error {
	lines := bufio.NewScanner(body)
	for lines.Scan() {
		line := lines.Text()
		if sse {
			var ok bool
			if line, ok = strings.CutPrefix(line, "data: "); !ok {
				continue // the blank line between events
			}
		}
		each(line)
	}
	return lines.Err()
}

// echoThroughUpgrade upgrades a connection to the endpoint through the
// node's public listener, sends msg and reads it back; it returns the
// replica that answered.
func echoThroughUpgrade(t *testing.T, public, msg string) string {
	t.Helper()
	conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(context.Background(), "tcp", public)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /gen HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", public)
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		t.Fatalf("upgrade: %d %s", resp.StatusCode, body)
	}
	if _, err := io.WriteString(conn, msg); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(msg))
	if _, err := io.ReadFull(r, back); err != nil || string(back) != msg {
		t.Fatalf("echo through the upgraded connection: %q, %v; want %q", back, err, msg)
	}
	return resp.Header.Get(demoreplica.ReplicaHeader)
}
