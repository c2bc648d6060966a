package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

type fakeNodes struct {
	mu    sync.Mutex
	nodes []wire.NodeInfo
}

// list returns the nodes; one that names no allowed command allows the
// tests' /bin/replica commands.
func (f *fakeNodes) list(context.Context) ([]wire.NodeInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := append([]wire.NodeInfo(nil), f.nodes...)
	for i := range out {
		if out[i].AllowedCommands == nil {
			out[i].AllowedCommands = []string{"/bin/replica*"}
		}
	}
	return out, nil
}

func (f *fakeNodes) set(n ...wire.NodeInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = n
}

// clock is a test's clock: it moves only when the test advances it.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// testClock is the clock of the controllers newScheduling makes.
var testClock = &clock{now: time.Unix(1_800_000_000, 0)}

func newScheduling(t *testing.T, nodes *fakeNodes) (*Controller, *store.Memory) {
	t.Helper()
	st := store.NewMemory()
	c := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Store: st, Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil },
		Nodes: nodes.list, DrainGrace: time.Second, ReplaceAfter: time.Minute, Now: testClock.Now, Registered: registryOf(t).registered})
	if err := c.Lead(context.Background(), "self"); err != nil {
		t.Fatal(err)
	}
	return c, st
}

func processBackend(name string, replicas int, cpus float64) meshspec.Backend {
	return meshspec.Backend{Name: name, Process: &meshspec.ProcessSpec{Command: "/bin/replica"},
		Config: meshspec.BackendConfig{NumReplicas: replicas, CPUs: cpus}}
}

func perNode(b meshspec.Backend, state meshspec.PlacementState) map[string]int {
	out := map[string]int{}
	for _, p := range b.Placements {
		if p.State == state {
			out[p.Node]++
		}
	}
	return out
}

func TestPlacementSpreadsAcrossNodes(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 4, MemoryMB: 1000}, {ID: "n2", CPUs: 4, MemoryMB: 1000}, {ID: "n3", CPUs: 4, MemoryMB: 1000}}}
	c, st := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("a", 6, 1))); err != nil {
		t.Fatal(err)
	}
	b, _ := c.GetBackend("a")
	if got := perNode(b, meshspec.Running); got["n1"] != 2 || got["n2"] != 2 || got["n3"] != 2 {
		t.Fatalf("6 replicas over 3 nodes: %v", got)
	}
	for _, p := range b.Placements {
		if !strings.HasPrefix(p.Tag, "a#") || len(p.Tag) != 8 {
			t.Fatalf("tag %q", p.Tag)
		}
	}
	stored, _, _ := st.Load(ctx)
	if len(stored.Backends[0].Placements) != 6 {
		t.Fatal("placements were not checkpointed with the backend")
	}
}

func TestTooManyReplicasFailsWithTheSeedsMessageAndChangesNothing(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 2, MemoryMB: 1000}, {ID: "n2", CPUs: 1, MemoryMB: 1000}}}
	c, st := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	_, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("a", 4, 1)))
	mustKind(t, err, Conflict, `cannot scale backend "a" to 4 replicas: servemesh tried to add 4 replicas but the nodes' free resources only allow 3 to be added; scale to 3 replicas`)
	if _, rev, _ := st.Load(ctx); rev != 0 {
		t.Fatal("a backend that did not fit was stored")
	}
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("a", 2, 1))); err != nil {
		t.Fatal(err)
	}
	n := 5
	_, err = c.UpdateBackendConfig(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &n})
	mustKind(t, err, Conflict, "tried to add 3 replicas but the nodes' free resources only allow 1")
	if b, _ := c.GetBackend("a"); len(b.Placements) != 2 || b.Config.NumReplicas != 2 {
		t.Fatalf("a refused scale-up changed the backend: %+v", b)
	}
}

func TestScaleDownDrainsThenReconcileRemoves(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 8}, {ID: "n2", CPUs: 8}}}
	c, _ := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("a", 4, 0))); err != nil {
		t.Fatal(err)
	}
	one := 1
	if _, err := c.UpdateBackendConfig(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &one}); err != nil {
		t.Fatal(err)
	}
	b, _ := c.GetBackend("a")
	if len(b.Placements) != 4 || len(perNode(b, meshspec.Draining)) == 0 {
		t.Fatalf("scale-down must drain first, not remove: %+v", b.Placements)
	}
	running := 0
	for _, n := range perNode(b, meshspec.Running) {
		running += n
	}
	if running != 1 {
		t.Fatalf("%d running after scaling to 1", running)
	}
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := c.GetBackend("a"); len(b.Placements) != 4 {
		t.Fatalf("before the drain period is over: %+v, want the draining replicas kept", b.Placements)
	}
	testClock.advance(time.Second + drainMargin)
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := c.GetBackend("a"); len(b.Placements) != 4 {
		t.Fatalf("after the drain grace, the replicas still registered (serving requests in flight): %+v; want them kept", b.Placements)
	}
	registryOf(t).set(wire.BackendService("a"), tagsOf(b, meshspec.Running)) // the agents stopped and deregistered the others
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := c.GetBackend("a"); len(b.Placements) != 1 || b.Placements[0].State != meshspec.Running {
		t.Fatalf("once the draining replicas deregistered: %+v", b.Placements)
	}
}

// TestADrainingReplicaIsForgottenAtTheGracefulShutdownTimeout: a draining
// replica still registered (its requests in flight going on, or its agent
// gone) holds its placement until its backend's graceful shutdown timeout,
// on the stored clock, then no longer (issue 59).
func TestADrainingReplicaIsForgottenAtTheGracefulShutdownTimeout(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 8}, {ID: "n2", CPUs: 8}}}
	c, _ := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	spec := processBackend("g", 2, 0)
	spec.Config.GracefulShutdownTimeoutS = 60
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(spec)); err != nil {
		t.Fatal(err)
	}
	b, _ := c.GetBackend("g")
	registryOf(t).set(wire.BackendService("g"), tagsOf(b, meshspec.Running))
	one := 1
	if _, err := c.UpdateBackendConfig(ctx, "g", meshspec.BackendConfigPatch{NumReplicas: &one}); err != nil {
		t.Fatal(err)
	}
	// Steps that add up to the timeout and its margin, less a millisecond.
	for _, step := range []time.Duration{30 * time.Second, 30*time.Second + drainMargin - time.Millisecond} {
		testClock.advance(step)
		if err := c.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		if b, _ := c.GetBackend("g"); len(b.Placements) != 2 {
			t.Fatalf("a draining replica still registered, before the timeout: %+v; want it kept", b.Placements)
		}
	}
	testClock.advance(time.Millisecond)
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := c.GetBackend("g"); len(b.Placements) != 1 || b.Placements[0].State != meshspec.Running {
		t.Fatalf("at the graceful shutdown timeout: %+v; want the draining replica forgotten", b.Placements)
	}
}

// tagsOf are the tags of b's placements in state.
func tagsOf(b meshspec.Backend, state meshspec.PlacementState) map[string]bool {
	out := map[string]bool{}
	for _, p := range b.Placements {
		if p.State == state {
			out[p.Tag] = true
		}
	}
	return out
}

// registry is the replicas' registrations as a test sets them; a service
// set once is known, and a backend never set has every placed replica
// registered.
type registry struct {
	mu   sync.Mutex
	tags map[string]map[string]bool
}

func (r *registry) set(service string, tags map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tags[service] = tags
}

func (r *registry) registered(service string) (map[string]bool, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tags, ok := r.tags[service]
	return tags, ok
}

// registries are, by test, the registrations the controller newScheduling
// made for it sees: each run of a test its own (-count runs it again with
// the same names).
var registries sync.Map // testing.TB: *registry

func registryOf(t testing.TB) *registry {
	r, loaded := registries.LoadOrStore(t, &registry{tags: map[string]map[string]bool{}})
	if !loaded {
		t.Cleanup(func() { registries.Delete(t) })
	}
	return r.(*registry)
}

func TestReconcileReplacesReplicasOfAGoneNode(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 8}, {ID: "n2", CPUs: 8}}}
	c, _ := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("a", 2, 0))); err != nil {
		t.Fatal(err)
	}
	nodes.set(wire.NodeInfo{ID: "n1", CPUs: 8})
	if err := c.Reconcile(ctx); err != nil { // notes n2 missing
		t.Fatal(err)
	}
	if err := c.Reconcile(ctx); err != nil { // too early: n2 may come back
		t.Fatal(err)
	}
	if b, _ := c.GetBackend("a"); perNode(b, meshspec.Running)["n2"] != 1 {
		t.Fatalf("before ReplaceAfter: %v, want n2's replica kept", perNode(b, meshspec.Running))
	}
	testClock.advance(time.Minute)
	if err := c.Reconcile(ctx); err != nil { // replaces after ReplaceAfter
		t.Fatal(err)
	}
	b, _ := c.GetBackend("a")
	if got := perNode(b, meshspec.Running); got["n1"] != 2 || got["n2"] != 0 {
		t.Fatalf("after n2 went away: %v", got)
	}
}

// TestApplyKeepsPlacements: a file never lists placements, so applying one
// must keep the replicas the controller placed, scale by the file's
// num_replicas, leave an autoscaled backend's count to the autoscaler, and
// report no changes when applied again.
func TestApplyKeepsPlacements(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 8}, {ID: "n2", CPUs: 8}}}
	c, st := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	scaled := processBackend("auto", 0, 1)
	scaled.Config.Autoscaling = &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 4, TargetInFlight: 2}
	file := &meshspec.Model{Backends: []meshspec.Backend{processBackend("a", 2, 1), scaled}}
	if _, err := c.Apply(ctx, meshspec.SpecOf(file), ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	a, _ := c.GetBackend("a")
	auto, _ := c.GetBackend("auto")
	if len(a.Placements) != 2 || auto.Config.NumReplicas != 1 || len(auto.Placements) != 1 {
		t.Fatalf("first apply: a %+v, auto %+v", a.Placements, auto.Config)
	}
	if _, err := c.Autoscale(ctx, "auto", 3); err != nil {
		t.Fatal(err)
	}
	_, rev, _ := st.Load(ctx)
	diff, err := c.Apply(ctx, meshspec.SpecOf(file), ApplyOptions{})
	if _, after, _ := st.Load(ctx); err != nil || len(diff) != 0 || after != rev {
		t.Fatalf("re-applying the same file: %v, %v (revision %d -> %d); want no changes", diff, err, rev, after)
	}
	if got, _ := c.GetBackend("auto"); got.Config.NumReplicas != 3 {
		t.Fatalf("apply reset the autoscaler's count to %d", got.Config.NumReplicas)
	}
	file.Backends[0].Config.NumReplicas = 3
	if _, err := c.Apply(ctx, meshspec.SpecOf(file), ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	after, _ := c.GetBackend("a")
	kept := 0
	for _, p := range after.Placements {
		for _, q := range a.Placements {
			if p.Tag == q.Tag && p.State == meshspec.Running {
				kept++
			}
		}
	}
	if len(after.Placements) != 3 || kept != 2 {
		t.Fatalf("scaling a by the file from 2 to 3: %+v; want the 2 replicas kept and 1 added", after.Placements)
	}
}

// TestApplyRollsOutANewProcessSpec: changing a process backend's command in
// a file drains the replicas running the old spec and places new ones.
func TestApplyRollsOutANewProcessSpec(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 8}, {ID: "n2", CPUs: 8}}}
	c, _ := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	file := &meshspec.Model{Backends: []meshspec.Backend{processBackend("a", 2, 1)}}
	if _, err := c.Apply(ctx, meshspec.SpecOf(file), ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	before, _ := c.GetBackend("a")
	file.Backends[0].Process = &meshspec.ProcessSpec{Command: "/bin/replica-v2"}
	diff, err := c.Apply(ctx, meshspec.SpecOf(file), ApplyOptions{})
	if err != nil || len(diff) != 1 || diff[0].String() != "update backend a" || len(diff[0].Fields) != 1 ||
		diff[0].Fields[0].String() != `process.command: "/bin/replica" -> "/bin/replica-v2"` {
		t.Fatalf("apply of a new spec: %+v, %v; want the command's change and nothing else (placements are not the user's)", diff, err)
	}
	old := map[string]bool{}
	for _, p := range before.Placements {
		old[p.Tag] = true
	}
	count := func() (oldRunning, oldDraining, fresh int) {
		b, _ := c.GetBackend("a")
		for _, p := range b.Placements {
			switch {
			case old[p.Tag] && p.State == meshspec.Running:
				oldRunning++
			case old[p.Tag] && p.State == meshspec.Draining:
				oldDraining++
			case !old[p.Tag] && p.State == meshspec.Running:
				fresh++
			}
		}
		return
	}
	// First the new replicas start beside the old ones, which keep serving.
	if r, d, f := count(); r != 2 || d != 0 || f != 2 {
		t.Fatalf("after the apply: %d old running, %d old draining, %d new; want 2, 0, 2", r, d, f)
	}
	// Until the new ones are healthy, the old ones stay.
	healthyTags := map[string]bool{}
	c.healthy = func(string) map[string]bool { return healthyTags }
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _, _ := count(); r != 2 {
		t.Fatalf("old replicas drained before the new ones were healthy")
	}
	b, _ := c.GetBackend("a")
	for _, p := range b.Placements {
		if !old[p.Tag] {
			healthyTags[p.Tag] = true
		}
	}
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if r, d, f := count(); r != 0 || d != 2 || f != 2 {
		t.Fatalf("once the new replicas are healthy: %d old running, %d old draining, %d new; want 0, 2, 2", r, d, f)
	}
	if diff, err := c.Apply(ctx, meshspec.SpecOf(file), ApplyOptions{}); err != nil || len(diff) != 0 {
		t.Fatalf("re-applying the new spec: %v, %v; want no changes", diff, err)
	}
}

// TestHugeScaleIsRefusedBeforeScheduling: a num_replicas far over the limit
// is refused with a short error naming the limit, before any placement
// work, and changes nothing.
func TestHugeScaleIsRefusedBeforeScheduling(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 8, MemoryMB: 1000}}}
	c, st := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	changed, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("b", 1, 1)))
	mustChange(t, changed, err)
	_, before, _ := st.Load(ctx)
	for _, n := range []int{2_000_000, meshspec.MaxReplicas + 1, -1} {
		_, err := c.UpdateBackendConfig(ctx, "b", meshspec.BackendConfigPatch{NumReplicas: &n})
		mustKind(t, err, Invalid, fmt.Sprintf("num_replicas: is %d; set a number from 0 to %d", n, meshspec.MaxReplicas))
		if len(err.Error()) > 500 {
			t.Fatalf("a %d-byte error for one bad number", len(err.Error()))
		}
	}
	_, err = c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("h", 2_000_000, 1)))
	mustKind(t, err, Invalid, "set a number from 0 to")
	if _, after, _ := st.Load(ctx); after != before {
		t.Fatalf("a refused change moved the store from revision %d to %d", before, after)
	}
}

// TestReplicaTagsAreRedrawnOnCollision: 24 random bits collide sometimes; a
// tag a placement of the backend already has is drawn again.
func TestReplicaTagsAreRedrawnOnCollision(t *testing.T) {
	draws := [][]byte{{0xab, 0xcd, 0xef}, {0xab, 0xcd, 0xef}, {0x01, 0x02, 0x03}}
	defer func(orig func([]byte) (int, error)) { randRead = orig }(randRead)
	randRead = func(b []byte) (int, error) {
		copy(b, draws[0])
		draws = draws[1:]
		return len(b), nil
	}
	placed := []meshspec.Placement{{Tag: "b#abcdef"}}
	if tag := newTag("b", placed); tag != "b#010203" {
		t.Fatalf("tag %s; want the colliding draws skipped", tag)
	}
}

// TestOnlyNodesThatAllowACommandRunIt: a replica goes only to a node whose
// agent allows its command; when none does, the error names the command
// and the nodes, and nothing changes.
func TestOnlyNodesThatAllowACommandRunIt(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{
		{ID: "n1", CPUs: 8, MemoryMB: 1000, AllowedCommands: []string{"/opt/other"}},
		{ID: "n2", CPUs: 8, MemoryMB: 1000, AllowedCommands: []string{"/bin/*"}},
	}}
	c, _ := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	changed, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("ok", 3, 1)))
	mustChange(t, changed, err)
	m, _ := c.State()
	if got := perNode(m.Backends[0], meshspec.Running); got["n2"] != 3 || got["n1"] != 0 {
		t.Fatalf("placements %v; want all on n2, the node that allows /bin/replica", got)
	}
	b := processBackend("no", 1, 1)
	b.Process.Command = "/usr/bin/python3"
	_, err = c.CreateBackend(ctx, meshspec.BackendSpecOf(b))
	mustKind(t, err, Conflict, `no node allows command "/usr/bin/python3" (nodes: n1, n2)`)
	if m, _ := c.State(); len(m.Backends) != 1 {
		t.Fatal("a refused backend was created")
	}
}

// TestANodesPolicyBoundsItsClaim: a compromised node claimed 64 CPUs and
// every command, and attracted every backend's replicas (issue 34). With
// the operator's policy, the scheduler takes the smaller of each figure
// and runs only commands both allow; setting one needs the exec scope.
func TestANodesPolicyBoundsItsClaim(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{
		{ID: "greedy", CPUs: 64, MemoryMB: 1 << 20, Resources: map[string]int{"gpu": 8}, AllowedCommands: []string{"/*", "/*/*", "/*/*/*"}},
		{ID: "honest", CPUs: 4, MemoryMB: 4000, AllowedCommands: []string{"/bin/replica"}},
	}}
	c, _ := newScheduling(t, nodes)
	exec := MayRunCommands(context.Background())
	policy := &meshspec.NodePolicy{CPUs: 1, MemoryMB: 1000, AllowedCommands: []string{"/bin/replica"}}
	if _, err := c.SetNodePolicy(context.Background(), "greedy", policy); err == nil {
		t.Fatal("a write token set a node policy")
	}
	changed, err := c.SetNodePolicy(exec, "greedy", policy)
	mustChange(t, changed, err)
	changed, err = c.CreateBackend(exec, meshspec.BackendSpecOf(processBackend("b", 4, 1)))
	mustChange(t, changed, err)
	m, _ := c.State()
	if got := perNode(m.Backends[0], meshspec.Running); got["greedy"] != 1 || got["honest"] != 3 {
		t.Fatalf("placements %v; want 1 on greedy (its policy's one CPU), 3 on honest", got)
	}
	other := processBackend("py", 1, 0.1)
	other.Process.Command = "/usr/bin/python3"
	_, err = c.CreateBackend(exec, meshspec.BackendSpecOf(other))
	mustKind(t, err, Conflict, "node policies do not")
	gpu := processBackend("gpu", 1, 0.1)
	gpu.Config.Resources = map[string]int{"gpu": 1}
	_, err = c.CreateBackend(exec, meshspec.BackendSpecOf(gpu))
	mustKind(t, err, Conflict, "gpu")
	if _, err := c.SetNodePolicy(exec, "greedy", &meshspec.NodePolicy{CPUs: -1}); err == nil {
		t.Fatal("a policy of -1 CPUs was taken")
	}
	reports, err := c.Nodes(context.Background())
	if err != nil || reports[0].Policy == nil || reports[0].Policy.CPUs != 1 {
		t.Fatalf("node list: %+v, %v; want greedy's policy shown", reports, err)
	}
	changed, err = c.SetNodePolicy(exec, "greedy", nil)
	mustChange(t, changed, err)
	if m, _ := c.State(); len(m.Nodes) != 0 {
		t.Fatalf("a cleared policy left %+v", m.Nodes)
	}
}

// TestScaleDownDrainsNotReadyReplicasFirst: right after a scale-up, a
// scale-down drains the replica still starting, not one that serves.
func TestScaleDownDrainsNotReadyReplicasFirst(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 8}, {ID: "n2", CPUs: 8}, {ID: "n3", CPUs: 8}}}
	var ready map[string]bool
	c := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Store: store.NewMemory(), Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil },
		Nodes: nodes.list, Now: testClock.Now, Healthy: func(string) map[string]bool { return ready }})
	ctx := MayRunCommands(context.Background())
	if err := c.Lead(ctx, "self"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(processBackend("a", 2, 1))); err != nil {
		t.Fatal(err)
	}
	b, _ := c.GetBackend("a")
	ready = map[string]bool{b.Placements[0].Tag: true, b.Placements[1].Tag: true}
	for _, n := range []int{3, 2} {
		if _, err := c.UpdateBackendConfig(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &n}); err != nil {
			t.Fatal(err)
		}
	}
	b, _ = c.GetBackend("a")
	for _, p := range b.Placements {
		if ready[p.Tag] != (p.State == meshspec.Running) {
			t.Fatalf("placements %+v: want the two ready ones running and the starting one draining", b.Placements)
		}
	}
}

// TestAutoscalePlacesWhatFits: an autoscaled backend that wants more
// replicas than the nodes hold gets those that fit (it got none before), the
// rest stays wanted and says why, and is placed by the reconcile when room
// comes. A user's scale that does not fit still changes nothing.
func TestAutoscalePlacesWhatFits(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 2}}}
	c, _ := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	auto := processBackend("auto", 1, 1)
	auto.Config.Autoscaling = &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 8, TargetInFlight: 2}
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(auto)); err != nil {
		t.Fatal(err)
	}
	changed, err := c.Autoscale(ctx, "auto", 4)
	var short *Error
	if !changed || !errors.As(err, &short) || short.Shortfall != 2 {
		t.Fatalf("autoscale to 4 with room for 2: changed %v, err %v; want the change made and a shortfall of 2", changed, err)
	}
	b, _ := c.GetBackend("auto")
	if b.Config.NumReplicas != 4 || len(b.Placements) != 2 {
		t.Fatalf("after autoscaling to 4 with room for 2: num_replicas %d, %d placed; want 4 wanted, 2 placed", b.Config.NumReplicas, len(b.Placements))
	}
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if p := c.PlacementProblems()["auto"]; !strings.Contains(p, "free resources only allow") {
		t.Fatalf("placement problems %q; want why the rest does not fit", p)
	}
	nodes.set(wire.NodeInfo{ID: "n1", CPUs: 2}, wire.NodeInfo{ID: "n2", CPUs: 2})
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := c.GetBackend("auto"); len(b.Placements) != 4 || c.PlacementProblems()["auto"] != "" {
		t.Fatalf("with room for the rest: %d placed, problem %q; want 4 and none", len(b.Placements), c.PlacementProblems()["auto"])
	}
	ten := 10
	if _, err := c.UpdateBackendConfig(ctx, "auto", meshspec.BackendConfigPatch{NumReplicas: &ten}); err == nil {
		t.Fatal("a user's scale to 10 with room for none more worked")
	}
	if b, _ := c.GetBackend("auto"); len(b.Placements) != 4 {
		t.Fatalf("a user's scale that did not fit left %d placements; want the 4 unchanged", len(b.Placements))
	}
}

// TestPlacementCountsNamedResources: replicas asking for a resource go only
// to nodes offering enough of it, never more than it offers (draining
// replicas still hold theirs), and a request no node could ever fit says
// which resource and how to offer it.
func TestPlacementCountsNamedResources(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "gpu-node", CPUs: 8, Resources: map[string]int{"gpu": 2}}, {ID: "cpu-node", CPUs: 8}}}
	c, _ := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	model1 := processBackend("llm", 2, 1)
	model1.Config.Resources = map[string]int{"gpu": 1}
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(model1)); err != nil {
		t.Fatal(err)
	}
	b, _ := c.GetBackend("llm")
	if got := perNode(b, meshspec.Running); got["gpu-node"] != 2 {
		t.Fatalf("two replicas needing a GPU each: %v; want both on gpu-node", got)
	}
	three := 3
	_, err := c.UpdateBackendConfig(ctx, "llm", meshspec.BackendConfigPatch{NumReplicas: &three})
	if err == nil || !strings.Contains(err.Error(), "resources") {
		t.Fatalf("a third replica with both GPUs taken: %v; want a conflict naming resources", err)
	}
	big := processBackend("big", 1, 1)
	big.Config.Resources = map[string]int{"gpu": 4}
	_, err = c.CreateBackend(ctx, meshspec.BackendSpecOf(big))
	if err == nil || !strings.Contains(err.Error(), "--resource gpu=4") {
		t.Fatalf("a replica needing 4 GPUs where nodes have 2: %v; want the fix named", err)
	}
	if _, err := c.GetBackend("big"); err == nil {
		t.Fatal("the refused backend was created")
	}
}

// TestAnAutoscaledBackendStartsAtItsInitialReplicas: created or applied
// without num_replicas, an autoscaled backend starts at initial_replicas
// (Ray Serve's), else at min_replicas.
func TestAnAutoscaledBackendStartsAtItsInitialReplicas(t *testing.T) {
	nodes := &fakeNodes{nodes: []wire.NodeInfo{{ID: "n1", CPUs: 8}, {ID: "n2", CPUs: 8}}}
	c, _ := newScheduling(t, nodes)
	ctx := MayRunCommands(context.Background())
	initial := processBackend("initial", 0, 1)
	initial.Config.Autoscaling = &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 4, TargetInFlight: 2, InitialReplicas: 3}
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(initial)); err != nil {
		t.Fatal(err)
	}
	minimum := processBackend("minimum", 0, 1)
	minimum.Config.Autoscaling = &meshspec.AutoscalingConfig{MinReplicas: 2, MaxReplicas: 4, TargetInFlight: 2}
	applied := processBackend("applied", 0, 1)
	applied.Config.Autoscaling = &meshspec.AutoscalingConfig{MinReplicas: 0, MaxReplicas: 4, TargetInFlight: 2, InitialReplicas: 2}
	file := &meshspec.Model{Backends: []meshspec.Backend{initial, minimum, applied}}
	if _, err := c.Apply(ctx, meshspec.SpecOf(file), ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"initial": 3, "minimum": 2, "applied": 2} {
		if b, _ := c.GetBackend(name); b.Config.NumReplicas != want || len(b.Placements) != want {
			t.Errorf("%s starts at %d replicas (%d placed), want %d", name, b.Config.NumReplicas, len(b.Placements), want)
		}
	}
}
