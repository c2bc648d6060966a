package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

func TestActiveByHostReadsEachClustersHosts(t *testing.T) {
	clusters := []byte(`b::default_priority::max_connections::1024
b::127.0.0.1:4001::rq_active::2
b::127.0.0.1:4002::rq_active::7
b::127.0.0.1:4001::rq_total::90
inbound_b::127.0.0.1:4001::rq_active::1
other::10.0.0.5:4001::rq_active::5
`)
	got := activeByHost(clusters)
	want := map[string]map[string]int{"b": {"127.0.0.1:4001": 2, "127.0.0.1:4002": 7}, "inbound_b": {"127.0.0.1:4001": 1}, "other": {"10.0.0.5:4001": 5}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("activeByHost: %v; want %v", got, want)
	}
}

// TestADrainingReplicaStopsOnceIdleOrAtItsBound: a draining replica with
// no request in flight is stopped after the drain grace, not before; one
// whose stream goes on past its backend's graceful shutdown timeout is
// stopped at the timeout, which is logged and counted as a cut (issue
// 59: replicas were stopped 5 s into their drain, cutting model answers).
func TestADrainingReplicaStopsOnceIdleOrAtItsBound(t *testing.T) {
	for _, c := range []struct {
		name     string
		inFlight int
		bound    time.Duration
		cut      bool
	}{
		{"idle", 0, time.Hour, false},
		{"streaming past the bound", 1, 800 * time.Millisecond, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := testAgent(t)
			logs := &testutil.SyncBuffer{}
			a.log, a.metrics, a.drainGrace = slog.New(slog.NewTextHandler(logs, nil)), newMetrics(), 300*time.Millisecond
			a.inFlight = func(_ context.Context, addr string) (int, error) { return c.inFlight, nil }
			var err error
			if a.consul, err = api.NewClient(&api.Config{Address: "127.0.0.1:1"}); err != nil { // deregistration fails, logged
				t.Fatal(err)
			}
			r := a.newReplica("b", "b#000001", meshspec.ProcessSpec{Command: "/bin/true"}, false, 4001)
			r.cancel = func() {}
			close(r.done) // its process has ended
			start := time.Now()
			r.awaitDrained(make(chan struct{}), start, c.bound)
			took := time.Since(start)
			cuts := promtest.ToFloat64(a.metrics.drainCuts.WithLabelValues("b"))
			switch {
			case !strings.Contains(logs.String(), "replica stopped"):
				t.Fatalf("the replica was not stopped; log:\n%s", logs)
			case took < a.drainGrace:
				t.Fatalf("stopped %s into its drain; want the drain grace (%s) at least", took, a.drainGrace)
			case c.cut && (took < c.bound || cuts != 1 || !strings.Contains(logs.String(), "graceful shutdown timeout")):
				t.Fatalf("a stream past the bound: stopped after %s (bound %s), %v cuts counted; want it cut at the bound, logged and counted; log:\n%s", took, c.bound, cuts, logs)
			case !c.cut && (cuts != 0 || !strings.Contains(logs.String(), "no request in flight")):
				t.Fatalf("an idle replica: %v cuts counted; want none, and it logged as drained; log:\n%s", cuts, logs)
			}
		})
	}
}

// A cluster made anew (its config changed) leaves the requests its old
// self carries out of /clusters, but not out of its gauge: a replica's
// requests in flight are the more of its host's and its cluster's less
// the other hosts' (a promoted rollout's old version read none and was
// stopped under its streams).
func TestRequestsInFlightCountWhatARemadeClusterCarries(t *testing.T) {
	gauges := map[string]int{
		"cluster._inbound_v1@n1.upstream_rq_active": 3, // 1 on the current cluster, 2 on the one it replaced
		"cluster.v1.upstream_rq_active":             9, // the mesh cluster, whose hosts are nodes
		"cluster.v2.upstream_rq_active":             4,
	}
	admin := testutil.UnixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/clusters":
			_, _ = w.Write([]byte(`_inbound_v1@n1::127.0.0.1:4001::rq_active::1
_inbound_v1@n1::127.0.0.1:4002::rq_active::0
v1::127.0.0.2:7000::rq_active::9
v2::127.0.0.1:4003::rq_active::4
`))
		case "/stats":
			filter := regexp.MustCompile(r.URL.Query().Get("filter"))
			var stats []string
			for name, v := range gauges {
				if filter.MatchString(name) {
					stats = append(stats, fmt.Sprintf(`{"name": %q, "value": %d}`, name, v))
				}
			}
			_, _ = w.Write([]byte(`{"stats": [` + strings.Join(stats, ",") + `]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	inFlight := EnvoyRequestsInFlight(envoy.Admin{Socket: admin})
	for addr, want := range map[string]int{"127.0.0.1:4001": 3, "127.0.0.1:4003": 4, "127.0.0.1:4999": 0} {
		if got, err := inFlight(context.Background(), addr); err != nil || got != want {
			t.Errorf("in flight to %s: %d, %v; want %d", addr, got, err, want)
		}
	}
}
