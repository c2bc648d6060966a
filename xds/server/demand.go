package server

import (
	"maps"
	"slices"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/wire"
)

// Clusters on demand (wire.ProxyNode.ClustersOnDemand), the server's part:
//
//  1. The node's Envoy subscribes to clusters by wildcard, and the node's
//     snapshot holds its own clusters alone (the backends it runs, the
//     agent's services).
//  2. A request whose route sends to a cluster the node lacks makes Envoy
//     subscribe to that cluster by name on its delta stream; demand
//     records the name on the node (onRequest's callback, before the
//     ADS server handles the request) and has the node published at once
//     (kickNow: a request waits, so no coalescing).
//  3. The publish cuts the node's clusters to those of every endpoint
//     whose mesh routes name a cluster it asked for (so a split's other
//     backends and a shadow's arrive with the first), and the wildcard
//     watch sends them.
//
// A node without a public listener gets its routes on demand as well: its
// scopes are sent with on_demand set, so its Envoy asks for a scope's
// route configuration on the scope's first request (the same on-demand
// filter waits for it), and the node's routes are cut to those it asked
// for. (A public node cannot: its listener matches a request again in the
// root's scope when its own segment's routes do not match, which needs
// them loaded; publicroutes.go in translate.)
//
// What a node asked for is kept while the server knows the node; an
// Envoy that reconnects names its clusters again (delta xDS resubscribes
// what it is interested in), so a restarted controller learns it anew.

// maxDemanded bounds the cluster names a node may ask for: past it, names
// are ignored (and logged), so a node cannot grow the server's memory
// without bound. A mesh has at most this many clusters a node can use.
const maxDemanded = 3 * wire.MaxReachable

// demand records the clusters a delta stream's node subscribed to by
// name, if the node's clusters come on demand (and, on a node without a
// public listener, the route configurations: its scopes load them on
// demand), and has the node published again when any is new.
func (s *Server) demand(id streamKey, typeURL string, names []string) {
	if (typeURL != resource.ClusterType && typeURL != resource.RouteType) || len(names) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil {
		return
	}
	n := s.nodes[st.nodeID]
	if n == nil || !n.node.ClustersOnDemand || (typeURL == resource.RouteType && n.node.Public()) {
		return
	}
	if n.demanded == nil {
		n.demanded = map[string]map[string]bool{}
	}
	asked := n.demanded[typeURL]
	if asked == nil {
		asked = map[string]bool{}
		n.demanded[typeURL] = asked
	}
	added := false
	for _, name := range names {
		if name == "*" || asked[name] {
			continue
		}
		if len(asked) >= maxDemanded {
			s.log.Warn("node asked for more resources on demand than a mesh can have; ignoring the rest", "node", st.nodeID, "type", shortType(typeURL), "limit", maxDemanded)
			break
		}
		asked[name], added = true, true
	}
	if added {
		s.newNodes[st.nodeID] = true
		s.kickNow() // a request waits for it
	}
}

// demand is what a node asked for on demand: cluster and route
// configuration names, sorted.
type demand struct{ clusters, routes []string }

// demandOf is what the node asked for; empty if nothing of it comes on
// demand. Called with mu held.
func (n *nodeState) demandOf() demand {
	if !n.node.ClustersOnDemand {
		return demand{}
	}
	return demand{clusters: slices.Sorted(maps.Keys(n.demanded[resource.ClusterType])),
		routes: slices.Sorted(maps.Keys(n.demanded[resource.RouteType]))}
}

// onDemand cuts clusters, what a node would otherwise get, to the
// clusters of the endpoints whose mesh routes name one of demanded (and
// the demanded ones themselves).
func (sr *sharedResources) onDemand(clusters *kind, demanded []string) *kind {
	if sr.clusterRoutes == nil {
		sr.clusterRoutes = map[string][]string{}
		for route, cs := range sr.routeClusters {
			for _, c := range cs {
				sr.clusterRoutes[c] = append(sr.clusterRoutes[c], route)
			}
		}
	}
	names := slices.Clone(demanded)
	for _, c := range demanded {
		names = append(names, sr.clusterNames(sr.clusterRoutes[c])...)
	}
	return clusters.subset(names)
}

// onDemandScopes is scopes with each scope's route configuration loaded on
// demand, made once for each kind it is made from.
func (sr *sharedResources) onDemandScopes(scopes *kind) (*kind, error) {
	return sr.kindOf("scopes-on-demand/"+scopes.version, "", func() (*kind, error) {
		list := make([]*route.ScopedRouteConfiguration, 0, len(scopes.sources))
		for _, name := range slices.Sorted(maps.Keys(scopes.sources)) {
			sc := proto.Clone(scopes.sources[name].(*route.ScopedRouteConfiguration)).(*route.ScopedRouteConfiguration)
			sc.OnDemand = true
			list = append(list, sc)
		}
		return newKind(scopes.version+"-on-demand", list, func(name string) string { v, _ := scopes.versionOf(name); return v + "-on-demand" })
	})
}
