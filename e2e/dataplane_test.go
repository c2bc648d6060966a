//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// fixture is a control plane serving a config file to one real Envoy, with
// demo replicas for backends a, b, c (and more on request).
type fixture struct {
	t        *testing.T
	config   string
	replicas map[string]*replicaSet
	cp       *controlPlane
	envoy    *node
	gen      uint64
}

func newFixture(t *testing.T, protocol bootstrap.Protocol, m func(f *fixture) *meshspec.Model, backends ...string) *fixture {
	t.Helper()
	f := &fixture{t: t, config: filepath.Join(t.TempDir(), "mesh.yaml"), replicas: map[string]*replicaSet{}}
	for i, b := range backends {
		f.replicas[b] = startReplicas(t, b, 1+i%2) // some backends get two replicas
	}
	writeModel(t, f.config, m(f))
	f.gen = 1
	f.cp = startControlPlane(t, f.config)
	f.envoy = startEnvoy(t, "node-"+strings.ToLower(t.Name()), f.cp.xdsAddr, protocol)
	f.cp.waitInSync(f.gen)
	return f
}

func (f *fixture) backends(names ...string) []meshspec.Backend {
	var out []meshspec.Backend
	for _, n := range names {
		out = append(out, f.replicas[n].backendModel())
	}
	return out
}

// apply writes a new model and waits until the node ACKed it.
func (f *fixture) apply(m *meshspec.Model) {
	f.t.Helper()
	writeModel(f.t, f.config, m)
	f.gen++
	f.cp.waitInSync(f.gen)
}

func (f *fixture) url(path string) string { return "http://" + f.envoy.public + path }

func TestWeightedSplit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, bootstrap.ProtocolSotW, func(f *fixture) *meshspec.Model {
		return &meshspec.Model{
			Backends:  f.backends("a", "b", "c"),
			Endpoints: []meshspec.Endpoint{{Name: "split", Route: "/split", Traffic: map[string]float64{"a": 0.7, "b": 0.3}}},
		}
	}, "a", "b", "c")
	const n = 4000
	counts := sendMany(t, f.url("/split"), n)
	checkShare(t, "a (weight 0.7)", counts["a"], n, 0.7)
	checkShare(t, "b (weight 0.3)", counts["b"], n, 0.3)
	if counts["c"] != 0 {
		t.Errorf("c has no weight but served %d", counts["c"])
	}

	// Envoy holds exactly the integer weights servemesh computed.
	dump, err := f.envoy.proc.Admin().ConfigDump(context.Background(), "dynamic_route_configs")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dump), `"weight": 700000`) || !strings.Contains(string(dump), `"weight": 300000`) {
		t.Errorf("route config in Envoy lacks weights 700000/300000:\n%.2000s", dump)
	}

	t.Run("three-way", func(t *testing.T) {
		f.apply(&meshspec.Model{
			Backends:  f.backends("a", "b", "c"),
			Endpoints: []meshspec.Endpoint{{Name: "split", Route: "/split", Traffic: map[string]float64{"a": 0.5, "b": 0.3, "c": 0.2}}},
		})
		counts := sendMany(t, f.url("/split"), n)
		checkShare(t, "a (weight 0.5)", counts["a"], n, 0.5)
		checkShare(t, "b (weight 0.3)", counts["b"], n, 0.3)
		checkShare(t, "c (weight 0.2)", counts["c"], n, 0.2)
	})
}

func TestShadowTraffic(t *testing.T) {
	t.Parallel()
	f := newFixture(t, bootstrap.ProtocolSotW, func(f *fixture) *meshspec.Model {
		return &meshspec.Model{
			Backends: f.backends("primary", "canary", "shadow", "shadow2"),
			Endpoints: []meshspec.Endpoint{{
				Name: "predict", Route: "/predict",
				Traffic: map[string]float64{"primary": 0.8, "canary": 0.2},
				Shadows: map[string]float64{"shadow": 0.25, "shadow2": 0.1},
			}},
		}
	}, "primary", "canary", "shadow", "shadow2")
	const n = 4000
	counts := sendMany(t, f.url("/predict"), n)
	for backend := range counts {
		if backend != "primary" && backend != "canary" {
			t.Errorf("a client saw a response from %q; mirrored responses must be discarded", backend)
		}
	}
	checkShare(t, "primary (weight 0.8)", counts["primary"], n, 0.8)
	// Mirrors are sent asynchronously: wait for the counts to settle.
	settle := func(rs *replicaSet) int {
		last := int64(-1)
		for cur := rs.served(); cur != last; cur = rs.served() {
			last = cur
			time.Sleep(300 * time.Millisecond)
		}
		return int(last)
	}
	checkShare(t, "shadow (proportion 0.25)", settle(f.replicas["shadow"]), n, 0.25)
	checkShare(t, "shadow2 (proportion 0.1)", settle(f.replicas["shadow2"]), n, 0.1)
}

func TestConfigChangeIsServed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, bootstrap.ProtocolSotW, func(f *fixture) *meshspec.Model {
		return &meshspec.Model{
			Backends:  f.backends("old", "new"),
			Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"old": 1}}},
		}
	}, "old", "new")
	client := &http.Client{Timeout: 5 * time.Second}
	if r := do(client, http.MethodGet, f.url("/svc"), ""); r.backend != "old" {
		t.Fatalf("before the change: %+v, want old", r)
	}
	start := time.Now()
	writeModel(t, f.config, &meshspec.Model{
		Backends:  f.backends("old", "new"),
		Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"new": 1}}},
	})
	// From the save until every response comes from the new backend.
	var served time.Duration
	testutil.WaitFor(t, 15*time.Second, "the new backend to serve", func() bool {
		r := do(client, http.MethodGet, f.url("/svc"), "")
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("a request failed during the change: %+v", r)
		}
		if r.backend != "new" {
			return false
		}
		served = time.Since(start)
		return true
	})
	t.Logf("config file saved -> new split served by Envoy in %s (the file is polled every 250ms)", served.Round(time.Millisecond))
	counts := sendMany(t, f.url("/svc"), 200)
	if counts["new"] != 200 {
		t.Fatalf("after the change: %v, want all 200 from new", counts)
	}
}

func TestHeadlessEndpointAndMethods(t *testing.T) {
	t.Parallel()
	f := newFixture(t, bootstrap.ProtocolSotW, func(f *fixture) *meshspec.Model {
		return &meshspec.Model{
			Backends: f.backends("web", "embedder"),
			Endpoints: []meshspec.Endpoint{
				{Name: "site", Route: "/site", Methods: []string{"GET", "POST"}, Traffic: map[string]float64{"web": 1}},
				{Name: "embeddings", Traffic: map[string]float64{"embedder": 1}},
			},
		}
	}, "web", "embedder")
	client := &http.Client{Timeout: 5 * time.Second}
	mesh := "http://" + f.envoy.mesh
	for _, tc := range []struct {
		name, method, url, host string
		status                  int
		backend, allow          string
	}{
		{"routed GET", "GET", f.url("/site"), "", 200, "web", ""},
		{"routed sub-path", "POST", f.url("/site/page"), "", 200, "web", ""},
		{"not a sub-path", "GET", f.url("/sitemap"), "", 404, "", ""},
		{"wrong method", "DELETE", f.url("/site"), "", 405, "", "GET, POST"},
		{"headless is not public", "GET", f.url("/embeddings"), "", 404, "", ""},
		{"headless by Host on the mesh listener", "GET", mesh + "/v1/embed", "embeddings", 200, "embedder", ""},
		{"Host with port on the mesh listener", "GET", mesh + "/", "embeddings:80", 200, "embedder", ""},
		{"routed endpoint by Host on the mesh listener", "POST", mesh + "/", "site", 200, "web", ""},
		{"wrong method on the mesh listener", "PUT", mesh + "/", "embeddings", 405, "", "GET"},
		{"unknown Host on the mesh listener", "GET", mesh + "/", "nothing", 404, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(client, tc.method, tc.url, tc.host)
			if r.err != nil || r.status != tc.status || r.backend != tc.backend || r.allow != tc.allow {
				t.Fatalf("%s %s (Host %q): got %+v, want status %d backend %q allow %q", tc.method, tc.url, tc.host, r, tc.status, tc.backend, tc.allow)
			}
		})
	}
}

func TestControlPlaneKilledEnvoyKeepsServing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, bootstrap.ProtocolSotW, func(f *fixture) *meshspec.Model {
		return &meshspec.Model{
			Backends:  f.backends("a", "b"),
			Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"a": 0.5, "b": 0.5}}},
		}
	}, "a", "b")
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 5 * time.Second}
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := do(client, http.MethodGet, f.url("/svc"), "")
				sent.Add(1)
				if r.err != nil || r.status != http.StatusOK {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, r)
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	f.cp.kill()
	killedAt := sent.Load()
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	after := sent.Load() - killedAt
	t.Logf("%d requests in total, %d after the control plane was killed, %d failed", sent.Load(), after, failed.Load())
	if after < 100 {
		t.Fatalf("only %d requests after the kill; the load did not run", after)
	}
	if failed.Load() != 0 {
		t.Fatalf("%d requests failed, first: %+v", failed.Load(), firstErr.Load())
	}

	// A restarted control plane is picked up again by the same Envoy.
	f.cp.start()
	f.cp.waitInSync(1)
}

func TestInvalidConfigKeepsLastGood(t *testing.T) {
	t.Parallel()
	f := newFixture(t, bootstrap.ProtocolSotW, func(f *fixture) *meshspec.Model {
		return &meshspec.Model{
			Backends:  f.backends("a", "b"),
			Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"a": 1}}},
		}
	}, "a", "b")
	writeFile(t, f.config, []byte(`
backends: [{name: a, replicas: [{address: "`+f.replicas["a"].addrs[0]+`"}]}, {name: b}]
endpoints: [{name: svc, route: /svc, traffic: {a: 0.4, b: 0.4}}]
`))
	testutil.WaitFor(t, 10*time.Second, "the control plane to report the invalid file", func() bool {
		return strings.Contains(f.cp.stderr.String(), `endpoint \"svc\".traffic (line 3, column 47): weights sum to 0.8`)
	})
	time.Sleep(500 * time.Millisecond) // time to (wrongly) publish, were it going to
	if counts := sendMany(t, f.url("/svc"), 200); counts["a"] != 200 {
		t.Fatalf("after an invalid edit: %v, want the last good config (all to a)", counts)
	}
	for _, n := range mustNodes(t, f.cp.httpAddr) {
		if n.ModelGeneration != 1 || !n.InSync {
			t.Fatalf("node status %+v: the invalid file must not become a generation", n)
		}
	}
	// Fixing the file applies it.
	f.apply(&meshspec.Model{
		Backends:  f.backends("a", "b"),
		Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"b": 1}}},
	})
	if counts := sendMany(t, f.url("/svc"), 100); counts["b"] != 100 {
		t.Fatalf("after fixing the file: %v, want all to b", counts)
	}
}

func TestDeltaXDS(t *testing.T) {
	t.Parallel()
	f := newFixture(t, bootstrap.ProtocolDelta, func(f *fixture) *meshspec.Model {
		return &meshspec.Model{
			Backends:  f.backends("a", "b"),
			Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"a": 1}}},
		}
	}, "a", "b")
	if counts := sendMany(t, f.url("/svc"), 100); counts["a"] != 100 {
		t.Fatalf("delta: %v, want all to a", counts)
	}
	f.apply(&meshspec.Model{
		Backends:  f.backends("a", "b"),
		Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"a": 0.5, "b": 0.5}}},
	})
	const n = 2000
	counts := sendMany(t, f.url("/svc"), n)
	checkShare(t, "delta: a (weight 0.5)", counts["a"], n, 0.5)
	raw, err := json.Marshal(mustNodes(t, f.cp.httpAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node status over delta xDS: %s", raw)
}

// TestMaxConcurrentQueriesQueues checks Ray Serve's semantics for
// max_concurrent_queries through the real Envoy: no replica has more
// requests in progress than the limit, and requests beyond it wait instead
// of failing.
func TestMaxConcurrentQueriesQueues(t *testing.T) {
	t.Parallel()
	f := newFixture(t, bootstrap.ProtocolSotW, func(f *fixture) *meshspec.Model {
		b := f.replicas["slow"].backendModel()
		b.Config.MaxConcurrentQueries = 2
		return &meshspec.Model{Backends: []meshspec.Backend{b}, Endpoints: []meshspec.Endpoint{{Name: "slow", Route: "/slow", Traffic: map[string]float64{"slow": 1}}}}
	}, "unused", "slow") // the second backend of a fixture gets two replicas
	slow := f.replicas["slow"]
	if len(slow.replicas) != 2 {
		t.Fatalf("want two replicas, have %d", len(slow.replicas))
	}
	counts := sendMany(t, f.url("/slow?sleep_ms=100"), 48) // 8 workers: twice what two replicas take
	if counts["slow"] != 48 {
		t.Fatalf("served %v, want all 48", counts)
	}
	for _, r := range slow.replicas {
		if peak := r.MaxInFlight(); peak > 2 || peak < 1 {
			t.Fatalf("replica %s had %d requests in progress at once; max_concurrent_queries is 2", r.Name, peak)
		}
		t.Logf("replica %s: %d served, at most %d at once", r.Name, r.Served(), r.MaxInFlight())
	}
}
