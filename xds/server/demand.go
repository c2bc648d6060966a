package server

import (
	"slices"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

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
//     ADS server handles the request) and marks the node for the next
//     publish.
//  3. The publish cuts the node's clusters to those of every endpoint
//     whose mesh routes name a cluster it asked for (so a split's other
//     backends and a shadow's arrive with the first), and the wildcard
//     watch sends them.
//
// What a node asked for is kept while the server knows the node; an
// Envoy that reconnects names its clusters again (delta xDS resubscribes
// what it is interested in), so a restarted controller learns it anew.

// maxDemanded bounds the cluster names a node may ask for: past it, names
// are ignored (and logged), so a node cannot grow the server's memory
// without bound. A mesh has at most this many clusters a node can use.
const maxDemanded = 3 * wire.MaxReachable

// demand records the clusters a delta stream's node subscribed to by
// name, if the node's clusters come on demand, and has the node published
// again when any is new.
func (s *Server) demand(id streamKey, typeURL string, names []string) {
	if typeURL != resource.ClusterType || len(names) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil {
		return
	}
	n := s.nodes[st.nodeID]
	if n == nil || !n.node.ClustersOnDemand {
		return
	}
	added := false
	for _, name := range names {
		if name == "*" || n.demanded[name] {
			continue
		}
		if len(n.demanded) >= maxDemanded {
			s.log.Warn("node asked for more clusters on demand than a mesh can have; ignoring the rest", "node", st.nodeID, "limit", maxDemanded)
			break
		}
		if n.demanded == nil {
			n.demanded = map[string]bool{}
		}
		n.demanded[name], added = true, true
	}
	if added {
		s.newNodes[st.nodeID] = true
		s.kick()
	}
}

// demandedClusters are the clusters the node asked for, sorted; nil if its
// clusters do not come on demand. Called with mu held.
func (n *nodeState) demandedClusters() []string {
	if !n.node.ClustersOnDemand {
		return nil
	}
	out := make([]string, 0, len(n.demanded))
	for name := range n.demanded {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
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
