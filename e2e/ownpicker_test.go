//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/servemesh/servemesh/meshspec"
)

// TestOwnPickerSpeaksTheProtocol: servemesh's own picker (load_aware: the
// picker on each replica's node) passes the cases the Inference
// Extension's suite checks of a gateway's side of the protocol, on the
// default mesh (mTLS, two nodes): the replica it names serves the request
// and it is told so (servemesh_picker_served_total counts every answer
// as served by the replica picked: the protocol's served endpoint);
// data-parallel ranks, the replicas of one node, each serve when picked;
// a weighted split across two load-aware backends goes by its weights,
// each picked by its own picker; and while a node's picker is down (its
// agent stopped, its Envoy serving on) requests fail open to the replica
// Envoy picks.
func TestOwnPickerSpeaksTheProtocol(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mesh := startTwoNodeMesh(t, "own")
	mesh.createBackends(t,
		meshspec.Backend{Name: "oa", Process: demoProcess("oa", false), Config: meshspec.BackendConfig{NumReplicas: 3, LoadAware: &meshspec.LoadAware{}}},
		meshspec.Backend{Name: "ob", Process: demoProcess("ob", false), Config: meshspec.BackendConfig{NumReplicas: 2, LoadAware: &meshspec.LoadAware{}}})
	for _, e := range []meshspec.Endpoint{
		{Name: "oa", Route: "/oa", Traffic: map[string]float64{"oa": 1}},
		{Name: "opools", Route: "/opools", Traffic: map[string]float64{"oa": 0.7, "ob": 0.3}},
	} {
		if _, err := mesh.c.CreateEndpoint(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	mesh.waitPassing(t, "oa", 3, "http://"+mesh.n1.public+"/oa")
	mesh.waitPassing(t, "ob", 2, "http://"+mesh.n1.public+"/opools")
	nodes := []*mtlsNode{mesh.n1, mesh.n2}
	split := map[string]int{} // the split's answers, by backend
	// The pickers' reports of the split's answers (servemesh_picker_served_total
	// while it ran), by backend and replica label.
	reported := map[string]map[string]float64{}

	t.Run("data-parallel ranks: every replica of each node serves when picked", func(t *testing.T) {
		perNode := map[string]int{}
		for _, node := range runningOn(placements(t, mesh.c, "oa")) {
			perNode[node]++
		}
		if perNode[mesh.n1.id] < 2 && perNode[mesh.n2.id] < 2 {
			t.Fatalf("oa runs %v; want two replicas on one node, ranks of one address", perNode)
		}
		// In flight together, so the picker spreads them.
		for _, n := range nodes {
			if seen := waitReplicasAnswer(t, "every replica of oa to answer via "+n.id, "http://"+n.public+"/oa", 3, 60); len(seen) != 3 {
				t.Fatalf("via %s: replicas %v answered; want all 3", n.id, seen)
			}
		}
	})

	t.Run("a split across two load-aware backends goes by weight", func(t *testing.T) {
		const n = 200
		got := split
		before := map[string]map[string]float64{"oa": servedCounts(t, nodes, "oa"), "ob": servedCounts(t, nodes, "ob")}
		defer func() {
			for _, b := range []string{"oa", "ob"} {
				after := servedCounts(t, nodes, b)
				reported[b] = map[string]float64{}
				for label, v := range after {
					reported[b][label] = v - before[b][label]
				}
			}
		}()
		for i := range n {
			a := askPicked(t, nodes[i%2], "/opools", "")
			if a.status != http.StatusOK || (a.backend != "oa" && a.backend != "ob") {
				t.Fatalf("/opools: %d from %q; want 200 from oa or ob", a.status, a.backend)
			}
			got[a.backend]++
		}
		// As in TestExternalEndpointPicker: 110 to 170 of 200 at 0.7.
		if got["oa"] < 110 || got["oa"] > 170 {
			t.Errorf("/opools split 0.7/0.3: %v of %d; want about 140 to oa", got, n)
		}
	})

	t.Run("every answer is served by the replica picked, and the picker told so", func(t *testing.T) {
		// The split's answers, once the replicas were ready (while they
		// start, a request may be answered by Envoy itself and retried).
		if split["oa"] == 0 || split["ob"] == 0 {
			t.Fatalf("the split's answers %v: want some of each backend", split)
		}
		for b, n := range split {
			if r := reported[b]; r["picked"] < float64(n) || r["other"] != 0 || r["unreported"] != 0 {
				t.Errorf("of the split's %d answers by %s the pickers were told %v (servemesh_picker_served_total: picked, other, unreported); want every one by the replica picked", n, b, r)
			}
		}
	})

	t.Run("a node's picker down: requests fail open to the replica Envoy picks", func(t *testing.T) {
		on := 0
		for _, b := range []string{"oa", "ob"} {
			for _, node := range runningOn(placements(t, mesh.c, b)) {
				if node == mesh.n2.id {
					on++
				}
			}
		}
		if err := mesh.n2.child.Stop(15 * time.Second); err != nil {
			t.Fatalf("agent %s: %v", mesh.n2.id, err)
		}
		answered := map[string]bool{}
		for i := range 20 {
			a := askPicked(t, nodes[i%2], "/oa", "")
			if a.status != http.StatusOK || a.backend != "oa" {
				t.Fatalf("/oa via %s with %s's picker down: %d from %q; want 200 from oa", nodes[i%2].id, mesh.n2.id, a.status, a.backend)
			}
			answered[a.replica] = true
		}
		t.Logf("with %s's picker down, /oa was answered by %v", mesh.n2.id, answered)
		restartStopped(t, mesh.n2.agentProc, on)
		if r, err := replicaOf(httpClient(), "http://"+mesh.n2.public+"/oa"); err != nil || r == "" {
			t.Fatalf("/oa via %s after its agent came back: %q, %v", mesh.n2.id, r, err)
		}
	})
}

// servedCounts are servemesh_picker_served_total of backend over nodes, by
// its replica label (picked, other, unreported; 0 where a node has none).
func servedCounts(t *testing.T, nodes []*mtlsNode, backend string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, n := range nodes {
		for _, replica := range []string{"picked", "other", "unreported"} {
			if v, found := scrapeMetric(t, n.metr, "servemesh_picker_served_total", "backend", backend, "replica", replica); found {
				out[replica] += v
			}
		}
	}
	return out
}
