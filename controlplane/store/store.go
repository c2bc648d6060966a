package store

import (
	"context"
	"errors"
	"sort"

	"github.com/servemesh/servemesh/controlplane/model"
)

// SchemaVersion is the version of the stored JSON format.
const SchemaVersion = 1

// MaxChangeObjects is how many backends and endpoints one Change may write or
// delete: a Consul transaction holds 64 operations and one checks the meta key.
const MaxChangeObjects = 63

// ErrConflict means the store moved past the revision a commit expected:
// someone else wrote first. Reload and retry.
var ErrConflict = errors.New("store: the stored state changed since it was read")

// Revision identifies one committed state. It only grows; 0 is "never written".
type Revision uint64

// Change is one atomic checkpoint: objects to write and names to delete.
type Change struct {
	PutBackends     []model.Backend
	DeleteBackends  []string
	PutEndpoints    []model.Endpoint
	DeleteEndpoints []string
}

// Size is the number of objects the change touches.
func (c Change) Size() int {
	return len(c.PutBackends) + len(c.DeleteBackends) + len(c.PutEndpoints) + len(c.DeleteEndpoints)
}

// Store persists the desired state.
type Store interface {
	// Load returns the stored model and its revision; an empty model at
	// revision 0 if nothing was ever stored.
	Load(ctx context.Context) (*model.Model, Revision, error)
	// Commit applies change atomically if the store is still at rev, and
	// returns the new revision. It returns ErrConflict otherwise.
	Commit(ctx context.Context, rev Revision, change Change) (Revision, error)
	// Watch blocks until the store's revision differs from rev, then returns
	// the new model and revision. It returns ctx's error when ctx ends.
	Watch(ctx context.Context, rev Revision) (*model.Model, Revision, error)
}

// Diff returns the change that turns from into to.
func Diff(from, to *model.Model) Change {
	var c Change
	c.PutBackends, c.DeleteBackends = diffByName(from.Backends, to.Backends,
		func(b model.Backend) string { return b.Name }, model.BackendsEqual)
	c.PutEndpoints, c.DeleteEndpoints = diffByName(from.Endpoints, to.Endpoints,
		func(e model.Endpoint) string { return e.Name }, model.EndpointsEqual)
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

// Split cuts a change into commits of at most MaxChangeObjects objects, in an
// order that keeps each intermediate state valid where possible: removed
// endpoints go first (freeing their routes and backends), then backends are
// written, then endpoints that may use them, and last the backends no longer
// used are deleted.
func Split(c Change) []Change {
	if c.Size() <= MaxChangeObjects {
		return []Change{c}
	}
	var out []Change
	cur := Change{}
	flush := func() {
		if cur.Size() == MaxChangeObjects {
			out = append(out, cur)
			cur = Change{}
		}
	}
	for _, n := range c.DeleteEndpoints {
		cur.DeleteEndpoints = append(cur.DeleteEndpoints, n)
		flush()
	}
	for _, b := range c.PutBackends {
		cur.PutBackends = append(cur.PutBackends, b)
		flush()
	}
	for _, e := range c.PutEndpoints {
		cur.PutEndpoints = append(cur.PutEndpoints, e)
		flush()
	}
	for _, n := range c.DeleteBackends {
		cur.DeleteBackends = append(cur.DeleteBackends, n)
		flush()
	}
	if cur.Size() > 0 {
		out = append(out, cur)
	}
	return out
}

// Apply returns m with change applied, objects sorted by name; m is not
// modified.
func Apply(m *model.Model, c Change) *model.Model {
	backends := map[string]model.Backend{}
	for _, b := range m.Backends {
		backends[b.Name] = b
	}
	for _, b := range c.PutBackends {
		backends[b.Name] = b
	}
	for _, n := range c.DeleteBackends {
		delete(backends, n)
	}
	endpoints := map[string]model.Endpoint{}
	for _, e := range m.Endpoints {
		endpoints[e.Name] = e
	}
	for _, e := range c.PutEndpoints {
		endpoints[e.Name] = e
	}
	for _, n := range c.DeleteEndpoints {
		delete(endpoints, n)
	}
	out := &model.Model{}
	for _, n := range model.SortedKeys(backends) {
		out.Backends = append(out.Backends, backends[n])
	}
	for _, n := range model.SortedKeys(endpoints) {
		out.Endpoints = append(out.Endpoints, endpoints[n])
	}
	return out
}
