package server

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// TestAssignmentsOutliveTheClustersThatAskForThem: a publish that stops
// building an assignment (here, backend v2 is deleted) keeps serving it
// until the node has ACKed its new clusters. It used to be removed right
// after the snapshots were set; the removal could reach Envoy before the
// new clusters did, and Envoy empties a cluster whose assignment is
// removed: in a rollout under load (make race), callers answered "no
// healthy upstream" while their view of a backend switched clusters.
func TestAssignmentsOutliveTheClustersThatAskForThem(t *testing.T) {
	s, conn, _ := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	st := openSotW(t, conn)
	st.send(&discovery.DiscoveryRequest{Node: servemeshNode(t, "n1"), TypeUrl: resource.ClusterType})
	st.send(ack(st.expect(resource.ClusterType)))
	st.send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"v1", "v2"}})
	st.send(ack(st.expect(resource.EndpointType), "v1", "v2"))

	without := testModel("127.0.0.1:9001")
	without.Backends = without.Backends[:1]
	without.Endpoints[0].Traffic = map[string]float64{"v1": 1}
	if err := s.SetDataPlane(lowered(t, without)); err != nil {
		t.Fatal(err)
	}
	cds := st.expect(resource.ClusterType)
	if got := clusterNames(t, cds); !slices.Equal(got, []string{wire.GenAICluster, wire.RateLimitCluster, "v1"}) {
		t.Fatalf("clusters %v, want v1 alone (and the node's access log and rate limit services')", got)
	}
	time.Sleep(100 * time.Millisecond) // publishes would have removed it by now
	if _, ok := s.assignments.GetResources()["v2"]; !ok {
		t.Fatal("v2's assignment was removed before the node ACKed the clusters that no longer ask for it")
	}
	st.send(ack(cds))
	testutil.WaitFor(t, 5*time.Second, "v2's assignment to be removed once the node ACKed its clusters", func() bool {
		_, ok := s.assignments.GetResources()["v2"]
		return !ok
	})
	if _, ok := s.assignments.GetResources()["v1"]; !ok {
		t.Fatal("v1's assignment was removed too")
	}
}

// TestRetiredAssignmentsComeBack: an assignment built again before it was
// removed is no longer retired, so a later ACK does not remove it.
func TestRetiredAssignmentsComeBack(t *testing.T) {
	s := New(Options{Logger: slog.New(slog.NewTextHandler(testWriter(t), nil))})
	s.retire(nil, []string{"v2"}, 3)
	s.retire(nil, []string{"v2"}, 4) // still gone: retired since 3
	if s.retiring["v2"] != 3 {
		t.Fatalf("retiring %v, want v2 since generation 3", s.retiring)
	}
	s.retire(map[string]types.Resource{"v2": nil}, nil, 5)
	if _, ok := s.retiring["v2"]; ok {
		t.Fatalf("v2, built again, is still retiring: %v", s.retiring)
	}
}

// TestAssignmentsOutliveTheirClustersOnDeltaStreams is the same over delta
// xDS, which every agent's Envoy uses: the ACK of the new clusters (a
// request with their response's nonce) lets the removal go.
func TestAssignmentsOutliveTheirClustersOnDeltaStreams(t *testing.T) {
	s, conn, _ := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	c, _ := openDelta(t, conn, servemeshNode(t, "d1"), subscription{typ: resource.ClusterType},
		subscription{typ: resource.EndpointType, names: []string{"v1", "v2"}})

	without := testModel("127.0.0.1:9001")
	without.Backends = without.Backends[:1]
	without.Endpoints[0].Traffic = map[string]float64{"v1": 1}
	if err := s.SetDataPlane(lowered(t, without)); err != nil {
		t.Fatal(err)
	}
	cds := c.next()
	if got := cds.GetRemovedResources(); cds.GetTypeUrl() != resource.ClusterType || len(got) != 1 || got[0] != "v2" {
		t.Fatalf("removed clusters %v, want v2", got)
	}
	time.Sleep(100 * time.Millisecond)
	if _, ok := s.assignments.GetResources()["v2"]; !ok {
		t.Fatal("v2's assignment was removed before the node ACKed the clusters that no longer ask for it")
	}
	c.ack(cds)
	testutil.WaitFor(t, 5*time.Second, "v2's assignment to be removed once the node ACKed its clusters", func() bool {
		_, ok := s.assignments.GetResources()["v2"]
		return !ok
	})
}
