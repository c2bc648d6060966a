package controller

import (
	"context"
	"reflect"

	"github.com/servemesh/servemesh/meshspec"
)

// SetTracing sets the mesh's tracing (nil: no tracing, which endpoints that
// override its sampling refuse until theirs is removed). A collector
// receives every traced request's path, method and addresses from every
// node, so naming one needs the exec scope, as a command does; its
// sampling alone needs the write scope.
func (c *Controller) SetTracing(ctx context.Context, t *meshspec.Tracing) (bool, error) {
	return c.mutate(ctx, "mesh_tracing", func(m *meshspec.Model) error {
		mesh := meshspec.Mesh{}
		if m.Mesh != nil {
			mesh = *m.Mesh
		}
		mesh.Tracing = t
		if reflect.DeepEqual(mesh, meshspec.Mesh{}) {
			m.Mesh = nil
		} else {
			m.Mesh = &mesh
		}
		return nil
	})
}

// Tracing returns the mesh's tracing, or a NotFound error if it has none.
func (c *Controller) Tracing() (*meshspec.Tracing, error) {
	m := c.adopted.Load().model // read, never written: a copy of the part alone
	if m == nil || m.Mesh == nil || m.Mesh.Tracing == nil {
		return nil, errorf(NotFound, "the mesh sends no traces; give it a collector with servemesh tracing set --collector HOST:PORT")
	}
	t := *m.Mesh.Tracing
	if t.SamplingPercent != nil {
		p := *t.SamplingPercent
		t.SamplingPercent = &p
	}
	return &t, nil
}

// checkCollector refuses a collector new to the mesh without the exec
// scope: where every node sends its spans is the operator's to choose.
func checkCollector(ctx context.Context, current, next *meshspec.Model) error {
	collector := func(m *meshspec.Model) string {
		if m.Mesh == nil || m.Mesh.Tracing == nil {
			return ""
		}
		return m.Mesh.Tracing.Collector
	}
	if to := collector(next); to != "" && to != collector(current) && !mayRunCommands(ctx) {
		return errorf(Forbidden, "mesh.tracing.collector %q: every node sends its traced requests' paths, methods and addresses there, "+
			"so naming a collector needs a token with the exec scope (--token-file)", to)
	}
	return nil
}
