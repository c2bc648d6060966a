package server

import (
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestOutOfSyncNodesAreCounted: servemesh_xds_nodes_out_of_sync counts a
// connected node that has not ACKed the latest model, and NACK counters
// exist at 0 for every type before any NACK.
func TestOutOfSyncNodesAreCounted(t *testing.T) {
	s, conn, reg := startServer(t)
	m := testModel("127.0.0.1:9001")
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	c, _ := openDelta(t, conn, servemeshNode(t, "n1"), subscription{resource.ClusterType, nil}, subscription{resource.EndpointType, []string{"v1", "v2"}},
		subscription{resource.ListenerType, nil}, subscription{resource.ScopedRouteType, nil},
		subscription{resource.RouteType, []string{wire.MeshRouteName("api"), wire.PublicRouteName("api")}})
	outOfSync := func() float64 {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "servemesh_xds_nodes_out_of_sync" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("servemesh_xds_nodes_out_of_sync is not served")
		return 0
	}
	testutil.WaitFor(t, 5*time.Second, "the node in sync", func() bool { return outOfSync() == 0 && s.Status()[0].InSync })
	m = meshspec.Clone(m)
	m.Endpoints[0].Traffic = map[string]float64{"v1": 1}
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the node counted out of sync before it ACKs", func() bool { return outOfSync() == 1 })
	c.recv(1)
	testutil.WaitFor(t, 5*time.Second, "the node counted in sync once it ACKed", func() bool { return outOfSync() == 0 })
	for _, typ := range []string{"listeners", "routes", "scoped_routes", "clusters", "assignments"} {
		if v := promtest.ToFloat64(mustCounterVec(t, reg, "servemesh_xds_nacks_total", typ)); v != 0 {
			t.Errorf("nacks of %s: %v before any NACK", typ, v)
		}
	}
}

// The large answers' budget is served: the bytes held now, and the
// answers that went without room.
func TestLargeAnswersBudgetIsServed(t *testing.T) {
	_, _, reg := startServer(t)
	value := func(name string) float64 {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == name {
				if g := f.GetMetric()[0].GetGauge(); g != nil {
					return g.GetValue()
				}
				return f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatalf("%s is not served", name)
		return 0
	}
	before := value("servemesh_xds_large_answer_bytes")
	held := answers.hold(2 << 20)
	if got := value("servemesh_xds_large_answer_bytes") - before; got != 2<<20 {
		t.Errorf("servemesh_xds_large_answer_bytes grew by %v while an answer held 2 MiB", got)
	}
	answers.release(held)
	if got := value("servemesh_xds_large_answer_bytes"); got != before {
		t.Errorf("servemesh_xds_large_answer_bytes is %v once the answer was freed, want %v", got, before)
	}
	value("servemesh_xds_large_answers_waited_out_total")
}
