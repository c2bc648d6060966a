package autoscale

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestPollKeepsOnlyKnownBackendsAndBoundsAnswers: an agent's answer is read
// up to wire.MaxLoadBytes, and backend names the state does not have make
// no metric series (an agent could report any number of names).
func TestPollKeepsOnlyKnownBackendsAndBoundsAnswers(t *testing.T) {
	huge := false
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if huge {
			_, _ = io.WriteString(w, `{"backends": {"b": {"active": 1}}, "padding": "`+strings.Repeat("x", wire.MaxLoadBytes)+`"}`)
			return
		}
		l := wire.Load{Node: "n1", At: time.Now(), Backends: map[string]wire.BackendLoad{"b": {Active: 3, Pending: 1}}}
		for i := range 100 {
			l.Backends["made-up-"+string(rune('a'+i%26))+strings.Repeat("z", i)] = wire.BackendLoad{Active: 1}
		}
		_ = json.NewEncoder(w).Encode(l)
	}))
	defer agent.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctl := controller.New(controller.Options{Logger: log, Store: store.NewMemory(), Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
	nodes := func(context.Context) ([]wire.NodeInfo, error) {
		return []wire.NodeInfo{{ID: "n1", StatusAddr: strings.TrimPrefix(agent.URL, "http://")}}, nil
	}
	reg := prometheus.NewRegistry()
	a := New(ctl, nodes, log, reg)
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "b"}}}
	a.poll(context.Background(), m)
	if got := a.Load()["b"].InFlight; got != 4 {
		t.Fatalf("in flight for b: %v, want 4", got)
	}
	if n := promtest.CollectAndCount(a.inFlight); n != 1 {
		t.Fatalf("%d in-flight series; want one, for the one backend the state has", n)
	}
	huge = true
	a.poll(context.Background(), m) // an oversized answer is refused, not read whole
	if _, ok := a.Load()["b"]; ok {
		t.Fatal("an answer over the size limit was used")
	}
}

// TestANodeSpeaksOnlyForItsReplicas: a node's load report named the
// user_config versions of any replica, and status showed them (issue 34):
// a compromised node could say another node's replica runs a config it
// does not. Now a node's versions count only for the replicas placed on it.
func TestANodeSpeaksOnlyForItsReplicas(t *testing.T) {
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(wire.Load{Node: "n1", At: time.Now(), Configs: map[string]string{"b#000001": "v1", "b#000002": "forged"}})
	}))
	defer agent.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctl := controller.New(controller.Options{Logger: log, Store: store.NewMemory(), Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
	nodes := func(context.Context) ([]wire.NodeInfo, error) {
		return []wire.NodeInfo{{ID: "n1", StatusAddr: strings.TrimPrefix(agent.URL, "http://")}}, nil
	}
	a := New(ctl, nodes, log, prometheus.NewRegistry())
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "b", Placements: []meshspec.Placement{
		{Tag: "b#000001", Node: "n1", State: meshspec.Running}, {Tag: "b#000002", Node: "n2", State: meshspec.Running}}}}}
	a.poll(context.Background(), m)
	if got := a.ConfigVersions(); len(got) != 1 || got["b#000001"] != "v1" {
		t.Fatalf("config versions %v; want only n1's own replica's", got)
	}
}

// TestPollAsksTheAgentsAsTold: the load is read the way Agents asks (the
// daemon's mTLS, or a token); an agent that refuses it is not read.
func TestPollAsksTheAgentsAsTold(t *testing.T) {
	agent := httptest.NewServer(httpserver.RequireBearer("agent-token", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(wire.Load{Node: "n1", At: time.Now(), Backends: map[string]wire.BackendLoad{"b": {Active: 2}}})
	})))
	defer agent.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctl := controller.New(controller.Options{Logger: log, Store: store.NewMemory(), Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
	nodes := func(context.Context) ([]wire.NodeInfo, error) {
		return []wire.NodeInfo{{ID: "n1", StatusAddr: strings.TrimPrefix(agent.URL, "http://")}}, nil
	}
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "b"}}}
	a := New(ctl, nodes, log, nil)
	a.poll(context.Background(), m)
	if _, ok := a.Load()["b"]; ok {
		t.Fatal("an agent asking for a token answered without one")
	}
	a.Agents = func(ctx context.Context, n wire.NodeInfo, path string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.StatusAddr+path, nil)
		req.Header.Set("Authorization", "Bearer agent-token")
		return http.DefaultClient.Do(req)
	}
	a.poll(context.Background(), m)
	if got := a.Load()["b"].InFlight; got != 2 {
		t.Fatalf("in flight %v with the token, want 2", got)
	}
}

// TestRatesOverTheWindow: a steady load whose counts arrive unevenly from
// one poll to the next reads steady, as it is averaged over RateWindow (the
// rate over the last poll interval jumped between 6 and 34 here).
func TestRatesOverTheWindow(t *testing.T) {
	a := &Autoscaler{history: map[string][]wire.Load{}}
	start := time.Unix(1_800_000_000, 0)
	var requests uint64
	var rates []float64
	for i := range 60 { // 30 s, a poll every 0.5 s
		requests += []uint64{3, 17}[i%2]
		l := wire.Load{At: start.Add(time.Duration(i) * 500 * time.Millisecond), Backends: map[string]wire.BackendLoad{"b": {Requests: requests}}}
		if base := a.remember("n1", l); base != nil && l.At.Sub(start) >= RateWindow {
			var t BackendLoad
			addRates(&t, l.Backends["b"], base.Backends["b"], l.At.Sub(base.At))
			rates = append(rates, t.RequestRate)
		}
	}
	for _, r := range rates {
		if r < 19 || r > 21 {
			t.Fatalf("rates over the window %v; want each within 20±1 req/s", rates)
		}
	}
	if n := len(a.history["n1"]); n > int(RateWindow/(500*time.Millisecond))+2 {
		t.Fatalf("the history keeps %d samples; want only the window's", n)
	}
}

// TestPollSaysWhichNodesItCouldNotRead: a node whose load cannot be read
// is named with why (status marks the rates that leave it out), and is
// forgotten once read again.
func TestPollSaysWhichNodesItCouldNotRead(t *testing.T) {
	down := true
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if down {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(wire.Load{Node: "n2", At: time.Now(), Backends: map[string]wire.BackendLoad{"b": {Active: 1}}})
	}))
	defer agent.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctl := controller.New(controller.Options{Logger: log, Store: store.NewMemory(), Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
	nodes := func(context.Context) ([]wire.NodeInfo, error) {
		return []wire.NodeInfo{{ID: "n1"}, {ID: "n2", StatusAddr: strings.TrimPrefix(agent.URL, "http://")}}, nil
	}
	a := New(ctl, nodes, log, nil)
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "b"}}}
	a.poll(context.Background(), m)
	unread := a.Unread()
	if len(unread) != 2 || unread["n1"] != "its agent names no status address" || !strings.Contains(unread["n2"], "status 503") {
		t.Fatalf("unread nodes: %q", unread)
	}
	down = false
	a.poll(context.Background(), m)
	if unread := a.Unread(); len(unread) != 1 || unread["n2"] != "" {
		t.Fatalf("unread nodes once n2 answers: %q", unread)
	}
}
