package agent

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

func TestHostRequestsActiveSumsTheHostOverClusters(t *testing.T) {
	clusters := []byte(`b::default_priority::max_connections::1024
b::127.0.0.1:4001::rq_active::2
b::127.0.0.1:4002::rq_active::7
b::127.0.0.1:4001::rq_total::90
inbound_b::127.0.0.1:4001::rq_active::1
other::10.0.0.5:4001::rq_active::5
`)
	if got := hostRequestsActive(clusters, "127.0.0.1:4001"); got != 3 {
		t.Fatalf("rq_active of 127.0.0.1:4001: %d; want 3 (2 from the node's callers, 1 through its inbound listener)", got)
	}
	if got := hostRequestsActive(clusters, "127.0.0.1:9"); got != 0 {
		t.Fatalf("rq_active of a host no cluster has: %d", got)
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
