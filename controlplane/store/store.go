package store

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sort"

	"github.com/servemesh/servemesh/meshspec"
)

// SchemaVersion is the version of the stored JSON format.
const SchemaVersion = 1

// ErrConflict means the store moved past the revision a commit expected:
// someone else wrote first. Reload and retry.
var ErrConflict = errors.New("store: the stored state changed since it was read")

// ErrNewerWriter is returned by Commit when a controller of a newer
// protocol wrote the stored state last.
var ErrNewerWriter = errors.New("store: the stored state is of a newer servemesh")

// Revision identifies one committed state (meshspec.Revision).
type Revision = meshspec.Revision

// Change is one atomic checkpoint, of any size: objects to write and names
// to delete.
type Change struct {
	PutBackends []meshspec.Backend `json:"put_backends,omitempty"`
	// PutRetiring writes retiring backends (meshspec.Model.Retiring),
	// under the same keys as backends: a backend moving between the two is
	// written, never deleted; DeleteBackends deletes either.
	PutRetiring     []meshspec.Backend  `json:"put_retiring,omitempty"`
	DeleteBackends  []string            `json:"delete_backends,omitempty"`
	PutEndpoints    []meshspec.Endpoint `json:"put_endpoints,omitempty"`
	DeleteEndpoints []string            `json:"delete_endpoints,omitempty"`
	PutNodes        []meshspec.NodeSpec `json:"put_nodes,omitempty"`
	DeleteNodes     []string            `json:"delete_nodes,omitempty"`
	// PutMesh replaces the mesh's settings; DeleteMesh clears them.
	PutMesh    *meshspec.Mesh `json:"put_mesh,omitempty"`
	DeleteMesh bool           `json:"delete_mesh,omitempty"`
}

// Touched names what c touches (meshspec.Touched): a change of the nodes
// or of the mesh's settings touches the whole state.
func (c Change) Touched() meshspec.Touched {
	if len(c.PutNodes) > 0 || len(c.DeleteNodes) > 0 || c.PutMesh != nil || c.DeleteMesh {
		return meshspec.WholeState
	}
	var t meshspec.Touched
	for _, list := range [][]meshspec.Backend{c.PutBackends, c.PutRetiring} {
		for _, b := range list {
			t.Backends = append(t.Backends, b.Name)
		}
	}
	t.Backends = append(t.Backends, c.DeleteBackends...)
	for _, e := range c.PutEndpoints {
		t.Endpoints = append(t.Endpoints, e.Name)
	}
	t.Endpoints = append(t.Endpoints, c.DeleteEndpoints...)
	return t
}

// Size is the number of objects the change touches.
func (c Change) Size() int {
	n := len(c.PutBackends) + len(c.PutRetiring) + len(c.DeleteBackends) + len(c.PutEndpoints) + len(c.DeleteEndpoints) + len(c.PutNodes) + len(c.DeleteNodes)
	if c.PutMesh != nil || c.DeleteMesh {
		n++
	}
	return n
}

// Store persists the desired state.
type Store interface {
	Reader
	// Commit applies change atomically, whatever its size, if the store is
	// still at rev, and returns the new revision. It returns ErrConflict
	// otherwise; after any error the stored state is the old one or, if
	// the error says so (ErrCommitted), the new one.
	Commit(ctx context.Context, rev Revision, change Change) (Revision, error)
	// Settle finishes a commit a crashed writer left half-applied and
	// clears what writers left behind; the leader calls it before writing.
	Settle(ctx context.Context) error
	// Unreadable lists what the last Load had to leave out, and why.
	Unreadable() []Unreadable
}

// Reader is what reads the stored state and never writes it: the agents'
// view of the store (meshspec.StateReader, which the node side reads it
// through without importing the controller's tree).
type Reader = meshspec.StateReader

// Unreadable is a stored key Load could not read: unknown, malformed, of
// another schema, or naming a backend that cannot be read. It is left
// untouched, reported, and kept out of the state.
type Unreadable struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
	// Backend is, for an endpoint left out because it names a backend the
	// state lacks, that backend: a commit that stores it makes the
	// endpoint readable.
	Backend string `json:"backend,omitempty"`
}

// ErrCommitted wraps an error that came after a commit's point of no
// return: the change is stored, and Settle (or the next leader) finishes
// applying it.
var ErrCommitted = errors.New("store: the change is committed")

// ErrTooLarge means one object is larger than the store holds.
var ErrTooLarge = errors.New("store: an object is too large")

// Diff returns the change that turns from into to.
func Diff(from, to *meshspec.Model) Change {
	var c Change
	backendName := func(b meshspec.Backend) string { return b.Name }
	var gone, retired []string
	c.PutBackends, gone = diffByName(from.Backends, to.Backends, backendName, meshspec.BackendsEqual)
	c.PutRetiring, retired = diffByName(from.Retiring, to.Retiring, backendName, meshspec.BackendsEqual)
	for _, n := range append(gone, retired...) {
		_, live := to.Backend(n)
		if !live && !slices.ContainsFunc(to.Retiring, func(b meshspec.Backend) bool { return b.Name == n }) {
			c.DeleteBackends = append(c.DeleteBackends, n) // in neither list now: its key goes
		}
	}
	sort.Strings(c.DeleteBackends)
	c.PutEndpoints, c.DeleteEndpoints = diffByName(from.Endpoints, to.Endpoints,
		func(e meshspec.Endpoint) string { return e.Name }, meshspec.EndpointsEqual)
	c.PutNodes, c.DeleteNodes = diffByName(from.Nodes, to.Nodes,
		func(n meshspec.NodeSpec) string { return n.Name }, func(a, b meshspec.NodeSpec) bool { return reflect.DeepEqual(a, b) })
	if !reflect.DeepEqual(from.Mesh, to.Mesh) {
		if to.Mesh == nil || *to.Mesh == (meshspec.Mesh{}) {
			c.DeleteMesh = from.Mesh != nil
		} else {
			c.PutMesh = to.Mesh
		}
	}
	return c
}

// diffByName returns the items of to that are new or differ from their
// namesake in from, in to's order, and the sorted names only from has.
func diffByName[T any](from, to []T, name func(T) string, equal func(a, b T) bool) (put []T, deleted []string) {
	old := make(map[string]T, len(from))
	for _, x := range from {
		old[name(x)] = x
	}
	kept := make(map[string]bool, len(to))
	for _, x := range to {
		kept[name(x)] = true
		if prev, ok := old[name(x)]; !ok || !equal(prev, x) {
			put = append(put, x)
		}
	}
	for _, x := range from {
		if !kept[name(x)] {
			deleted = append(deleted, name(x))
		}
	}
	sort.Strings(deleted)
	return put, deleted
}

// Apply returns m with change applied, objects sorted by name; m is not
// modified.
func Apply(m *meshspec.Model, c Change) *meshspec.Model {
	backends, retiring := map[string]meshspec.Backend{}, map[string]meshspec.Backend{}
	for _, b := range m.Backends {
		backends[b.Name] = b
	}
	for _, b := range m.Retiring {
		retiring[b.Name] = b
	}
	for _, b := range c.PutBackends {
		backends[b.Name] = b
		delete(retiring, b.Name) // one key holds either
	}
	for _, b := range c.PutRetiring {
		retiring[b.Name] = b
		delete(backends, b.Name)
	}
	for _, n := range c.DeleteBackends {
		delete(backends, n)
		delete(retiring, n)
	}
	endpoints := map[string]meshspec.Endpoint{}
	for _, e := range m.Endpoints {
		endpoints[e.Name] = e
	}
	for _, e := range c.PutEndpoints {
		endpoints[e.Name] = e
	}
	for _, n := range c.DeleteEndpoints {
		delete(endpoints, n)
	}
	nodes := map[string]meshspec.NodeSpec{}
	for _, n := range m.Nodes {
		nodes[n.Name] = n
	}
	for _, n := range c.PutNodes {
		nodes[n.Name] = n
	}
	for _, n := range c.DeleteNodes {
		delete(nodes, n)
	}
	out := &meshspec.Model{Mesh: m.Mesh}
	switch {
	case c.PutMesh != nil:
		out.Mesh = c.PutMesh
	case c.DeleteMesh:
		out.Mesh = nil
	}
	for _, n := range meshspec.SortedKeys(nodes) {
		out.Nodes = append(out.Nodes, nodes[n])
	}
	for _, n := range meshspec.SortedKeys(backends) {
		out.Backends = append(out.Backends, backends[n])
	}
	for _, n := range meshspec.SortedKeys(retiring) {
		out.Retiring = append(out.Retiring, retiring[n])
	}
	for _, n := range meshspec.SortedKeys(endpoints) {
		out.Endpoints = append(out.Endpoints, endpoints[n])
	}
	return out
}
