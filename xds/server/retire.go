package server

import (
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// Removing assignments, make before break. A node's clusters name the
// assignments they ask for; when a publish stops building one (a backend
// deleted, a node's view of a backend it no longer runs replicas of), the
// node still holds the cluster that asks for it until it has received and
// accepted its new clusters. Removed at once, the assignment would reach
// the node first (another stream, another cache), and Envoy empties a
// cluster whose assignment is removed: no replica, not even the
// activator, and requests fail with "no healthy upstream" until the new
// cluster arrives. So a retired assignment stays served until every
// connected node has ACKed the clusters of the generation that retired it.

// retire records the assignments generation gen no longer builds, and
// forgets the retirement of those it builds again (changed).
func (s *Server) retire(changed map[string]types.Resource, removed []string, gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range changed {
		delete(s.retiring, name)
	}
	for _, name := range removed {
		if _, ok := s.retiring[name]; !ok {
			s.retiring[name] = gen
		}
	}
}

// removeRetired removes from the assignments cache the retired
// assignments that no connected node's clusters can still ask for.
func (s *Server) removeRetired() {
	s.mu.Lock()
	var gone []string
	if len(s.retiring) > 0 {
		caught := s.clustersCaughtUp()
		for name, gen := range s.retiring {
			if gen <= caught {
				gone = append(gone, name)
				delete(s.retiring, name)
			}
		}
	}
	s.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	if err := s.assignments.UpdateResources(nil, gone); err != nil {
		s.log.Error("removing retired assignments from the cache", "err", err)
	}
}

// clustersCaughtUp is the oldest generation whose clusters a connected node
// may still hold: each node's generation once it ACKed the clusters set for
// it, else the one it last had ACKed. A node without a stream is left out:
// it asks for what it needs when it reconnects. Called with mu held.
func (s *Server) clustersCaughtUp() uint64 {
	oldest := s.generation
	for _, n := range s.nodes {
		if n.streams == 0 {
			continue
		}
		if n.set != nil && n.acked[resource.ClusterType] == n.set.GetVersion(resource.ClusterType) {
			n.clustersAt = n.generation
		}
		oldest = min(oldest, n.clustersAt)
	}
	return oldest
}

// onClustersACK wakes the publisher when a node ACKs clusters while
// assignments wait to be removed. Called with mu held.
func (s *Server) onClustersACK(typeURL string) {
	if typeURL == resource.ClusterType && len(s.retiring) > 0 {
		s.kick()
	}
}
