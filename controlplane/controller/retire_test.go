package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// A deleted backend's replicas finish their requests in flight (issue
// 59): its placements drain, holding their nodes' resources and its name,
// until its agents have stopped and deregistered them; then it is gone.
// They were dropped at the deletion, and their agents stopped them with
// their streams.
func TestADeletedBackendsReplicasDrainBeforeItIsGone(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 4}, {ID: "n2", CPUs: 4}}}
	c, st := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("d", 2, 4))); err != nil {
		t.Fatal(err)
	}
	placed, _ := c.GetBackend("d")
	registryOf(t).set(wire.BackendService("d"), tagsOf(placed, meshspec.Running))
	if _, err := c.DeleteBackend(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetBackend("d"); err == nil {
		t.Error("a deleted backend is still listed")
	}
	wantRetiring(t, c, st, "d", 2)
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("e", 2, 4))); KindOf(err) != Conflict {
		t.Errorf("a backend needing the retiring replicas' CPUs: %v; want a conflict (they hold them until they stop)", err)
	}
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("d", 1, 1))); KindOf(err) != Conflict || !strings.Contains(fmtErr(err), "still finishing the requests") {
		t.Errorf("creating d again while it retires: %v; want a conflict saying why", err)
	}
	testClock.advance(time.Second + drainMargin) // past the drain grace
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	wantRetiring(t, c, st, "d", 2) // still registered: serving what they have in flight

	registryOf(t).set(wire.BackendService("d"), map[string]bool{}) // the agents stopped and deregistered them
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if m, _ := c.State(); len(m.Retiring) != 0 {
		t.Fatalf("retiring %+v after its replicas deregistered; want none", m.Retiring)
	}
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("e", 2, 4))); err != nil {
		t.Fatalf("once d's replicas stopped, their CPUs are free: %v", err)
	}
}

// An apply that leaves a backend out deletes it the same way, and its
// plan says so.
func TestAnApplyThatLeavesABackendOutRetiresIt(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 8}}}
	c, st := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	spec := &meshspec.Spec{Backends: []meshspec.BackendSpec{meshspec.BackendSpecOf(processBackend("a", 1, 1)), meshspec.BackendSpecOf(processBackend("b", 1, 1))}}
	if _, err := c.Apply(ctx, spec, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	spec.Backends = spec.Backends[:1]
	changes, err := c.Apply(ctx, spec, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 1 || changes[0].String() != "delete backend b" {
		t.Errorf("the apply's changes %v; want delete backend b", changes)
	}
	wantRetiring(t, c, st, "b", 1)
	if changes, err := c.Apply(ctx, spec, ApplyOptions{DryRun: true}); err != nil || len(changes) != 0 {
		t.Errorf("the same file again: %v, %v; want no change (a retiring backend is no user's)", changes, err)
	}
}

// wantRetiring checks that backend retires with n draining placements,
// in the controller's state and in the store.
func wantRetiring(t *testing.T, c *Controller, st *store.Memory, backend string, n int) {
	t.Helper()
	m, _ := c.State()
	stored, _, err := st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for what, m := range map[string]*meshspec.Model{"the controller's state": m, "the stored state": stored} {
		if len(m.Retiring) != 1 || m.Retiring[0].Name != backend || len(m.Retiring[0].Placements) != n {
			t.Fatalf("%s retires %+v; want %s with %d placements", what, m.Retiring, backend, n)
		}
		for _, p := range m.Retiring[0].Placements {
			if p.State != meshspec.Draining {
				t.Fatalf("%s: a retiring placement %+v is not draining", what, p)
			}
		}
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
