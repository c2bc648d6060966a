package controller

import (
	"context"
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
