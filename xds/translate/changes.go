package translate

import (
	"iter"
	"maps"
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

// ChangeSet is what one Build changed, in the shape of Istio's
// ConfigsUpdated: every shared resource built anew (its content changed)
// or gone since the last Build. What it does not name is the same
// resource, with the same version, as before; the xDS server invalidates
// its cache of encoded resources by it and takes from it the assignments
// to update and to retire. Its names are by kind: a full mTLS publish
// changes tens of thousands of assignments, which the server reads
// alone.
type ChangeSet map[ResourceKind]map[string]struct{}

func (c ChangeSet) add(kind ResourceKind, names ...string) {
	set := c[kind]
	if set == nil {
		set = make(map[string]struct{}, len(names))
		c[kind] = set
	}
	for _, n := range names {
		set[n] = struct{}{}
	}
}

// Has reports whether c names the resource of kind named name.
func (c ChangeSet) Has(kind ResourceKind, name string) bool {
	_, ok := c[kind][name]
	return ok
}

// Names are the names c has of kind, sorted.
func (c ChangeSet) Names(kind ResourceKind) []string {
	out := slices.Collect(c.Of(kind))
	sort.Strings(out)
	return out
}

// Len is how many names c has of kind.
func (c ChangeSet) Len(kind ResourceKind) int { return len(c[kind]) }

// Of yields the names c has of kind, in no order.
func (c ChangeSet) Of(kind ResourceKind) iter.Seq[string] {
	return maps.Keys(c[kind])
}

// changeList is what a rebuild changed of one backend: the names of its
// clusters and assignments, each kind's once.
type changeList struct{ clusters, assignments []string }

// reserve makes room in c for n names of kind, before they are added one
// list after the other (a full mTLS publish changes tens of thousands of
// assignments).
func (c ChangeSet) reserve(kind ResourceKind, n int) {
	if c[kind] == nil && n > 0 {
		c[kind] = make(map[string]struct{}, n)
	}
}

// addAll adds l's names to c.
func (c ChangeSet) addAll(l changeList) {
	if len(l.clusters) > 0 {
		c.add(KindCluster, l.clusters...)
	}
	if len(l.assignments) > 0 {
		c.add(KindAssignment, l.assignments...)
	}
}

// backendChanges are the clusters and assignments of a backend's parts,
// before (nil: new) and after (nil: gone) a rebuild, that are gone or
// whose version changed. It only reads the parts.
func backendChanges(before, after *backendParts) changeList {
	var out changeList
	if before == nil || after == nil || before.hash != after.hash {
		for _, p := range []*backendParts{before, after} {
			if p != nil {
				for _, cl := range p.clusters {
					if name := cl.GetName(); !slices.Contains(out.clusters, name) {
						out.clusters = append(out.clusters, name)
					}
				}
			}
		}
	}
	var prev, next []Encoded
	if before != nil {
		prev = before.assignments
	}
	if after != nil {
		next = after.assignments
	}
	for i, a := range next {
		if p, ok := sameName(prev, i, a.Name); !ok || p.Version != a.Version {
			out.assignments = append(out.assignments, a.Name)
		}
	}
	for i, p := range prev {
		if _, ok := sameName(next, i, p.Name); !ok {
			out.assignments = append(out.assignments, p.Name)
		}
	}
	return out
}

// sameName is the assignment of list named name, looked for first at i: a
// backend rebuilt lists its assignments in the same order (by node) while
// its nodes are the same, and it has few (one, and two a node).
func sameName(list []Encoded, i int, name string) (Encoded, bool) {
	if i < len(list) && list[i].Name == name {
		return list[i], true
	}
	if j := slices.IndexFunc(list, func(e Encoded) bool { return e.Name == name }); j >= 0 {
		return list[j], true
	}
	return Encoded{}, false
}
