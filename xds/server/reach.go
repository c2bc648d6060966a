package server

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

	"github.com/servemesh/servemesh/wire"
)

// reachKinds are the routes, scopes and clusters of the nodes that reach
// the same endpoints (wire.ProxyNode.Reachable), cut from the shared
// kinds: the mesh routes and scopes of those endpoints, the public ones if
// the nodes have a public listener, and the clusters of the backends the
// mesh routes name (every cluster for a public node, whose table names
// every routed endpoint's). A cut is made again only when the kind it was
// cut from changed, so nodes that reach the same endpoints share it.
type reachKinds struct {
	routesFrom, scopesFrom, clustersFrom *kind
	routes, scopes, clusters             *kind
}

// reachKey names a node's reach: its endpoints, and whether it is public.
func reachKey(node wire.ProxyNode) string {
	return fmt.Sprintf("%t/%s", node.Public(), strings.Join(node.Reachable, ","))
}

// reachFor returns the kinds of a node that reaches only some endpoints.
func (sr *sharedResources) reachFor(node wire.ProxyNode) *reachKinds {
	key := reachKey(node)
	rk := sr.reach[key]
	if rk == nil {
		rk = &reachKinds{}
		sr.reach[key] = rk
	}
	meshNames := make([]string, len(node.Reachable))
	for i, e := range node.Reachable {
		meshNames[i] = wire.MeshRouteName(e)
	}
	routesChanged := rk.routesFrom != sr.routes
	if routesChanged {
		names := meshNames
		if node.Public() {
			names = append(names[:len(names):len(names)], sr.routes.publicNames()...)
		}
		rk.routes, rk.routesFrom = sr.routes.subset(names), sr.routes
	}
	if rk.scopesFrom != sr.scopes {
		names := meshNames
		if node.Public() {
			names = append(names[:len(names):len(names)], sr.scopes.publicNames()...)
		}
		rk.scopes, rk.scopesFrom = sr.scopes.subset(names), sr.scopes
	}
	if routesChanged || rk.clustersFrom != sr.clusters {
		rk.clusters, rk.clustersFrom = sr.clusters, sr.clusters
		if !node.Public() {
			rk.clusters = sr.clusters.subset(sr.clusterNames(meshNames))
		}
	}
	return rk
}

// clusterNames are the clusters the named mesh route configurations send
// to.
func (sr *sharedResources) clusterNames(names []string) []string {
	var out []string
	for _, n := range names {
		out = append(out, sr.routeClusters[n]...)
	}
	return out
}

// publicNames are the names of k's public route configurations or
// scopes, sorted.
func (k *kind) publicNames() []string {
	var out []string
	for n := range k.allVersions() {
		if wire.IsPublicRouteName(n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// meshNames are the names of k's others (mesh route configurations or
// scopes), sorted.
func (k *kind) meshNames() []string {
	out := make([]string, 0, k.size())
	for n := range k.allVersions() {
		if !wire.IsPublicRouteName(n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// subset is the kind of k's resources named in names (those k holds),
// versioned by their names and versions.
func (k *kind) subset(names []string) *kind {
	names = slices.Compact(slices.Sorted(slices.Values(names)))
	out := &kind{twins: make(map[string]types.Resource, len(names)),
		versions: make(map[string]string, len(names)), sources: make(map[string]types.Resource, len(names))}
	h := sha256.New()
	for _, n := range names {
		r := k.twin(n)
		if r == nil {
			continue
		}
		src, _ := k.source(n)
		version, _ := k.versionOf(n)
		out.twins[n], out.versions[n], out.sources[n] = r, version, src
		fmt.Fprintf(h, "%s=%s;", n, version)
	}
	out.version = hex.EncodeToString(h.Sum(nil))[:16]
	return out
}
