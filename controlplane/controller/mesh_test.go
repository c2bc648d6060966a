package controller

import (
	"context"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
)

// TestTracingSettings: naming a collector needs the exec scope, its
// sampling alone the write scope; an invalid collector is refused naming
// the field and stores nothing; an endpoint's override needs the mesh's
// tracing, which cannot be removed under it; apply carries the mesh's
// settings and its diff names them.
func TestTracingSettings(t *testing.T) {
	write := context.Background()
	exec := MayRunCommands(write)
	c, pub := newLeader(t, store.NewMemory())
	mustKind(t, func() error { _, err := c.Tracing(); return err }(), NotFound, "servemesh tracing set")

	_, err := c.SetTracing(write, &meshspec.Tracing{Collector: "127.0.0.1:4317"})
	mustKind(t, err, Forbidden, "exec scope")
	_, err = c.SetTracing(exec, &meshspec.Tracing{Collector: "127.0.0.1"})
	mustKind(t, err, Invalid, "mesh.tracing.collector")
	if m, _ := c.State(); m.Mesh != nil {
		t.Fatalf("a refused change stored %+v", m.Mesh)
	}
	changed, err := c.SetTracing(exec, &meshspec.Tracing{Collector: "127.0.0.1:4317"})
	mustChange(t, changed, err)
	hundred := 100.0
	changed, err = c.SetTracing(write, &meshspec.Tracing{Collector: "127.0.0.1:4317", SamplingPercent: &hundred})
	mustChange(t, changed, err) // the same collector: the write scope will do
	if got, err := c.Tracing(); err != nil || got.Sampling() != 100 {
		t.Fatalf("Tracing: %+v, %v", got, err)
	}
	if pub.last().Mesh == nil || pub.last().Mesh.Tracing.Sampling() != 100 {
		t.Fatalf("the published state has no tracing: %+v", pub.last().Mesh)
	}

	changed, err = c.CreateBackend(write, meshspec.BackendSpecOf(backend("v1")))
	mustChange(t, changed, err)
	e := meshspec.Endpoint{Name: "api", Route: "/api", Traffic: map[string]float64{"v1": 1}, Tracing: &meshspec.EndpointTracing{SamplingPercent: 0}}
	changed, err = c.CreateEndpoint(write, e)
	mustChange(t, changed, err)
	_, err = c.SetTracing(exec, nil)
	mustKind(t, err, Invalid, `endpoint "api".tracing: the mesh sends no traces`)

	spec := meshspec.SpecOf(func() *meshspec.Model { m, _ := c.State(); return m }())
	spec.Mesh.Tracing.Collector = "collector.example:4317"
	_, err = c.Apply(write, spec, ApplyOptions{DryRun: true})
	mustKind(t, err, Forbidden, "exec scope")
	diff, err := c.Apply(exec, spec, ApplyOptions{DryRun: true})
	if err != nil || len(diff) != 1 || diff[0].String() != "update mesh settings" || diff[0].Fields[0].Field != "tracing.collector" {
		t.Fatalf("apply's diff: %+v, %v; want the mesh's tracing.collector updated", diff, err)
	}
}

// TestApplyMergeKeepsWhatTheFileDoesNotName: an apply with Merge (a Ray
// Serve config's) replaces and adds the backends and endpoints it names
// and keeps the others and the mesh's settings; without, the file is the
// whole mesh (issue 62, 5: a Ray Serve config's dry run on the demo
// deleted 15 objects, tracing included).
func TestApplyMergeKeepsWhatTheFileDoesNotName(t *testing.T) {
	ctx := MayRunCommands(context.Background()) // the tracing's collector needs the exec scope
	c, _ := newLeader(t, store.NewMemory())
	base := &meshspec.Model{
		Backends:  []meshspec.Backend{{Name: "a", Replicas: []meshspec.Replica{{Address: "10.0.0.1:1"}}}, {Name: "b", Replicas: []meshspec.Replica{{Address: "10.0.0.2:1"}}}},
		Endpoints: []meshspec.Endpoint{{Name: "ea", Route: "/ea", Traffic: map[string]float64{"a": 1}}, {Name: "eb", Route: "/eb", Traffic: map[string]float64{"b": 1}}},
		Mesh:      &meshspec.Mesh{Tracing: &meshspec.Tracing{Collector: "127.0.0.1:4317"}},
	}
	if _, err := c.Apply(ctx, meshspec.SpecOf(base), ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	file := &meshspec.Model{
		Backends:  []meshspec.Backend{{Name: "b", Replicas: []meshspec.Replica{{Address: "10.0.0.3:1"}}}, {Name: "c", Replicas: []meshspec.Replica{{Address: "10.0.0.4:1"}}}},
		Endpoints: []meshspec.Endpoint{{Name: "ec", Route: "/ec", Traffic: map[string]float64{"c": 1}}},
	}
	diff, err := c.Apply(ctx, meshspec.SpecOf(file), ApplyOptions{Merge: true, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, d := range diff {
		lines = append(lines, d.String())
	}
	if got := strings.Join(lines, "; "); got != "update backend b; create backend c; create endpoint ec" {
		t.Fatalf("a merge's dry run: %s", got)
	}
	if _, err := c.Apply(ctx, meshspec.SpecOf(file), ApplyOptions{Merge: true}); err != nil {
		t.Fatal(err)
	}
	m, _ := c.State()
	names := func(m *meshspec.Model) string {
		var out []string
		for _, b := range m.Backends {
			out = append(out, b.Name+"@"+b.Replicas[0].Address)
		}
		for _, e := range m.Endpoints {
			out = append(out, e.Name)
		}
		return strings.Join(out, " ")
	}
	if got := names(m); got != "a@10.0.0.1:1 b@10.0.0.3:1 c@10.0.0.4:1 ea eb ec" || m.Mesh == nil || m.Mesh.Tracing == nil {
		t.Fatalf("after the merge: %s, mesh %+v", got, m.Mesh)
	}
	if diff, err := c.Apply(ctx, meshspec.SpecOf(file), ApplyOptions{DryRun: true}); err != nil || len(diff) != 4 {
		t.Fatalf("without merge the file is the whole mesh: %v, %v; want a, ea, eb and the tracing removed", diff, err)
	}
}
