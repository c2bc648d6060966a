package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	xdsserver "github.com/servemesh/servemesh/xds/server"
)

func processBackend(name string, replicas int) meshspec.Backend {
	b := meshspec.Backend{Name: name, Process: &meshspec.ProcessSpec{Command: "/bin/model"}, Config: meshspec.BackendConfig{NumReplicas: replicas}}
	for i := range replicas {
		b.Placements = append(b.Placements, meshspec.Placement{Tag: name + "#" + string(rune('a'+i)), Node: "n1", State: meshspec.Running})
	}
	return b
}

func TestServedReport(t *testing.T) {
	ready := func(n int) func(meshspec.Backend) ReplicaHealth {
		return func(meshspec.Backend) ReplicaHealth { return ReplicaHealth{Ready: n} }
	}
	a := processBackend("a", 2)
	listed := meshspec.Backend{Name: "listed", Replicas: []meshspec.Replica{{Address: "10.0.0.9:80"}}}
	serving := func(rev uint64, healthy int, waiting ...string) xdsserver.Serving {
		return xdsserver.Serving{Revision: rev, Nodes: 2, Healthy: map[string]int{"a": healthy}, Waiting: waiting}
	}
	configured := processBackend("a", 2)
	if err := configured.Config.UserConfig.UnmarshalJSON([]byte(`{"threshold": 0.7}`)); err != nil {
		t.Fatal(err)
	}
	// Endpoints whose limits the nodes' rate limit services count, and
	// one that has none.
	limited := meshspec.Endpoint{Name: "chat", RateLimit: &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: 50, Header: "x-tenant-id"}}}
	older := meshspec.Endpoint{Name: "chat", RateLimit: &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: 100, Header: "x-tenant-id"}}}
	unlimited := meshspec.Endpoint{Name: "free", RateLimit: &meshspec.RateLimit{Local: &meshspec.LocalRateLimit{RequestsPerSecond: 5}}}
	twoReplicas := func(meshspec.Backend) ReplicaHealth {
		return ReplicaHealth{Ready: 2, Replicas: []ReplicaStatus{{Tag: "a#a", State: meshspec.Running, Ready: true}, {Tag: "a#b", State: meshspec.Running, Ready: true}}}
	}
	for _, tc := range []struct {
		name    string
		in      ServedInputs
		served  bool
		waiting []string
		failed  string
	}{
		{"served", ServedInputs{Revision: 7, Backends: []meshspec.Backend{a, listed}, Serving: serving(8, 2), Health: ready(2)}, true, nil, ""},
		{"an older data plane", ServedInputs{Revision: 9, Serving: serving(8, 2), Health: ready(2)}, false,
			[]string{"the data plane serves revision 8; the change is revision 9"}, ""},
		{"replicas starting", ServedInputs{Revision: 7, Backends: []meshspec.Backend{a}, Serving: serving(7, 1), Health: ready(1)}, false,
			[]string{"backend a: 1 of 2 replicas ready (2 placed)"}, ""},
		{"ready, not yet in the data plane", ServedInputs{Revision: 7, Backends: []meshspec.Backend{a}, Serving: serving(7, 1), Health: ready(2)}, false,
			[]string{"backend a: the data plane calls 1 of its 2 ready replicas so far"}, ""},
		{"a node behind", ServedInputs{Revision: 7, Backends: []meshspec.Backend{a}, Serving: serving(7, 2, "node n2: has not accepted generation 4 yet (it holds 3)"), Health: ready(2)}, false,
			[]string{"node n2: has not accepted generation 4 yet (it holds 3)"}, ""},
		{"no node", ServedInputs{Revision: 7, Serving: xdsserver.Serving{Revision: 7}, Health: ready(0)}, false,
			[]string{"no node is connected to the controller, so none serves the mesh: start an agent (servemesh node)"}, ""},
		{"cannot be placed", ServedInputs{Revision: 7, Backends: []meshspec.Backend{a}, Serving: serving(7, 0), Health: ready(0),
			Problems: []string{PlacementProblemPrefix("a") + "no node has 64 CPUs free"}}, false, nil, `backend "a" cannot be ready: placing a's replicas: no node has 64 CPUs free`},
		{"crash-looping", ServedInputs{Revision: 7, Backends: []meshspec.Backend{a}, Serving: serving(7, 0), Health: func(meshspec.Backend) ReplicaHealth {
			return ReplicaHealth{Replicas: []ReplicaStatus{{Tag: "a#a", Node: "n1", State: meshspec.Running, Note: wire.ExitedNote + " 3 times; its log ends: boom"}}}
		}}, false, nil, `backend "a" cannot be ready: its replica a#a on node n1 is crash-looping`},
		{"user_config not taken", ServedInputs{Revision: 7, Backends: []meshspec.Backend{configured}, Serving: serving(7, 2), Health: twoReplicas,
			Configs: map[string]string{"a#a": configured.Config.UserConfig.Version(), "a#b": "0ld"}}, false,
			[]string{"backend a: 1 of its replicas have not taken its user_config " + configured.Config.UserConfig.Version() + " yet"}, ""},
		{"user_config taken", ServedInputs{Revision: 7, Backends: []meshspec.Backend{configured}, Serving: serving(7, 2), Health: twoReplicas,
			Configs: map[string]string{"a#a": configured.Config.UserConfig.Version(), "a#b": configured.Config.UserConfig.Version()}}, true, nil, ""},
		{"a node's rate limit service behind", ServedInputs{Revision: 7, Serving: serving(7, 2), Health: ready(0), Endpoints: []meshspec.Endpoint{limited, unlimited},
			Loads: map[string]wire.Load{"n1": {RateLimitsLoaded: map[string]string{"chat": limited.CountedLimits()}}, "n2": {RateLimitsLoaded: map[string]string{"chat": older.CountedLimits()}},
				"n3": {RateLimitsLoaded: map[string]string{}, RateLimitService: "rate limit service not running"}, "old-agent": {}}}, false,
			[]string{"node n2: its rate limit service does not count endpoint chat's limits yet",
				"node n3: its rate limit service does not count endpoint chat's limits yet (rate limit service not running)"}, ""},
		{"every node's rate limit service counts the limits", ServedInputs{Revision: 7, Serving: serving(7, 2), Health: ready(0), Endpoints: []meshspec.Endpoint{limited, unlimited},
			Loads: map[string]wire.Load{"n1": {RateLimitsLoaded: map[string]string{"chat": limited.CountedLimits()}}, "old-agent": {}}}, true, nil, ""},
		{"refused", ServedInputs{Revision: 7, Serving: serving(6, 0), Health: ready(0), Refused: errors.New("the data plane refused the view")}, false, nil,
			"the data plane refused the view"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NewServedReport(tc.in)
			if got.Served != tc.served || !strings.HasPrefix(got.Failed, tc.failed) || (tc.failed == "") != (got.Failed == "") {
				t.Fatalf("%+v; want served %t, failed %q", got, tc.served, tc.failed)
			}
			if tc.failed == "" && !slices.Equal(got.Waiting, append([]string{}, tc.waiting...)) {
				t.Errorf("waiting %q; want %q", got.Waiting, tc.waiting)
			}
		})
	}
}

// TestWritesAnswerTheirRevision: every write answers the stored revision
// after it, and GET /v1/served is asked about it, with the backends an
// endpoint sends to; WaitServed returns once it is served, and fails at
// once when it will not be.
func TestWritesAnswerTheirRevision(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := store.NewMemory()
	c := controller.New(controller.Options{Logger: log, Store: st, Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }})
	if err := c.Lead(context.Background(), "self"); err != nil {
		t.Fatal(err)
	}
	type asked struct {
		rev      uint64
		backends []string
	}
	var mu sync.Mutex
	var last asked
	var servedFrom atomic.Uint64 // the data plane's revision
	srv := httptest.NewServer(newConformance(t).wrap(Handler(c, log, Sources{Served: func(rev uint64, bs []meshspec.Backend) ServedReport {
		mu.Lock()
		last = asked{rev: rev}
		for _, b := range bs {
			last.backends = append(last.backends, b.Name)
		}
		mu.Unlock()
		return NewServedReport(ServedInputs{Revision: rev, Backends: bs, Health: func(meshspec.Backend) ReplicaHealth { return ReplicaHealth{} },
			Serving: xdsserver.Serving{Revision: servedFrom.Load(), Nodes: 1}})
	}})))
	t.Cleanup(srv.Close)
	client := NewClient(srv.URL, "")
	ctx := context.Background()
	var out Changed
	if err := client.do(ctx, "POST", "/v1/backends", meshspec.BackendSpec{Name: "v1", Replicas: []meshspec.ReplicaSpec{{Address: "10.0.0.1:80"}}}, &out); err != nil {
		t.Fatal(err)
	}
	if out.Revision == 0 || out.Revision != uint64(c.Revision()) {
		t.Fatalf("create backend answered revision %d; want the state's, %d", out.Revision, c.Revision())
	}
	if err := client.do(ctx, "POST", "/v1/endpoints", meshspec.Endpoint{Name: "api", Route: "/api", Traffic: map[string]float64{"v1": 1}}, &out); err != nil {
		t.Fatal(err)
	}
	rev := out.Revision
	servedFrom.Store(rev - 1)
	report, err := client.Served(ctx, ServedQuery{Revision: rev, Endpoints: []string{"api"}})
	mu.Lock()
	asking := last
	mu.Unlock()
	if err != nil || report.Served || !slices.Equal(asking.backends, []string{"v1"}) || asking.rev != rev {
		t.Fatalf("asked about api at %d: %+v, %v, the sources asked %+v; want not served, api's backend v1 asked about", rev, report, err, asking)
	}
	done := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		done <- client.WaitServed(wctx, ServedQuery{Revision: rev, Endpoints: []string{"api"}}, nil)
	}()
	time.Sleep(3 * ServedPoll)
	select {
	case err := <-done:
		t.Fatalf("WaitServed returned %v before the data plane served the change", err)
	default:
	}
	servedFrom.Store(rev)
	if err := <-done; err != nil {
		t.Fatalf("WaitServed once served: %v", err)
	}
	if _, err := client.Served(ctx, ServedQuery{Revision: rev, Endpoints: []string{"nope"}}); err == nil || !strings.Contains(err.Error(), `no endpoint "nope"`) {
		t.Errorf("an unknown endpoint: %v; want it named", err)
	}
	// No revision named: the current one, not any.
	servedFrom.Store(rev - 1)
	if report, err := client.Served(ctx, ServedQuery{}); err != nil || report.Served {
		t.Errorf("asked with no revision while the data plane is a revision behind: %+v, %v; want not served", report, err)
	}
	servedFrom.Store(rev)
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := client.WaitServed(wctx, ServedQuery{Revision: rev + 5}, nil); err == nil || !strings.Contains(err.Error(), "the data plane serves revision") {
		t.Errorf("a revision never served, at the deadline: %v; want what is waited for", err)
	}
	// A revision that is not one is a 400 the description names (the
	// conformance wrapper fails the test on an undescribed status).
	for _, bad := range []string{"false", "-1", "1.5", "99999999999999999999"} {
		if code, body := raw(t, "GET", srv.URL+ServedPath+"?revision="+bad, "", ""); code != http.StatusBadRequest || !strings.Contains(body, "revision") {
			t.Errorf("revision=%s: %d %s; want 400 naming the revision", bad, code, body)
		}
	}
}
