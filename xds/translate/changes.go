package translate

import (
	"iter"
	"slices"
	"sort"
)

// ResourceKind is a type of resource the builder builds and the xDS server
// caches.
type ResourceKind string

// The kinds of resource a Build declares changes of.
const (
	KindCluster     ResourceKind = "cluster"
	KindAssignment  ResourceKind = "assignment"
	KindRoute       ResourceKind = "route"
	KindScopedRoute ResourceKind = "scoped_route"
)

// ResourceKey names one resource: its kind and its name.
type ResourceKey struct {
	Kind ResourceKind
	Name string
}

// ChangeSet is what one Build changed, in the shape of Istio's
// ConfigsUpdated: every shared resource built anew (its content changed)
// or gone since the last Build. What it does not name is the same
// resource, with the same version, as before; the xDS server invalidates
// its cache of encoded resources by it and takes from it the assignments
// to update and to retire.
type ChangeSet map[ResourceKey]struct{}

func (c ChangeSet) add(kind ResourceKind, names ...string) {
	for _, n := range names {
		c[ResourceKey{kind, n}] = struct{}{}
	}
}

// Has reports whether c names the resource of kind named name.
func (c ChangeSet) Has(kind ResourceKind, name string) bool {
	_, ok := c[ResourceKey{kind, name}]
	return ok
}

// Names are the names c has of kind, sorted.
func (c ChangeSet) Names(kind ResourceKind) []string {
	out := slices.Collect(c.Of(kind))
	sort.Strings(out)
	return out
}

// Of yields the names c has of kind, in no order.
func (c ChangeSet) Of(kind ResourceKind) iter.Seq[string] {
	return func(yield func(string) bool) {
		for k := range c {
			if k.Kind == kind && !yield(k.Name) {
				return
			}
		}
	}
}

// backendChanges adds to c the clusters and assignments of a backend's
// parts, before (nil: new) and after (nil: gone) a rebuild: those that
// are gone or whose version changed.
func backendChanges(c ChangeSet, before, after *backendParts) {
	if before == nil || after == nil || before.hash != after.hash {
		for _, p := range []*backendParts{before, after} {
			if p != nil {
				for _, cl := range p.clusters {
					c.add(KindCluster, cl.GetName())
				}
			}
		}
	}
	versions := map[string]string{}
	if after != nil {
		for _, a := range after.assignments {
			versions[a.Name] = a.Version
		}
	}
	if before != nil {
		for _, a := range before.assignments {
			if v, ok := versions[a.Name]; !ok || v != a.Version {
				c.add(KindAssignment, a.Name)
			}
			delete(versions, a.Name)
		}
	}
	for name := range versions {
		c.add(KindAssignment, name)
	}
}
