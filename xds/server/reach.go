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

// reachKey names a node's reach: its endpoints, and whether it is public.
func reachKey(node wire.ProxyNode) string {
	return fmt.Sprintf("%t/%s", node.Public(), strings.Join(node.Reachable, ","))
}

// reachFor returns the routes, scopes and clusters of a node that reaches
// only some endpoints (wire.ProxyNode.Reachable), cut from the shared
// kinds: the mesh routes and scopes of those endpoints, the public ones if
// the node has a public listener, and the clusters of the backends the
// mesh routes name (every cluster for a public node, whose table names
// every routed endpoint's). A cut is made again only when the kind it was
// cut from changed, so nodes that reach the same endpoints share it.
func (sr *sharedResources) reachFor(node wire.ProxyNode) (routes, scopes, clusters *kind) {
	key := "reach/" + reachKey(node)
	meshNames := make([]string, len(node.Reachable))
	for i, e := range node.Reachable {
		meshNames[i] = wire.MeshRouteName(e)
	}
	withPublic := func(k *kind) []string {
		if !node.Public() {
			return meshNames
		}
		return append(meshNames[:len(meshNames):len(meshNames)], k.publicNames()...)
	}
	routes = sr.cut(key+"/routes", sr.routes.version, func() *kind { return sr.routes.subset(withPublic(sr.routes)) })
	scopes = sr.cut(key+"/scopes", sr.scopes.version, func() *kind { return sr.scopes.subset(withPublic(sr.scopes)) })
	clusters = sr.clusters
	if !node.Public() {
		// The clusters its mesh routes name: cut again when they or the
		// routes change.
		clusters = sr.cut(key+"/clusters", sr.routes.version+"/"+sr.clusters.version, func() *kind {
			return sr.clusters.subset(sr.clusterNames(meshNames))
		})
	}
	return routes, scopes, clusters
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
