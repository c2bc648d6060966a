package translate

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/servemesh/servemesh/wire"
)

// patchRoutes makes out's routes from the last build's by putting in the
// mesh routes and public tables of the endpoints this build rebuilt, when
// that is all that changed: no endpoint came or went, and none moved its
// route or changed its scope (a traffic set, a retry policy). A change then
// costs the endpoints it touched, not a pass over every endpoint's parts
// and every route key's table (assembleRoutes). It reports false, having
// done nothing, when it cannot; and with the cache off, so that an
// uncached build assembles every route whole (the oracle it is tested
// against).
func (b *Builder) patchRoutes(out *Built, s endpointSync) (bool, error) {
	last := b.last
	if last == nil || !b.cache.On() || s.added || s.removed {
		return false, nil
	}
	if len(s.edited) == 0 {
		out.Routes, out.ScopedRoutes, out.RoutesVersion, out.ScopesVersion = last.Routes, last.ScopedRoutes, last.RoutesVersion, last.ScopesVersion
		out.EncodedScopes, out.ScopeVersions, out.RouteClusters, out.meshRoutes = last.EncodedScopes, last.ScopeVersions, last.RouteClusters, last.meshRoutes
		return true, nil
	}
	for _, e := range s.edited {
		if e.before.endpoint.Route != e.after.endpoint.Route || e.before.encodedScope.Version != e.after.encodedScope.Version {
			return false, nil
		}
	}
	out.Routes = slices.Clone(last.Routes)
	mesh := out.Routes[:last.meshRoutes]
	out.RouteClusters = last.RouteClusters
	cloned := false // out.RouteClusters is a copy of last's
	keys := map[string]bool{}
	for _, e := range s.edited {
		i, found := slices.BinarySearchFunc(mesh, e.after.mesh.Name, func(r Encoded, name string) int { return strings.Compare(r.Name, name) })
		if !found {
			return false, nil // not where the last assembly put it: assemble whole
		}
		mesh[i] = e.after.mesh
		if !slices.Equal(e.before.meshClusters, e.after.meshClusters) {
			if !cloned {
				out.RouteClusters, cloned = maps.Clone(last.RouteClusters), true
			}
			out.RouteClusters[e.after.mesh.Name] = e.after.meshClusters
		}
		if e.after.publicHash != "" && e.before.publicHash != e.after.publicHash {
			keys[wire.PublicRouteKey(e.after.endpoint.Route)] = true
		}
	}
	for key := range keys {
		if err := b.patchTable(out, key); err != nil {
			return false, err
		}
	}
	all := newKindHash()
	for _, r := range out.Routes {
		all.add(r.Name, r.Version)
	}
	out.RoutesVersion, out.meshRoutes = all.sum(), last.meshRoutes
	out.ScopedRoutes, out.EncodedScopes, out.ScopeVersions, out.ScopesVersion = last.ScopedRoutes, last.EncodedScopes, last.ScopeVersions, last.ScopesVersion
	return true, nil
}

// patchTable puts route key's table, made again from its members' parts
// now, in out.Routes in place of the last one.
func (b *Builder) patchTable(out *Built, key string) error {
	lastTable := b.tables.Last(key)
	members := make([]*endpointParts, len(lastTable.members))
	for i, name := range lastTable.members {
		members[i] = b.endpoints.Last(name)
	}
	g, err := b.tableFor(key, members, out.Changed)
	if err != nil {
		return err
	}
	public := out.Routes[b.last.meshRoutes:]
	i := slices.IndexFunc(public, func(r Encoded) bool { return r.Name == g.table.Name })
	if i < 0 {
		return fmt.Errorf("public route table %q: not in the last build's routes", g.table.Name) // a bug: Build starts over
	}
	public[i] = g.table
	return nil
}
