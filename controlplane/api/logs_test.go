package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestLogs: a backend's logs are read from the agent of each replica's
// node, one replica's from an offset; a node that does not answer leaves
// the others' logs and says why; logs need the exec scope, as status's
// log lines do (issue 58, M3: a write token read them here); a backend
// servemesh does not run has none to give.
func TestLogs(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	nodes := func(context.Context) ([]wire.NodeInfo, error) {
		return []wire.NodeInfo{{ID: "n1", CPUs: 1, MemoryMB: 1024, AllowedCommands: []string{"/srv/model"}}}, nil
	}
	c := controller.New(controller.Options{Logger: log, Store: store.NewMemory(), Nodes: nodes, Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
	if err := c.Lead(context.Background(), "self"); err != nil {
		t.Fatal(err)
	}
	ctx := controller.MayRunCommands(context.Background())
	spec := meshspec.BackendSpec{Name: "m", Process: &meshspec.ProcessSpec{Command: "/srv/model"}, Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.1}}
	if _, err := c.CreateBackend(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(meshspec.Backend{Name: "static", Replicas: []meshspec.Replica{{Address: "10.0.0.1:9001"}}})); err != nil {
		t.Fatal(err)
	}
	b, _ := c.GetBackend("m")
	first := b.Placements[0].Tag
	var asked []url.Values
	read := func(node string, q url.Values) (LogChunk, error) {
		asked = append(asked, q)
		if q.Get("envoy") == "true" {
			return LogChunk{Text: "envoy of " + node + "\n", Offset: 7}, nil
		}
		if q.Get("replica") != first {
			return LogChunk{}, errors.New("connection refused")
		}
		return LogChunk{Text: "hello from " + q.Get("replica") + "\n", Offset: 42}, nil
	}
	logs := func(_ context.Context, reads []LogRead) []LogChunk { // as the controller's agentLogs answers
		out := make([]LogChunk, len(reads))
		for i, r := range reads {
			c, err := read(r.Node, r.Query)
			if err != nil {
				c.Error = err.Error()
			}
			c.Node, c.Replica = r.Node, r.Replica
			out[i] = c
		}
		return out
	}
	tokens := Tokens{"x": ScopeExec, "w": ScopeWrite, "r": ScopeRead}
	srv := httptest.NewServer(newConformance(t).wrap(tokens.Authenticate(Handler(c, log, Sources{Logs: logs}))))
	defer srv.Close()
	get := func(path, token string) (int, LogsReport, string) {
		t.Helper()
		status, body := raw(t, "GET", srv.URL+path, "", token)
		var r LogsReport
		_ = json.Unmarshal([]byte(body), &r)
		return status, r, body
	}
	status, r, body := get("/v1/backends/m/logs?tail=5", "x")
	if status != 200 || len(r.Logs) != 2 {
		t.Fatalf("backend logs: %d %s", status, body)
	}
	for _, l := range r.Logs {
		ok := l.Replica == first && l.Text == "hello from "+first+"\n" && l.Offset == 42 && l.Node == "n1"
		failed := l.Replica != first && strings.Contains(l.Error, "connection refused") && l.Node == "n1"
		if !ok && !failed {
			t.Errorf("a replica's log: %+v", l)
		}
	}
	if asked[0].Get("tail") != "5" {
		t.Errorf("the agent was asked %v", asked[0])
	}
	if status, r, body = get("/v1/backends/m/logs?replica="+url.QueryEscape(first)+"&offset=40", "x"); status != 200 || len(r.Logs) != 1 || asked[len(asked)-1].Get("offset") != "40" {
		t.Errorf("one replica from an offset: %d %s (asked %v)", status, body, asked[len(asked)-1])
	}
	for _, c := range []struct {
		path, token, want string
		status            int
	}{
		{"/v1/backends/m/logs", "r", "needs a token of the exec scope", 403},
		{"/v1/backends/m/logs", "w", "needs a token of the exec scope", 403},
		{"/v1/nodes/n1/logs", "w", "needs a token of the exec scope", 403},
		{"/v1/backends/m/logs?offset=3", "x", "give it with replica=TAG", 400},
		{"/v1/backends/m/logs?replica=m%23000000", "x", `replica "m#000000" is not one of backend m's; its replicas: [`, 404},
		{"/v1/backends/static/logs", "x", "not run by servemesh", 400},
		{"/v1/backends/ghost/logs", "x", `backend "ghost" is not registered`, 404},
	} {
		if status, _, body := get(c.path, c.token); status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("GET %s: %d %s; want %d mentioning %q", c.path, status, body, c.status, c.want)
		}
	}
	if status, r, body := get("/v1/nodes/n1/logs?tail=3", "x"); status != 200 || len(r.Logs) != 1 || r.Logs[0].Text != "envoy of n1\n" {
		t.Errorf("node logs: %d %s", status, body)
	}
}
