package server

import (
	"errors"
	"fmt"
	"sort"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"

	"github.com/servemesh/servemesh/wire"
)

// nodeState is what the server knows of one Envoy node.
type nodeState struct {
	node       wire.ProxyNode
	streams    int
	generation uint64            // model generation of the node's snapshot
	set        snapshot          // the kinds the caches hold for the node: what it should ACK (written by the publisher, under mu)
	acked      map[string]string // type URL -> version the node last ACKed
	nacks      int
	lastNACK   string
	refused    string    // why the node's last snapshot could not be built
	converged  uint64    // the last generation this node was seen in sync with
	clustersAt uint64    // the last generation whose clusters it was seen to hold (clustersCaughtUp)
	goneSince  time.Time // when its last stream closed
	// demanded are the names the node asked for, by type URL, if its
	// clusters come on demand (demand.go).
	demanded map[string]map[string]bool
	// heldAssignments are the versions of the assignments the node ACKed,
	// by name (serving.go).
	heldAssignments map[string]string
}

// skewedNode is a node whose streams are refused for its protocol, as it
// last announced itself, and why (wire.NodeSkew).
type skewedNode struct {
	node wire.ProxyNode
	why  string
}

// streamState is one xDS stream's bookkeeping.
type streamState struct {
	nodeID  string
	nodeErr error
	peer    identity
	// sent are the responses not yet ACKed or NACKed, by type URL and
	// nonce: a delta response sends only what changed, so each one's ACK
	// counts, even one that comes after a later response was sent.
	sent    map[sentKey]sentResponse
	sentSeq uint64 // numbers the responses sent, in order
	// assignmentsOpened: the stream asked for assignments (serving.go).
	assignmentsOpened bool
}

type sentKey struct{ typeURL, nonce string }

type sentResponse struct {
	version     string
	seq         uint64
	assignments *sentAssignments // what an assignments response sends
}

// maxUnanswered bounds the responses a stream keeps waiting for their
// ACK: Envoy answers each, in order, so a few are ever waiting.
const maxUnanswered = 64

// answered takes the response a request with nonce answers (an ACK or a
// NACK) off st's list, with those of its type sent before it (Envoy
// answers in order: they never will be), and returns it.
func (st *streamState) answered(typeURL, nonce string) (sentResponse, bool) {
	sent, ok := st.sent[sentKey{typeURL, nonce}]
	if !ok {
		return sentResponse{}, false
	}
	for k, r := range st.sent {
		if k.typeURL == typeURL && r.seq <= sent.seq {
			delete(st.sent, k)
		}
	}
	return sent, true
}

// remember keeps a response sent, until it is answered.
func (st *streamState) remember(typeURL, nonce string, r sentResponse) {
	st.sentSeq++
	r.seq = st.sentSeq
	st.sent[sentKey{typeURL, nonce}] = r
	if len(st.sent) <= maxUnanswered {
		return
	}
	oldest := sentKey{}
	for k, r := range st.sent { // a client that never answers: forget the oldest
		if oldest == (sentKey{}) || r.seq < st.sent[oldest].seq {
			oldest = k
		}
	}
	delete(st.sent, oldest)
}

// streamKey names a stream: go-control-plane numbers state-of-the-world
// and delta streams each from 1, so an id alone names two streams.
type streamKey struct {
	delta bool
	id    int64
}

func (s *Server) openStream(id streamKey, peer identity) {
	s.mu.Lock()
	s.streams[id] = &streamState{sent: map[sentKey]sentResponse{}, peer: peer}
	s.mu.Unlock()
	s.metrics.streams.Inc()
}

func (s *Server) closeStream(id streamKey) {
	s.mu.Lock()
	if st := s.streams[id]; st != nil {
		if n := s.nodes[st.nodeID]; n != nil {
			n.streams--
			if n.streams == 0 {
				n.goneSince = time.Now()
			}
		}
		delete(s.streams, id)
		s.countConnected()
		s.forgetGoneNodes(time.Now())
	}
	s.mu.Unlock()
	s.metrics.streams.Dec()
}

// nodeError is the error that closes a stream whose node is not a servemesh
// node, or nil.
func (s *Server) nodeError(id streamKey) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.streams[id]; st != nil {
		return st.nodeErr
	}
	return nil
}

// onRequest records a request: it registers the stream's node on first
// sight, records ACKs, and logs and counts NACKs. For a NACK of the last
// response it returns the rejected version.
//
// A request without a nonce that states a version is the first of its type on
// a new stream (Envoy reconnecting): that version is what the node holds.
func (s *Server) onRequest(id streamKey, node *core.Node, typeURL, version, nonce string, errDetail *status.Status) (acked, nackedVersion string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil {
		return "", ""
	}
	if st.nodeID == "" && st.nodeErr == nil {
		s.registerNode(st, node)
	}
	n := s.nodes[st.nodeID]
	if n == nil {
		return "", ""
	}
	if nonce == "" {
		if version != "" {
			n.acked[typeURL] = version
		}
		return "", ""
	}
	sent, ok := st.answered(typeURL, nonce)
	if !ok {
		return "", "" // a nonce this stream was never sent, or answered already
	}
	if errDetail != nil {
		n.nacks++
		n.lastNACK = fmt.Sprintf("%s version %s: %s", shortType(typeURL), sent.version, errDetail.GetMessage())
		s.metrics.nacks.WithLabelValues(shortType(typeURL)).Inc()
		s.log.Error("envoy rejected configuration (NACK); it keeps its last accepted config and the rejected version is not re-sent",
			"node", st.nodeID, "type", shortType(typeURL), "version", sent.version, "envoy_error", errDetail.GetMessage())
		return "", sent.version
	}
	n.acked[typeURL] = sent.version
	n.holdAssignments(sent.assignments)
	s.observeConvergence(n)
	s.onClustersACK(typeURL)
	return sent.version, ""
}

// ackedAll reports whether the node ACKed every type of its snapshot.
// A type with no resources for the node needs no ACK: Envoy asks for
// route configurations only when a scope names one, so an empty mesh's
// node never subscribes to them (and one whose last scope went away
// unsubscribes, keeping the old version's ACK), yet holds all it should.
// Called with mu held.
func (n *nodeState) ackedAll() bool {
	if n.set == nil {
		return false
	}
	for _, typ := range snapshotTypes {
		if k := n.set[typ]; k != nil && k.size() == 0 {
			continue
		}
		if n.acked[typ] != n.set.GetVersion(typ) {
			return false
		}
	}
	return true
}

// observeConvergence records how long the node took to ACK its current
// generation, the first time it is in sync with it. Called with mu held.
func (s *Server) observeConvergence(n *nodeState) {
	if n.converged >= n.generation || !n.ackedAll() {
		return
	}
	n.converged = n.generation
	if at, ok := s.acceptedAt[n.generation]; ok {
		s.metrics.convergence.Observe(time.Since(at).Seconds())
	}
}

// forgetGoneNodes drops, with their snapshots, nodes without a stream for
// longer than forgetAfter, and the longest gone beyond maxGone, so node ids
// that connected once cannot pile up. Called with mu held.
func (s *Server) forgetGoneNodes(now time.Time) {
	var gone []string
	for id, n := range s.nodes {
		switch {
		case n.streams > 0 || n.goneSince.IsZero():
		case now.Sub(n.goneSince) > s.forgetAfter:
			s.forget(id)
		default:
			gone = append(gone, id)
		}
	}
	if len(gone) > s.maxGone {
		sort.Slice(gone, func(i, j int) bool { return s.nodes[gone[i]].goneSince.Before(s.nodes[gone[j]].goneSince) })
		for _, id := range gone[:len(gone)-s.maxGone] {
			s.forget(id)
		}
	}
	s.metrics.knownNodes.Set(float64(len(s.nodes)))
}

// forget drops one node and its snapshot. Called with mu held.
func (s *Server) forget(id string) {
	s.log.Info("forgot a node gone since", "node", id, "since", s.nodes[id].goneSince.Format(time.RFC3339))
	delete(s.nodes, id)
	for _, c := range s.snapshots {
		c.ClearSnapshot(id)
	}
	for _, c := range s.deltas {
		c.clear(id)
	}
}

// countConnected updates the connected-nodes gauge. Called with mu held.
func (s *Server) countConnected() {
	connected := 0
	for _, n := range s.nodes {
		if n.streams > 0 {
			connected++
		}
	}
	s.metrics.connected.Set(float64(connected))
}

// registerNode learns a stream's node from its first request. Called with mu held.
func (s *Server) registerNode(st *streamState, node *core.Node) {
	parsed, err := wire.ProxyNodeFromEnvoy(node)
	if err == nil && st.peer.tls && parsed.ID != st.peer.node {
		// Over TLS a node is who its certificate says: it can neither read
		// nor rewrite another node's configuration.
		err = fmt.Errorf("the stream's certificate is node %q's, and it announced node %q: refused", st.peer.node, parsed.ID)
	}
	if err == nil {
		if skew := wire.NodeSkew(parsed.ID, parsed.AnnouncedProtocol(), parsed.Version); skew != "" {
			// Its Envoy keeps serving its last configuration; its agent
			// refuses to start against an older controller as well.
			s.skewed[parsed.ID] = skewedNode{node: parsed, why: skew}
			err = errors.New(skew)
		} else {
			delete(s.skewed, parsed.ID)
		}
	}
	if err != nil {
		st.nodeErr = err
		s.log.Error("refusing xds stream", "err", err)
		return
	}
	st.nodeID = parsed.ID
	n := s.nodes[parsed.ID]
	if n == nil || !n.node.Equal(parsed) {
		if n == nil {
			n = &nodeState{acked: map[string]string{}}
			s.nodes[parsed.ID] = n
		}
		n.node = parsed
		s.metrics.knownNodes.Set(float64(len(s.nodes)))
		public := "none"
		if parsed.Public() {
			public = fmt.Sprintf("%s:%d", parsed.PublicAddress, parsed.PublicPort)
		}
		s.log.Info("node connected", "node", parsed.ID, "public", public, "mesh", fmt.Sprintf("%s:%d", parsed.MeshAddress, parsed.MeshPort))
		s.newNodes[parsed.ID] = true
		s.kick()
	}
	n.streams++
	s.countConnected()
}

func (s *Server) onResponse(id streamKey, typeURL, nonce, version string, assignments *sentAssignments) {
	s.mu.Lock()
	if st := s.streams[id]; st != nil {
		st.remember(typeURL, nonce, sentResponse{version: version, assignments: assignments})
	}
	s.mu.Unlock()
	s.metrics.pushes.WithLabelValues(shortType(typeURL)).Inc()
}

// NodeStatus is a node's configuration state, as shown by status commands.
type NodeStatus struct {
	ID        string            `json:"id"`
	Connected bool              `json:"connected"`
	InSync    bool              `json:"in_sync"`
	Acked     map[string]string `json:"acked_versions"`
	Expected  map[string]string `json:"expected_versions"`
	NACKs     int               `json:"nacks"`
	LastNACK  string            `json:"last_nack,omitempty"`
	// Refused says why the node gets no configuration for the latest model
	// (a plaintext node in a mesh with mTLS), if it does not.
	Refused string `json:"refused,omitempty"`
	// Generation is the model generation of the node's current snapshot.
	Generation uint64 `json:"generation"`
	// ModelGeneration is the server's latest accepted model generation.
	ModelGeneration uint64 `json:"model_generation"`
	// Version and Protocol are the servemesh release and protocol the
	// node's agent announced (protocol 1: it announced none).
	Version  string `json:"version,omitempty"`
	Protocol int    `json:"protocol"`
	// Skew, if set, says why the node's streams are refused: its protocol
	// is outside the skew policy (wire.NodeSkew).
	Skew string `json:"skew,omitempty"`
}

// Status reports every known node, sorted by id. A node is in sync when its
// snapshot is of the latest model and it ACKed that snapshot's listeners,
// routes and clusters.
func (s *Server) Status() []NodeStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]NodeStatus, 0, len(s.nodes))
	for id, n := range s.nodes {
		ns := NodeStatus{
			ID: id, Connected: n.streams > 0, NACKs: n.nacks, LastNACK: n.lastNACK, Refused: n.refused,
			Generation: n.generation, ModelGeneration: s.generation,
			Acked: map[string]string{}, Expected: map[string]string{},
		}
		if n.set != nil {
			for _, typ := range snapshotTypes {
				ns.Expected[shortType(typ)] = n.set.GetVersion(typ)
			}
		}
		for typ, v := range n.acked {
			ns.Acked[shortType(typ)] = v
		}
		ns.InSync = n.generation == s.generation && n.ackedAll()
		ns.Version, ns.Protocol = n.node.Version, n.node.AnnouncedProtocol()
		ns.Skew = s.skewed[id].why
		out = append(out, ns)
	}
	for id, n := range s.skewed {
		if s.nodes[id] == nil {
			out = append(out, NodeStatus{ID: id, Version: n.node.Version, Protocol: n.node.AnnouncedProtocol(),
				Skew: n.why, Acked: map[string]string{}, Expected: map[string]string{}})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// outOfSync counts the connected nodes not in sync.
func (s *Server) outOfSync() float64 {
	n := 0
	for _, st := range s.Status() {
		if st.Connected && !st.InSync {
			n++
		}
	}
	return float64(n)
}

func shortType(typeURL string) string {
	switch typeURL {
	case resource.ListenerType:
		return "listeners"
	case resource.RouteType:
		return "routes"
	case resource.ScopedRouteType:
		return "scoped_routes"
	case resource.ClusterType:
		return "clusters"
	case resource.EndpointType:
		return "assignments"
	}
	return typeURL
}
