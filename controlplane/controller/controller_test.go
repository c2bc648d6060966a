package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
)

type published struct {
	models  []*meshspec.Model
	touched []meshspec.Touched
}

func (p *published) publish(m *meshspec.Model, _ meshspec.Revision, touched meshspec.Touched) error {
	if err := m.Validate(); err != nil {
		return err
	}
	p.models = append(p.models, m)
	p.touched = append(p.touched, touched)
	return nil
}

func (p *published) last() *meshspec.Model { return p.models[len(p.models)-1] }

func newLeader(t *testing.T, st store.Store) (*Controller, *published) {
	t.Helper()
	pub := &published{}
	c := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Store: st, Publish: pub.publish})
	if err := c.Lead(context.Background(), "self:1"); err != nil {
		t.Fatal(err)
	}
	return c, pub
}

func backend(name string) meshspec.Backend {
	return meshspec.Backend{Name: name, Replicas: []meshspec.Replica{{Address: "10.0.0.1:9001"}}}
}

func mustChange(t *testing.T, changed bool, err error) {
	t.Helper()
	if err != nil || !changed {
		t.Fatalf("got changed=%v err=%v, want a change", changed, err)
	}
}

func mustKind(t *testing.T, err error, kind Kind, text string) {
	t.Helper()
	if KindOf(err) != kind || !strings.Contains(err.Error(), text) {
		t.Fatalf("got %v (kind %d), want kind %d mentioning %q", err, KindOf(err), kind, text)
	}
}

func TestOperationsAreCheckpointedThenPublished(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory()
	c, pub := newLeader(t, st)
	ch, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(backend("v1")))
	mustChange(t, ch, err)
	ch, err = c.CreateBackend(ctx, meshspec.BackendSpecOf(backend("v2")))
	mustChange(t, ch, err)
	ch, err = c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "api", Route: "/api", Traffic: map[string]float64{"v1": 1}})
	mustChange(t, ch, err)
	ch, err = c.SetTraffic(ctx, "api", map[string]float64{"v1": 0.9, "v2": 0.1})
	mustChange(t, ch, err)
	ch, err = c.SetShadow(ctx, "api", "v2", 0.05)
	mustChange(t, ch, err)
	mcq := 7
	ch, err = c.UpdateBackendConfig(ctx, "v1", meshspec.BackendConfigPatch{MaxConcurrentQueries: &mcq})
	mustChange(t, ch, err)

	stored, rev, err := st.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rev != 6 {
		t.Fatalf("store at revision %d after 6 changes", rev)
	}
	mine, myRev := c.State()
	if rev != myRev || !equalModels(stored, mine) || !equalModels(stored, pub.last()) {
		t.Fatalf("store, controller and data plane disagree:\nstore %+v\nctl   %+v\npub   %+v", stored, mine, pub.last())
	}
	e, _ := c.GetEndpoint("api")
	if e.Shadows["v2"] != 0.05 || e.Traffic["v2"] != 0.1 {
		t.Fatalf("endpoint %+v", e)
	}
	if b, _ := c.GetBackend("v1"); b.Config.MaxConcurrentQueries != 7 {
		t.Fatalf("backend %+v", b)
	}
	// Each state is published with what its change touched, the state
	// recovered at leading with the whole state.
	want := []meshspec.Touched{meshspec.WholeState, {Backends: []string{"v1"}}, {Backends: []string{"v2"}},
		{Endpoints: []string{"api"}}, {Endpoints: []string{"api"}}, {Endpoints: []string{"api"}}, {Backends: []string{"v1"}}}
	if !reflect.DeepEqual(pub.touched, want) {
		t.Fatalf("published with touched %+v, want %+v", pub.touched, want)
	}
}

func TestRepeatingACallChangesNothing(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory()
	c, _ := newLeader(t, st)
	ops := []func() (bool, error){
		func() (bool, error) { return c.CreateBackend(ctx, meshspec.BackendSpecOf(backend("v1"))) },
		func() (bool, error) {
			return c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "api", Route: "/api", Methods: []string{"get"}, Traffic: map[string]float64{"v1": 1}})
		},
		func() (bool, error) { return c.SetTraffic(ctx, "api", map[string]float64{"v1": 1}) },
		func() (bool, error) { return c.SetShadow(ctx, "api", "v1", 0.5) },
		func() (bool, error) { return c.SetShadow(ctx, "api", "v1", 0) },
		func() (bool, error) { return c.DeleteEndpoint(ctx, "api") },
		func() (bool, error) { return c.DeleteBackend(ctx, "v1") },
	}
	for i, op := range ops {
		if _, err := op(); err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
		_, before, _ := st.Load(ctx)
		changed, err := op()
		_, after, _ := st.Load(ctx)
		if err != nil || changed || before != after {
			t.Fatalf("op %d repeated: changed=%v err=%v, revision %d -> %d", i, changed, err, before, after)
		}
	}
}

func TestEveryErrorChangesNothing(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory()
	c, _ := newLeader(t, st)
	ch, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(backend("v1")))
	mustChange(t, ch, err)
	ch, err = c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "api", Route: "/api", Traffic: map[string]float64{"v1": 1}})
	mustChange(t, ch, err)
	_, revBefore, _ := st.Load(ctx)
	other := backend("v1")
	other.Config.MaxConcurrentQueries = 3
	zero := 0
	for _, tc := range []struct {
		name string
		call func() (bool, error)
		kind Kind
		text string
	}{
		{"backend exists, different spec", func() (bool, error) { return c.CreateBackend(ctx, meshspec.BackendSpecOf(other)) }, Conflict, "already exists with a different spec"},
		{"invalid backend", func() (bool, error) { return c.CreateBackend(ctx, meshspec.BackendSpec{Name: "bad name"}) }, Invalid, "not a valid name"},
		{"update unknown backend", func() (bool, error) {
			return c.UpdateBackendConfig(ctx, "ghost", meshspec.BackendConfigPatch{NumReplicas: &zero})
		}, NotFound, `backend "ghost" is not registered`},
		{"empty update", func() (bool, error) { return c.UpdateBackendConfig(ctx, "v1", meshspec.BackendConfigPatch{}) }, Invalid, "sets no field"},
		{"negative max_concurrent_queries", func() (bool, error) {
			n := -1
			return c.UpdateBackendConfig(ctx, "v1", meshspec.BackendConfigPatch{MaxConcurrentQueries: &n})
		}, Invalid, "max_concurrent_queries: is -1"},
		{"replicas of a backend of listed replicas", func() (bool, error) {
			n := 5
			return c.UpdateBackendConfig(ctx, "v1", meshspec.BackendConfigPatch{NumReplicas: &n})
		}, Invalid, "num_replicas: is set on a backend of listed replicas; servemesh does not run its replicas"},
		{"cpus of a backend of listed replicas", func() (bool, error) {
			n := 3.0
			return c.UpdateBackendConfig(ctx, "v1", meshspec.BackendConfigPatch{CPUs: &n})
		}, Invalid, "cpus: is set on a backend of listed replicas"},
		{"delete used backend", func() (bool, error) { return c.DeleteBackend(ctx, "v1") }, Conflict, `backend "v1" cannot be deleted: it is in the traffic of endpoint "api"; take it out of that traffic first`},
		{"endpoint exists", func() (bool, error) {
			return c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "api", Route: "/other", Traffic: map[string]float64{"v1": 1}})
		}, Conflict, `endpoint "api" is already registered`},
		{"route taken", func() (bool, error) {
			return c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "api2", Route: "/api", Traffic: map[string]float64{"v1": 1}})
		}, Conflict, `route "/api" is already registered to endpoint "api"`},
		{"endpoint to unknown backend", func() (bool, error) {
			return c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "e2", Route: "/e2", Traffic: map[string]float64{"ghost": 1}})
		}, Invalid, `backend "ghost" that is not registered`},
		{"traffic on unknown endpoint", func() (bool, error) { return c.SetTraffic(ctx, "ghost", map[string]float64{"v1": 1}) }, NotFound, `endpoint "ghost" that is not registered`},
		{"traffic to unknown backend", func() (bool, error) { return c.SetTraffic(ctx, "api", map[string]float64{"ghost": 1}) }, Invalid, `backend "ghost" that is not registered`},
		{"negative weight", func() (bool, error) { return c.SetTraffic(ctx, "api", map[string]float64{"v1": -1}) }, Invalid, "weights cannot be negative"},
		{"weights not summing to 1", func() (bool, error) { return c.SetTraffic(ctx, "api", map[string]float64{"v1": 0.5}) }, Invalid, "must sum to 1"},
		{"shadow from unknown endpoint", func() (bool, error) { return c.SetShadow(ctx, "ghost", "v1", 0.1) }, NotFound, `shadow traffic from an endpoint "ghost"`},
		{"shadow to unknown backend", func() (bool, error) { return c.SetShadow(ctx, "api", "ghost", 0.1) }, Invalid, `shadow traffic to a backend "ghost"`},
		{"shadow proportion", func() (bool, error) { return c.SetShadow(ctx, "api", "v1", 1.5) }, Invalid, "outside [0, 1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed, err := tc.call()
			mustKind(t, err, tc.kind, tc.text)
			_, rev, _ := st.Load(ctx)
			if changed || rev != revBefore {
				t.Fatalf("a refused call changed the store (revision %d -> %d)", revBefore, rev)
			}
		})
	}
}

func TestFollowerRefusesWritesNamingTheLeader(t *testing.T) {
	c, _ := newLeader(t, store.NewMemory())
	c.Follow("10.0.0.9:18001")
	_, err := c.CreateBackend(context.Background(), meshspec.BackendSpecOf(backend("v1")))
	var e *Error
	if !errors.As(err, &e) || e.Kind != NotLeader || e.Leader != "10.0.0.9:18001" {
		t.Fatalf("got %v, want NotLeader naming the leader", err)
	}
}

// TestCrashAfterCheckpointLosesNothing: the process "dies" right after a
// checkpoint; a new controller recovers the change from the store.
func TestCrashAfterCheckpointLosesNothing(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory()
	crashed := false
	c := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Store: st, Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil },
		CrashAfterCheckpoint: 1, Exit: func(int) { crashed = true; panic("exited") }})
	if err := c.Lead(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = recover() }()
		_, _ = c.CreateBackend(ctx, meshspec.BackendSpecOf(backend("v1")))
	}()
	if !crashed {
		t.Fatal("fault injection did not fire")
	}
	if _, err := c.GetBackend("v1"); err == nil {
		t.Fatal("the crashed controller adopted the change before it took effect")
	}
	recovered, pub := newLeader(t, st)
	if _, err := recovered.GetBackend("v1"); err != nil || len(pub.last().Backends) != 1 {
		t.Fatalf("recovery lost the checkpointed change: %v", err)
	}
}

func TestApplyIsOneCommitAndDryRunChangesNothing(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory()
	c, pub := newLeader(t, st)
	desired := &meshspec.Model{}
	for i := range 100 {
		desired.Backends = append(desired.Backends, meshspec.Backend{Name: fmt.Sprintf("b%03d", i)})
		desired.Endpoints = append(desired.Endpoints, meshspec.Endpoint{Name: fmt.Sprintf("e%03d", i), Route: fmt.Sprintf("/e%03d", i),
			Traffic: map[string]float64{fmt.Sprintf("b%03d", i): 1}})
	}
	diff, err := c.Apply(ctx, meshspec.SpecOf(desired), ApplyOptions{DryRun: true})
	if err != nil || len(diff) != 200 || diff[0].String() != "create backend b000" {
		t.Fatalf("dry run: %d lines (%v), err %v", len(diff), diff[:min(3, len(diff))], err)
	}
	if _, rev, _ := st.Load(ctx); rev != 0 {
		t.Fatalf("a dry run wrote revision %d", rev)
	}
	if _, err := c.Apply(ctx, meshspec.SpecOf(desired), ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	stored, rev, _ := st.Load(ctx)
	if rev != 1 || !equalModels(stored, desired) || !equalModels(pub.last(), desired) || len(pub.models) != 2 {
		t.Fatalf("after apply: revision %d (want 1: one atomic commit), %d backends, %d publishes (want the recovery's and one)", rev, len(stored.Backends), len(pub.models))
	}
	if diff, err := c.Apply(ctx, meshspec.SpecOf(desired), ApplyOptions{}); err != nil || len(diff) != 0 {
		t.Fatalf("re-apply: %v, %v; want no differences", diff, err)
	}
	// Shrinking, in one commit too.
	small := &meshspec.Model{Backends: desired.Backends[:1], Endpoints: desired.Endpoints[:1]}
	if _, err := c.Apply(ctx, meshspec.SpecOf(small), ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if stored, _, _ := st.Load(ctx); !equalModels(stored, small) {
		t.Fatalf("after shrinking apply: %d backends", len(stored.Backends))
	}
}

func equalModels(a, b *meshspec.Model) bool {
	return store.Diff(a, b).Size() == 0
}

// TestOperationResultsAreCounted: a repeated operation counts as
// "unchanged", not "ok", and a refused one by its error kind.
func TestOperationResultsAreCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Store: store.NewMemory(),
		Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }, Registerer: reg})
	ctx := context.Background()
	if err := c.Lead(ctx, "self:1"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(backend("v1"))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpec{Name: "bad name!"}); err == nil {
		t.Fatal("an invalid backend was accepted")
	}
	for result, want := range map[string]float64{"ok": 1, "unchanged": 1, "invalid": 1} {
		got, err := counterValue(reg, "servemesh_controller_operations_total", map[string]string{"result": result})
		if err != nil || got != want {
			t.Errorf("operations with result %q: %v (%v), want %v", result, got, err, want)
		}
	}
}

// counterValue reads one counter series; a missing series is an error, not 0.
func counterValue(reg *prometheus.Registry, name string, labels map[string]string) (float64, error) {
	families, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue(), nil
		}
	}
	return 0, fmt.Errorf("no series %s%v", name, labels)
}

// blockingStore holds every Commit until release is closed.
type blockingStore struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) Commit(ctx context.Context, rev store.Revision, c store.Change) (store.Revision, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.Store.Commit(ctx, rev, c)
}

// TestReadsNeverWaitForWrites: while a write holds the write lock in the
// middle of its checkpoint, reads answer from the last adopted state.
func TestReadsNeverWaitForWrites(t *testing.T) {
	ctx := context.Background()
	st := &blockingStore{Store: store.NewMemory(), entered: make(chan struct{}), release: make(chan struct{})}
	c, _ := newLeader(t, st)
	done := make(chan error, 1)
	go func() { _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(backend("v1"))); done <- err }()
	<-st.entered // the write is inside its checkpoint, holding the lock
	read := make(chan int, 1)
	go func() {
		m, _ := c.State()
		leading, _ := c.Leader()
		if _, err := c.GetBackend("v1"); KindOf(err) != NotFound || !leading {
			read <- -1
			return
		}
		read <- len(m.Backends)
	}()
	select {
	case n := <-read:
		if n != 0 {
			t.Fatalf("a read during a write saw %d backends (or failed); want the last adopted state, with none", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read waited for a write in progress")
	}
	close(st.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m, _ := c.State(); len(m.Backends) != 1 {
		t.Fatalf("after the write: %d backends", len(m.Backends))
	}
}

// TestCommandsNeedAuthority: storing a new or changed process spec needs
// MayRunCommands; the check compares whole specs (an env change with the
// same command is a change), runs under the write lock on every path
// (create, apply, dry run), and a refused change stores nothing.
func TestCommandsNeedAuthority(t *testing.T) {
	write := context.Background()
	exec := MayRunCommands(write)
	c, _ := newLeader(t, store.NewMemory())
	p := meshspec.BackendSpec{Name: "p", Process: &meshspec.ProcessSpec{Command: "/srv/model", Args: []string{"--port", "${PORT}"}}}
	_, err := c.CreateBackend(write, p)
	mustKind(t, err, Forbidden, "exec scope")
	changed, err := c.CreateBackend(exec, p)
	mustChange(t, changed, err)
	if changed, err := c.CreateBackend(write, p); err != nil || changed {
		t.Fatalf("creating the same backend again needs no authority: changed=%v err=%v", changed, err)
	}
	n := 8
	changed, err = c.UpdateBackendConfig(write, "p", meshspec.BackendConfigPatch{MaxConcurrentQueries: &n})
	mustChange(t, changed, err)
	same := &meshspec.Spec{Backends: []meshspec.BackendSpec{p}}
	if _, err := c.Apply(write, same, ApplyOptions{}); err != nil {
		t.Fatalf("an apply with the stored spec needs no authority: %v", err)
	}
	for name, change := range map[string]func(*meshspec.ProcessSpec){
		"env":     func(s *meshspec.ProcessSpec) { s.Env = map[string]string{"LD_PRELOAD": "/tmp/x.so"} },
		"args":    func(s *meshspec.ProcessSpec) { s.Args = append(s.Args, "--evil") },
		"command": func(s *meshspec.ProcessSpec) { s.Command = "/bin/sh" },
		"health":  func(s *meshspec.ProcessSpec) { s.HealthPath = "/x" },
	} {
		changed := meshspec.SpecOf(same.Model())
		change(changed.Backends[0].Process)
		for _, dry := range []bool{true, false} {
			_, err := c.Apply(write, changed, ApplyOptions{DryRun: dry})
			mustKind(t, err, Forbidden, `backend "p"`)
		}
		got, _ := c.GetBackend("p")
		if !reflect.DeepEqual(got.Process, p.Process) {
			t.Fatalf("%s: a refused apply changed the stored spec to %+v", name, got.Process)
		}
	}
}

// TestEnvValuesAreNoOracle: a write token applying (or dry-running) a spec
// whose environment matched the stored one was accepted, and one that did
// not was refused, so it could confirm a guessed secret (issue 34). Now any
// value it writes is refused alike; the placeholder it reads keeps the
// stored value.
func TestEnvValuesAreNoOracle(t *testing.T) {
	write := context.Background()
	exec := MayRunCommands(write)
	c, _ := newLeader(t, store.NewMemory())
	spec := func(v string) *meshspec.Spec {
		return &meshspec.Spec{Backends: []meshspec.BackendSpec{{Name: "p", Process: &meshspec.ProcessSpec{Command: "/srv/model", Env: map[string]string{"API_KEY": v}}}}}
	}
	if changes, err := c.Apply(exec, spec("s3cret"), ApplyOptions{}); err != nil || len(changes) == 0 {
		t.Fatalf("the exec token's apply: %v, %v", changes, err)
	}
	for _, dry := range []bool{true, false} {
		for _, guess := range []string{"s3cret", "wrong"} {
			_, err := c.Apply(write, spec(guess), ApplyOptions{DryRun: dry})
			mustKind(t, err, Forbidden, "env API_KEY")
		}
		if changes, err := c.Apply(write, spec(meshspec.RedactedEnv), ApplyOptions{DryRun: dry}); err != nil || len(changes) != 0 {
			t.Fatalf("writing back the placeholder (dry %v): %v, %v; want no change", dry, changes, err)
		}
	}
	if changes, err := c.Apply(exec, spec(meshspec.RedactedEnv), ApplyOptions{}); err != nil || len(changes) != 0 {
		t.Fatalf("the placeholder from an exec token: %v, %v; want the stored value kept", changes, err)
	}
	if b, _ := c.GetBackend("p"); b.Process.Env["API_KEY"] != "s3cret" {
		t.Fatalf("the stored value became %q", b.Process.Env["API_KEY"])
	}
	// What the controller derives from the stored spec is no caller's
	// claim: a write token's config change and a reconcile go through.
	n := 7
	changed, err := c.UpdateBackendConfig(write, "p", meshspec.BackendConfigPatch{MaxConcurrentQueries: &n})
	mustChange(t, changed, err)
	if err := c.Reconcile(context.Background()); err != nil {
		t.Fatalf("reconcile of a backend with an environment: %v", err)
	}
}

// TestReplicaAddressesOnTheNodeNeedTheOperator: a write token could point a
// public route at Envoy's admin, Consul or the metadata service through a
// static replica; such addresses need the operator's --allow-replica-cidr,
// on every path, and a state accepted under other settings keeps working.
func TestReplicaAddressesOnTheNodeNeedTheOperator(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory()
	c, _ := newLeader(t, st)
	for addr, flag := range map[string]string{"127.0.0.1:15000": meshspec.AllowFlag, "localhost:8500": meshspec.NameFlag, "169.254.169.254:80": meshspec.AllowFlag,
		"0.0.0.0:9001": meshspec.AllowFlag, "[::1]:9001": meshspec.AllowFlag, "metadata.google.internal:80": meshspec.NameFlag, "[fd00:ec2::254]:80": meshspec.AllowFlag} {
		b := meshspec.BackendSpec{Name: "b", Replicas: []meshspec.ReplicaSpec{{Address: "10.0.0.2:80"}, {Address: addr}}}
		_, err := c.CreateBackend(ctx, b)
		mustKind(t, err, Invalid, flag)
		mustKind(t, err, Invalid, "replicas[1]")
		for _, dry := range []bool{true, false} {
			_, err = c.Apply(ctx, &meshspec.Spec{Backends: []meshspec.BackendSpec{b}}, ApplyOptions{DryRun: dry})
			mustKind(t, err, Invalid, flag)
		}
	}
	if m, _ := c.State(); len(m.Backends) != 0 {
		t.Fatalf("refused writes stored %+v", m.Backends)
	}
	allowing := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Store: st, Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil },
		Addresses: meshspec.AddressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	if err := allowing.Lead(ctx, "self"); err != nil {
		t.Fatal(err)
	}
	changed, err := allowing.CreateBackend(ctx, meshspec.BackendSpec{Name: "local", Replicas: []meshspec.ReplicaSpec{{Address: "127.0.0.1:9001"}}})
	mustChange(t, changed, err)
	// A controller without the setting leads the stored state and takes
	// writes that add no such address.
	c, _ = newLeader(t, st)
	changed, err = c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "e", Traffic: map[string]float64{"local": 1}})
	mustChange(t, changed, err)
	_, err = c.Apply(ctx, &meshspec.Spec{Backends: []meshspec.BackendSpec{{Name: "local", Replicas: []meshspec.ReplicaSpec{{Address: "127.0.0.1:9001"}, {Address: "127.0.0.1:9002"}}}}}, ApplyOptions{DryRun: true})
	mustKind(t, err, Invalid, `"127.0.0.1:9002"`)
}

// TestDeleteNamesEveryUse: a backend still in use is refused naming every
// endpoint that uses it, and how.
func TestDeleteNamesEveryUse(t *testing.T) {
	c, _ := newLeader(t, store.NewMemory())
	ctx := context.Background()
	for _, b := range []string{"v1", "v2"} {
		_, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(backend(b)))
		mustChange(t, true, err)
	}
	for _, e := range []meshspec.Endpoint{
		{Name: "a", Route: "/a", Traffic: map[string]float64{"v1": 1}},
		{Name: "b", Route: "/b", Traffic: map[string]float64{"v1": 1}},
		{Name: "c", Route: "/c", Traffic: map[string]float64{"v2": 1}, Shadows: map[string]float64{"v1": 0.1}},
		{Name: "d", Route: "/d", ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{"m": {Traffic: map[string]float64{"v2": 1}, Shadows: map[string]float64{"v1": 0.5}}}}},
	} {
		_, err := c.CreateEndpoint(ctx, e)
		mustChange(t, true, err)
	}
	_, err := c.DeleteBackend(ctx, "v1")
	mustKind(t, err, Conflict, `backend "v1" cannot be deleted: it is in the traffic of endpoints "a", "b", "d", and endpoint "c" mirrors requests to it; take it out of that traffic and set those shadows to 0 first`)
}

// plaintextLeader is a controller of a mesh without mTLS (--plaintext),
// leading, on st.
func plaintextLeader(t *testing.T, st store.Store) *Controller {
	t.Helper()
	c := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Store: st, Publish: func(*meshspec.Model, meshspec.Revision, meshspec.Touched) error { return nil }, Plaintext: true})
	if err := c.Lead(MayRunCommands(context.Background()), "self:1"); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPlaintextMeshRefusesLoadAware: a mesh without mTLS has no picker in
// front of its replicas, so load_aware would be accepted and do nothing
// (it was); such a controller refuses it on every path, naming the field
// and the fix, stores nothing, and a backend stored with it before leads
// on, its setting reported as not served.
func TestPlaintextMeshRefusesLoadAware(t *testing.T) {
	ctx := MayRunCommands(context.Background())
	st := store.NewMemory()
	plain := func() *Controller { return plaintextLeader(t, st) }
	c := plain()
	aware := meshspec.BackendSpec{Name: "llm", Process: &meshspec.ProcessSpec{Command: "/srv/model"}, Config: meshspec.BackendConfig{LoadAware: &meshspec.LoadAware{}}}
	_, err := c.CreateBackend(ctx, aware)
	mustKind(t, err, Invalid, `backend "llm" config.load_aware`)
	mustKind(t, err, Invalid, "without --plaintext")
	for _, dry := range []bool{true, false} {
		_, err = c.Apply(ctx, &meshspec.Spec{Backends: []meshspec.BackendSpec{aware}}, ApplyOptions{DryRun: dry})
		mustKind(t, err, Invalid, "config.load_aware")
	}
	plainSpec := aware
	plainSpec.Config = meshspec.BackendConfig{}
	changed, err := c.CreateBackend(ctx, plainSpec)
	mustChange(t, changed, err)
	_, err = c.UpdateBackendConfig(ctx, "llm", meshspec.BackendConfigPatch{LoadAware: &meshspec.LoadAwarePatch{}})
	mustKind(t, err, Invalid, "config.load_aware")
	if m, _ := c.State(); m.Backends[0].Config.LoadAware != nil {
		t.Fatalf("a refused patch stored %+v", m.Backends[0].Config)
	}
	if u := c.UnservedSettings(); len(u) != 0 {
		t.Fatalf("unserved settings %q with none stored", u)
	}
	// Stored by a controller with mTLS, the setting stays and is reported.
	mtls, _ := newLeader(t, st)
	_, err = mtls.UpdateBackendConfig(ctx, "llm", meshspec.BackendConfigPatch{LoadAware: &meshspec.LoadAwarePatch{}})
	if err != nil {
		t.Fatal(err)
	}
	c = plain()
	n := 4
	changed, err = c.UpdateBackendConfig(ctx, "llm", meshspec.BackendConfigPatch{MaxConcurrentQueries: &n})
	mustChange(t, changed, err)
	if u := c.UnservedSettings(); len(u) != 1 || !strings.Contains(u[0], "backend llm config.load_aware is not served") {
		t.Fatalf("unserved settings %q; want llm's load_aware", u)
	}
}

// TestPlaintextMeshRefusesModelRewrites: without mTLS no calling node
// runs a picker to rewrite a request's model, so such a controller
// refuses a rewrite new to its endpoint, naming the field and the fix,
// and stores nothing; one stored before leads on, reported as not served.
func TestPlaintextMeshRefusesModelRewrites(t *testing.T) {
	ctx := MayRunCommands(context.Background())
	st := store.NewMemory()
	plain := func() *Controller { return plaintextLeader(t, st) }
	backend := meshspec.BackendSpec{Name: "pool", Process: &meshspec.ProcessSpec{Command: "/srv/model"}}
	chat := func(rewrite map[string]float64) meshspec.Endpoint {
		return meshspec.Endpoint{Name: "chat", Route: "/v1/chat/completions", Methods: []string{"POST"}, ModelRouting: &meshspec.ByModel{
			Models: map[string]meshspec.TrafficPolicy{"assistant": {Traffic: map[string]float64{"pool": 1}, Rewrite: rewrite}}}}
	}
	rewrite := map[string]float64{"assistant-v1": 0.5, "assistant-v2": 0.5}
	c := plain()
	for _, dry := range []bool{true, false} {
		_, err := c.Apply(ctx, &meshspec.Spec{Backends: []meshspec.BackendSpec{backend}, Endpoints: []meshspec.Endpoint{chat(rewrite)}}, ApplyOptions{DryRun: dry})
		mustKind(t, err, Invalid, `endpoint "chat" model_routing.models.assistant.rewrite`)
		mustKind(t, err, Invalid, "without --plaintext")
	}
	changed, err := c.Apply(ctx, &meshspec.Spec{Backends: []meshspec.BackendSpec{backend}, Endpoints: []meshspec.Endpoint{chat(nil)}}, ApplyOptions{})
	mustChange(t, len(changed) > 0, err)
	if u := c.UnservedSettings(); len(u) != 0 {
		t.Fatalf("unserved settings %q with none stored", u)
	}
	mtls, _ := newLeader(t, st)
	if _, err := mtls.Apply(ctx, &meshspec.Spec{Backends: []meshspec.BackendSpec{backend}, Endpoints: []meshspec.Endpoint{chat(rewrite)}}, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	c = plain()
	if u := c.UnservedSettings(); len(u) != 1 || !strings.Contains(u[0], "endpoint chat model_routing.models.assistant.rewrite is not served") {
		t.Fatalf("unserved settings %q; want chat's rewrite", u)
	}
}

// readsCounted is a memory store that counts its whole reads (Load) and
// the waits for a change begun.
type readsCounted struct {
	*store.Memory
	mu              sync.Mutex
	reads, watching int
}

func (s *readsCounted) Load(ctx context.Context) (*meshspec.Model, store.Revision, error) {
	s.count()
	return s.Memory.Load(ctx)
}

func (s *readsCounted) Wait(ctx context.Context, rev store.Revision) (store.Revision, error) {
	s.mu.Lock()
	s.watching++
	s.mu.Unlock()
	return s.Memory.Wait(ctx, rev)
}

func (s *readsCounted) count() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
}

func (s *readsCounted) counted() (reads, watching int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads, s.watching
}

// A controller does not read back what it committed: at 10,000 endpoints
// a whole read of the store is tens of MB decoded, and the leader made one
// after each of its own changes. What another writer commits is still read
// and adopted.
func TestOwnCommitsAreNotReadBack(t *testing.T) {
	st := &readsCounted{Memory: store.NewMemory()}
	c, _ := newLeader(t, st)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; !errors.Is(err, context.Canceled) {
			t.Errorf("Run ended with %v, want its context's end", err)
		}
	}()
	waitFor(t, func() bool { _, watching := st.counted(); return watching > 0 }) // Run waits for changes
	for i := range 5 {
		changed, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(backend(fmt.Sprintf("b%d", i))))
		mustChange(t, changed, err)
	}
	_, rev := c.State()
	foreign := backend("written-elsewhere")
	if _, err := st.Commit(ctx, rev, store.Change{PutBackends: []meshspec.Backend{foreign}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		m, _ := c.State()
		return slices.ContainsFunc(m.Backends, func(b meshspec.Backend) bool { return b.Name == foreign.Name })
	})
	if got, _ := st.counted(); got != 2 {
		t.Fatalf("the store was read whole %d times; want 2: once when the controller started leading, once for the other writer's commit, none for the controller's own five", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPatchEndpoint: an endpoint changed in place, in one change; a route
// another endpoint has, a backend not registered or an invalid field is
// refused and changes nothing.
func TestPatchEndpoint(t *testing.T) {
	ctx := context.Background()
	c, _ := newLeader(t, store.NewMemory())
	for _, b := range []string{"v1", "v2"} {
		if _, err := c.CreateBackend(ctx, meshspec.BackendSpec{Name: b, Replicas: []meshspec.ReplicaSpec{{Address: "10.0.0.1:1"}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range []meshspec.Endpoint{{Name: "a", Route: "/a", Traffic: map[string]float64{"v1": 1}}, {Name: "b", Route: "/b", Traffic: map[string]float64{"v2": 1}}} {
		if _, err := c.CreateEndpoint(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if changed, err := c.PatchEndpoint(ctx, "a", []byte(`{"route": "/a2", "methods": ["POST"], "timeout_s": 30}`)); err != nil || !changed {
		t.Fatalf("patch: %v, %v", changed, err)
	}
	if e, _ := c.GetEndpoint("a"); e.Route != "/a2" || e.Methods[0] != "POST" || e.TimeoutS != 30 || e.Traffic["v1"] != 1 {
		t.Fatalf("after the patch: %+v", e)
	}
	if changed, err := c.PatchEndpoint(ctx, "a", []byte(`{"route": "/a2"}`)); err != nil || changed {
		t.Fatalf("the same patch again: %v, %v; want no change", changed, err)
	}
	rev := c.Revision()
	_, err := c.PatchEndpoint(ctx, "a", []byte(`{"route": "/b"}`))
	mustKind(t, err, Conflict, `route "/b" is already registered to endpoint "b"`)
	_, err = c.PatchEndpoint(ctx, "a", []byte(`{"traffic": {"v9": 1, "v1": null}}`))
	mustKind(t, err, Invalid, `backend "v9" that is not registered`)
	_, err = c.PatchEndpoint(ctx, "a", []byte(`{"timeout_s": -1}`))
	mustKind(t, err, Invalid, "timeout_s")
	_, err = c.PatchEndpoint(ctx, "ghost", []byte(`{"route": "/g"}`))
	mustKind(t, err, NotFound, `endpoint "ghost" is not registered`)
	if c.Revision() != rev {
		t.Fatalf("a refused patch stored a change: revision %d -> %d", rev, c.Revision())
	}
}

// TestEndpointPickerIsADestination: an endpoint picker's address is
// checked as a replica's is (a write token could otherwise have every
// node's Envoy send requests, headers and bodies to Consul or the
// metadata service), and a mesh without mTLS refuses the setting; both
// name the field and the fix and store nothing.
func TestEndpointPickerIsADestination(t *testing.T) {
	ctx := MayRunCommands(context.Background())
	st := store.NewMemory()
	c, _ := newLeader(t, st)
	pool := func(addr string) meshspec.BackendSpec {
		return meshspec.BackendSpec{Name: "pool", Process: &meshspec.ProcessSpec{Command: "/srv/model"},
			Config: meshspec.BackendConfig{EndpointPicker: &meshspec.EndpointPicker{Address: addr}}}
	}
	for _, addr := range []string{"127.0.0.1:8500", "169.254.169.254:80", "[::1]:9002"} {
		_, err := c.CreateBackend(ctx, pool(addr))
		mustKind(t, err, Invalid, `backend "pool" config.endpoint_picker.address`)
		mustKind(t, err, Invalid, meshspec.AllowFlag)
	}
	changed, err := c.CreateBackend(ctx, pool("10.0.0.5:9002"))
	mustChange(t, changed, err)
	_, err = c.UpdateBackendConfig(ctx, "pool", meshspec.BackendConfigPatch{EndpointPicker: &meshspec.EndpointPickerPatch{Address: "127.0.0.1:15000"}})
	mustKind(t, err, Invalid, meshspec.AllowFlag)
	if m, _ := c.State(); m.Backends[0].Config.EndpointPicker.Address != "10.0.0.5:9002" {
		t.Fatalf("a refused patch stored %+v", m.Backends[0].Config.EndpointPicker)
	}
	plain := plaintextLeader(t, store.NewMemory())
	_, err = plain.CreateBackend(ctx, pool("10.0.0.5:9002"))
	mustKind(t, err, Invalid, `backend "pool" config.endpoint_picker`)
	mustKind(t, err, Invalid, "without --plaintext")
}
