package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// fakeAdmin answers /stats as an Envoy admin API does.
func fakeAdmin(t *testing.T) envoy.Admin {
	t.Helper()
	admin := testutil.UnixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stats" || !strings.Contains(r.URL.Query().Get("filter"), "pending_active") || r.URL.Query().Get("histogram_buckets") != "cumulative" {
			http.Error(w, "unexpected query", http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte(`{"stats": [` + histogramJSON("cluster.model.v1.upstream_rq_time") + `,
			{"name": "cluster.model.v1.upstream_rq_total", "value": 120},
			{"name": "cluster.model.v1.upstream_rq_5xx", "value": 3},
			{"name": "cluster.model.v1.upstream_rq_active", "value": 4},
			{"name": "cluster.model.v1.upstream_rq_pending_active", "value": 6},
			{"name": "vhost._public.route.predict.upstream_rq_total", "value": 100},
			{"name": "vhost._public.route.predict.upstream_rq_5xx", "value": 2},
			{"name": "vhost.predict.route.predict.upstream_rq_total", "value": 20},
			{"name": "http.public.downstream_rq_total", "value": 999}
		]}`))
	}))
	return envoy.Admin{Socket: admin}
}

// histogramJSON is a latency histogram as Envoy's /stats answers it with
// histogram_buckets=cumulative: bucket i holds i+1 answers.
func histogramJSON(name string) string {
	var buckets []string
	for i, bound := range wire.LatencyBoundsMs {
		buckets = append(buckets, fmt.Sprintf(`{"upper_bound": %g, "interval": 0, "cumulative": %d}`, bound, i+1))
	}
	return `{"histograms": [{"name": "` + name + `", "buckets": [` + strings.Join(buckets, ",") + `]}]}`
}

// TestStatusHandlerServesLoad reads the load as the controller does: over
// the agent's status listener, from its Envoy's stats.
func TestStatusHandlerServesLoad(t *testing.T) {
	srv := httptest.NewServer(StatusHandler(prometheus.NewRegistry(), fakeAdmin(t), "n1", LoadExtras{}, nil))
	defer srv.Close()
	resp, err := http.Get(srv.URL + wire.LoadPath) //nolint:noctx // test
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var l wire.Load
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, decode: %v", resp.StatusCode, err)
	}
	got := l.Backends["model.v1"]
	if got.Active != 4 || got.Pending != 6 || got.Requests != 120 || got.Errors != 3 || len(got.Latency) != len(wire.LatencyBoundsMs) ||
		got.Latency[0] != 1 || got.Latency[len(got.Latency)-1] != uint64(len(wire.LatencyBoundsMs)) {
		t.Fatalf("backend model.v1: %+v", got)
	}
	if got := l.Routes[wire.RouteKey("predict", wire.PublicListener)]; got.Requests != 100 || got.Errors != 2 {
		t.Fatalf("route predict on the public listener: %+v", got)
	}
	if got := l.Routes[wire.RouteKey("predict", wire.MeshListener)]; got.Requests != 20 {
		t.Fatalf("route predict on the mesh listener: %+v", got)
	}
	if len(l.Backends) != 1 || len(l.Routes) != 2 || l.Node != "n1" {
		t.Fatalf("unexpected figures: %+v", l)
	}
}

// TestStatusHandlerWithoutEnvoy: with no Envoy to ask, the load and the
// versions answer 503 saying so, never made-up figures.
func TestStatusHandlerWithoutEnvoy(t *testing.T) {
	srv := httptest.NewServer(StatusHandler(prometheus.NewRegistry(), envoy.Admin{Socket: "/nonexistent/admin.sock"}, "n1", LoadExtras{}, nil))
	defer srv.Close()
	for _, path := range []string{wire.LoadPath, wire.EnvoyVersionsPath, "/metrics"} {
		resp, err := http.Get(srv.URL + path) //nolint:noctx // test
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		_ = resp.Body.Close()
		want := http.StatusServiceUnavailable
		if path == "/metrics" {
			want = http.StatusOK
		}
		if resp.StatusCode != want {
			t.Errorf("%s: status %d, want %d", path, resp.StatusCode, want)
		}
		if want != http.StatusOK && !strings.Contains(body["error"].(string), "envoy did not answer") {
			t.Errorf("%s: body %v", path, body)
		}
	}
}
