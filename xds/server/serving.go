package server

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/translate"
)

// What a node serves. A node serves a generation once it has ACKed that
// generation's listeners, routes and clusters (its status's InSync). That
// is not yet its replicas: a backend's replicas reach a node as
// assignments (EDS), from a cache of their own, on their own schedule. So
// the server also keeps, for each node, the version of each assignment it
// ACKed (nodeState.heldAssignments), and Serving compares it with the
// version published (publishedAssignments).
//
// The versions are the translation's (translate.Encoded: the first 8
// bytes of the SHA-256 of the assignment's deterministic encoding, in
// hex). go-control-plane versions an assignment on delta streams by the
// SHA-256 of the same bytes, so a delta response's versions are read as
// they come; a state-of-the-world response's assignments are hashed here.
// A delta stream that Envoy opens again states what it holds
// (initial_resource_versions); a new state-of-the-world stream is sent
// every assignment it asks for again, so it starts holding none.

// assignmentVersionLen is how long a translated version is (hex).
const assignmentVersionLen = 16

// Serving is how far the connected nodes are from serving the latest
// accepted data plane and, of the backends asked about, the replicas in it.
type Serving struct {
	// Revision and Generation are the latest accepted data plane's: the
	// stored state's revision it was made of and its generation here.
	Revision   uint64 `json:"revision"`
	Generation uint64 `json:"generation"`
	// Nodes are the connected nodes served configuration (a node refused
	// its snapshot, or its protocol, is not one).
	Nodes int `json:"nodes"`
	// Healthy are, of each backend asked about that the data plane has,
	// how many of its replicas it calls (ir.Healthy).
	Healthy map[string]int `json:"healthy"`
	// Waiting says, a line per node, what it does not serve yet; empty:
	// every node serves it all.
	Waiting []string `json:"waiting"`
}

// Serving reports how far the connected nodes are from serving the latest
// accepted data plane and backends' replicas in it (see Serving).
func (s *Server) Serving(backends []string) Serving {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Serving{Generation: s.generation, Healthy: map[string]int{}, Waiting: []string{}}
	if s.dataPlane != nil {
		out.Revision = s.dataPlane.Revision
		for _, b := range s.dataPlane.Backends {
			if slices.Contains(backends, b.Name) {
				out.Healthy[b.Name] = healthy(b)
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(s.nodes)) {
		n := s.nodes[id]
		if n.streams == 0 || n.refused != "" {
			continue
		}
		out.Nodes++
		if why := s.notServing(id, n, backends); why != "" {
			out.Waiting = append(out.Waiting, "node "+id+": "+why)
		}
	}
	return out
}

// notServing says what node id does not serve yet of the latest
// generation and backends' assignments, or "". Called with mu held.
func (s *Server) notServing(id string, n *nodeState, backends []string) string {
	if n.generation != s.generation || !n.ackedAll() {
		why := fmt.Sprintf("has not accepted generation %d yet (it holds %d)", s.generation, n.converged)
		if n.lastNACK != "" {
			why += "; it rejected " + n.lastNACK
		}
		return why
	}
	clusters := n.set[resource.ClusterType]
	if clusters == nil {
		return ""
	}
	for _, b := range backends {
		for _, name := range []string{wire.ClusterName(b), wire.InboundClusterName(b)} {
			c, ok := clusters.source(name)
			if !ok {
				continue // not on this node (or on demand: asked for when called)
			}
			asked := askedAssignment(c)
			if asked == "" {
				continue // not an EDS cluster
			}
			if want, held := s.publishedAssignments[asked], n.heldAssignments[asked]; want != "" && held != want {
				return fmt.Sprintf("has not received backend %s's replicas yet (assignment %s: it holds version %s, the latest is %s)", b, asked, orNone(held), want)
			}
		}
	}
	return ""
}

// orNone is v, or "none".
func orNone(v string) string {
	if v == "" {
		return "none"
	}
	return v
}

// healthy counts the replicas of b the data plane calls.
func healthy(b ir.Backend) int {
	n := 0
	for _, r := range b.Replicas {
		if r.Health == ir.Healthy {
			n++
		}
	}
	return n
}

// askedAssignment is the assignment an EDS cluster asks for ("" for
// another type). A cluster in a snapshot may be its encoded twin
// (snapshot.go), read back here.
func askedAssignment(r types.Resource) string {
	c, ok := r.(*cluster.Cluster)
	if !ok || c.GetName() == "" {
		c = &cluster.Cluster{}
		if err := proto.Unmarshal(r.ProtoReflect().GetUnknown(), c); err != nil {
			return ""
		}
	}
	return translate.AskedAssignment(c)
}

// sentAssignments are an assignments response's versions by name, and the
// names it removes.
type sentAssignments struct {
	versions map[string]string
	removed  []string
}

// deltaAssignments reads what a delta assignments response sends.
func deltaAssignments(resp *discovery.DeltaDiscoveryResponse) *sentAssignments {
	if resp.GetTypeUrl() != resource.EndpointType {
		return nil
	}
	out := &sentAssignments{versions: make(map[string]string, len(resp.GetResources())), removed: resp.GetRemovedResources()}
	for _, r := range resp.GetResources() {
		out.versions[r.GetName()] = shortVersion(r.GetVersion())
	}
	return out
}

// sotwAssignments reads what a state-of-the-world assignments response
// sends, hashing each as the translation versions it.
func sotwAssignments(resp *discovery.DiscoveryResponse) *sentAssignments {
	if resp.GetTypeUrl() != resource.EndpointType {
		return nil
	}
	out := &sentAssignments{versions: make(map[string]string, len(resp.GetResources()))}
	for _, a := range resp.GetResources() {
		var cla endpoint.ClusterLoadAssignment
		if err := proto.Unmarshal(a.GetValue(), &cla); err != nil {
			continue
		}
		h := sha256.Sum256(a.GetValue())
		out.versions[cla.GetClusterName()] = hex.EncodeToString(h[:assignmentVersionLen/2])
	}
	return out
}

// shortVersion is a go-control-plane resource version (a SHA-256 in hex)
// cut to the translation's.
func shortVersion(v string) string {
	if len(v) > assignmentVersionLen {
		return strings.Clone(v[:assignmentVersionLen])
	}
	return v
}

// holdAssignments records that a node ACKed sent. Called with mu held.
func (n *nodeState) holdAssignments(sent *sentAssignments) {
	if sent == nil {
		return
	}
	if n.heldAssignments == nil {
		n.heldAssignments = make(map[string]string, len(sent.versions))
	}
	for name, v := range sent.versions {
		n.heldAssignments[name] = v
	}
	for _, name := range sent.removed {
		delete(n.heldAssignments, name)
	}
}

// startAssignments records what a node holds when it opens an assignments
// subscription on a new stream: what a delta stream states, nothing on a
// state-of-the-world one. Called with mu held.
func (n *nodeState) startAssignments(initial map[string]string) {
	n.heldAssignments = make(map[string]string, len(initial))
	for name, v := range initial {
		n.heldAssignments[name] = shortVersion(v)
	}
}

// assignmentsRequest records, of an assignments request on stream id,
// what the node holds when the stream's first one opens the subscription
// (a delta stream's initial versions; none on a state-of-the-world one),
// and forgets what it unsubscribes from: it is sent again if asked again.
func (s *Server) assignmentsRequest(id streamKey, initial map[string]string, unsubscribe []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil {
		return
	}
	n := s.nodes[st.nodeID]
	if n == nil {
		return
	}
	if !st.assignmentsOpened {
		st.assignmentsOpened = true
		n.startAssignments(initial)
	}
	for _, name := range unsubscribe {
		delete(n.heldAssignments, name)
	}
}
