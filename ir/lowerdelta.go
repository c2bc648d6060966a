package ir

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/servemesh/servemesh/meshspec"
)

// LowerDelta returns the IR of state, as Lower does, from prev, the IR of
// the state before the change d names (d follows prev.Seq, and is not
// All): only the backends and the endpoints d names are lowered again,
// the backends with the replicas replicas has of them, and with them the
// endpoints that read a changed backend (Backend.readByEndpoints: one
// reached by its prompts' prefixes, whose nodes they carry, or one with a
// first-byte timeout, which they take). The result shares the rest with prev,
// which it does not modify; its Changes is d with those endpoints added,
// and it is validated as far as d changed it (what prev had was). The
// tracing settings are prev's: a change of the mesh's settings is All.
func LowerDelta(prev *DataPlane, state *meshspec.Model, replicas map[string][]meshspec.Replica, d *Delta, o Options) (*DataPlane, error) {
	if !d.Follows(prev.Seq) {
		return nil, fmt.Errorf("lower a delta: it does not follow data plane %d", prev.Seq)
	}
	out := &DataPlane{Revision: prev.Revision, Tracing: prev.Tracing,
		Changes: &Delta{Since: d.Since, Backends: maps.Clone(d.Backends)}}
	var read, gone bool
	out.Backends, read, gone = lowerNamedBackends(prev, state, replicas, d, o)
	endpoints := d.Endpoints
	if read || gone {
		endpoints = readers(prev, out, d)
	}
	out.Changes.Endpoints = endpoints
	out.Endpoints = lowerNamedEndpoints(prev, out, state, endpoints, o)
	if err := out.validateDelta(out.Changes, gone); err != nil { // as ValidateSince(prev)
		return nil, fmt.Errorf("the view cannot be served: %w", err)
	}
	return out, nil
}

// lowerNamedBackends is prev's backends with those d names lowered again
// from state, added or dropped, sorted; it reports whether a backend
// endpoints read changed and whether one went.
func lowerNamedBackends(prev *DataPlane, state *meshspec.Model, replicas map[string][]meshspec.Replica, d *Delta, o Options) (out []Backend, read, gone bool) {
	lowered := make(map[string]Backend, len(d.Backends))
	for _, b := range state.Served() {
		if _, ok := d.Backends[b.Name]; !ok {
			continue
		}
		if rs, ok := replicas[b.Name]; ok {
			b.Replicas = rs // b is a copy: state keeps its own
		}
		lowered[b.Name] = lowerBackend(b, o)
		read = read || lowered[b.Name].readByEndpoints()
	}
	out = make([]Backend, 0, len(prev.Backends)+len(lowered))
	for _, b := range prev.Backends {
		if _, named := d.Backends[b.Name]; !named {
			out = append(out, b)
			continue
		}
		read = read || b.readByEndpoints()
		if next, ok := lowered[b.Name]; ok {
			out = append(out, next)
			delete(lowered, b.Name)
		} else {
			gone = true
		}
	}
	for _, b := range lowered { // new
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b Backend) int { return strings.Compare(a.Name, b.Name) })
	return out, read, gone
}

// readers are the endpoints d names and those of prev or next that send to
// a backend d names.
func readers(prev, next *DataPlane, d *Delta) map[string]struct{} {
	out := make(map[string]struct{}, len(d.Endpoints))
	for n := range d.Endpoints {
		out[n] = struct{}{}
	}
	for _, dp := range []*DataPlane{prev, next} {
		for _, e := range dp.Endpoints {
			for _, b := range e.backends() {
				if _, ok := d.Backends[b]; ok {
					out[e.Name] = struct{}{}
					break
				}
			}
		}
	}
	return out
}

// lowerNamedEndpoints is prev's endpoints with those named lowered again
// from state in dp (whose backends are lowered), added or dropped, sorted.
func lowerNamedEndpoints(prev, dp *DataPlane, state *meshspec.Model, named map[string]struct{}, o Options) []Endpoint {
	lowered := make(map[string]Endpoint, len(named))
	for _, e := range state.Endpoints {
		if _, ok := named[e.Name]; ok {
			lowered[e.Name] = dp.lowerEndpoint(state.Mesh, e, o)
		}
	}
	out := make([]Endpoint, 0, len(prev.Endpoints)+len(lowered))
	for _, e := range prev.Endpoints {
		if _, ok := named[e.Name]; !ok {
			out = append(out, e)
		} else if next, ok := lowered[e.Name]; ok {
			out = append(out, next)
			delete(lowered, e.Name)
		}
	}
	for _, e := range lowered { // new
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Endpoint) int { return strings.Compare(a.Name, b.Name) })
	return out
}
