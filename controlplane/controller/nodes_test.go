package controller

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestCordonAndDrain: a cordoned node gets no new replicas and keeps its
// own; a drained node's replicas are replaced elsewhere and drained only
// once the replacements are ready; uncordon ends both, and moves nothing
// back; apply of a file keeps the maintenance; a drain the other nodes
// have no room for is refused and changes nothing; an unknown node is
// refused by name.
func TestCordonAndDrain(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 4}, {ID: "n2", CPUs: 4}}}
	c, st := newScheduling(t, nodes)
	ready := map[string]bool{}
	c.healthy = func(string) map[string]bool { return ready }
	ctx := MayRunCommands(context.Background())
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("a", 2, 1))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetNodeMaintenance(ctx, "n2", Cordon); err != nil {
		t.Fatal(err)
	}
	three := 3
	if _, err := c.UpdateBackendConfig(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &three}); err != nil {
		t.Fatal(err)
	}
	b, _ := c.GetBackend("a")
	if got := perNode(b, meshspec.Running); got["n1"] != 2 || got["n2"] != 1 {
		t.Fatalf("scaled to 3 with n2 cordoned: %v; want the new replica on n1, n2's kept", got)
	}
	// A file applied keeps the maintenance.
	if _, err := c.Apply(ctx, &meshspec.Spec{Backends: []meshspec.BackendSpec{meshspec.BackendSpecOf(b)}}, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if m, _ := c.State(); !m.Nodes[0].Cordoned {
		t.Fatal("apply of a file uncordoned n2")
	}
	two := 2
	if _, err := c.UpdateBackendConfig(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &two}); err != nil {
		t.Fatal(err)
	}
	testClock.advance(10 * time.Second)
	_ = c.Reconcile(ctx) // the surplus drained goes
	// Drain n1: its replicas are replaced on n2.
	if _, err := c.SetNodeMaintenance(ctx, "n2", Uncordon); err != nil {
		t.Fatal(err)
	}
	b, _ = c.GetBackend("a")
	before := perNode(b, meshspec.Running)
	if _, err := c.SetNodeMaintenance(ctx, "n1", Drain); err != nil {
		t.Fatal(err)
	}
	b, _ = c.GetBackend("a")
	if got := perNode(b, meshspec.Running); got["n1"] != before["n1"] || got["n2"] != 2 {
		t.Fatalf("drain of n1 (was %v): running %v; want replacements on n2, n1's still running", before, got)
	}
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ = c.GetBackend("a"); perNode(b, meshspec.Running)["n1"] != before["n1"] {
		t.Fatal("n1's replicas drained before their replacements were ready")
	}
	for _, p := range b.Placements {
		if p.Node == "n2" {
			ready[p.Tag] = true
		}
	}
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ = c.GetBackend("a")
	if got := perNode(b, meshspec.Running); got["n1"] != 0 || got["n2"] != 2 {
		t.Fatalf("after the replacements were ready: running %v; want all on n2", got)
	}
	// n2 alone cannot take n1's and more: drain n2 is refused.
	stored, rev, _ := st.Load(ctx)
	_, err := c.SetNodeMaintenance(ctx, "n2", Drain)
	var e *Error
	if !errors.As(err, &e) || e.Kind != Conflict || !strings.Contains(err.Error(), `cannot drain node "n2"`) {
		t.Fatalf("drain with no room elsewhere: %v", err)
	}
	if after, rev2, _ := st.Load(ctx); rev2 != rev || len(after.Nodes) != len(stored.Nodes) {
		t.Fatal("the refused drain changed the state")
	}
	if _, err := c.SetNodeMaintenance(ctx, "n9", Cordon); err == nil || !strings.Contains(err.Error(), `no node "n9" is registered`) {
		t.Fatalf("cordon of an unknown node: %v", err)
	}
	if _, err := c.SetNodeMaintenance(ctx, "n1", Uncordon); err != nil {
		t.Fatal(err)
	}
	if m, _ := c.State(); len(m.Nodes) != 0 {
		t.Fatalf("after uncordon the state names nodes %v", m.Nodes)
	}
	if b, _ = c.GetBackend("a"); perNode(b, meshspec.Running)["n2"] != 2 {
		t.Fatal("uncordon moved replicas back")
	}
	reports, err := c.Nodes(ctx)
	if err != nil || len(reports) != 2 || reports[1].Replicas != 2 || !reports[0].Registered {
		t.Fatalf("node list %+v, %v", reports, err)
	}
}

// TestScalingWithEveryNodeCordonedSaysSo: with every node cordoned, a
// scale-up that places nothing names the maintenance, not free
// resources (issue 62, 6: it blamed them, the node idle); with some nodes
// cordoned, the resources' message names those too.
func TestScalingWithEveryNodeCordonedSaysSo(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 4}, {ID: "n2", CPUs: 1}}}
	c, _ := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("a", 1, 1))); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2"} {
		if _, err := c.SetNodeMaintenance(ctx, n, Cordon); err != nil {
			t.Fatal(err)
		}
	}
	three := 3
	_, err := c.UpdateBackendConfig(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &three})
	mustKind(t, err, Conflict, `cannot scale backend "a" to 3 replicas: every node that may run it is cordoned or drained (n1, n2); uncordon one`)
	if _, err := c.SetNodeMaintenance(ctx, "n2", Uncordon); err != nil {
		t.Fatal(err)
	}
	_, err = c.UpdateBackendConfig(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &three})
	mustKind(t, err, Conflict, `free resources only allow 1 to be added; scale to 2 replicas, lower the backend's cpus, memory_mb or resources, or add nodes (cordoned or drained, taking none: n1)`)
}
