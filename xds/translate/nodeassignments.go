package translate

import (
	"fmt"
	"slices"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// A backend reached over mTLS has, on each node running its replicas, two
// assignments (inboundAssignments, nodeViewAssignments): a backend on
// three nodes has seven in all with its shared one, most of them made of
// the same endpoints. A full publish of a large mesh spent a third of its
// time building and encoding them one by one. encodedNodeAssignments
// encodes each node's endpoint once, as others reach it, and writes each
// replica's straight into the two assignments that list it, with
// protowire (appendNodeHead, appendHost), framing every assignment: the bytes
// proto.Marshal would make of the assignments BuildAssignments,
// inboundAssignments and nodeViewAssignments build
// (TestEncodedNodeAssignments compares them), at a fraction of the cost.

// CLA fields, as proto.Marshal orders them (by number).
const (
	claName      protowire.Number = 1 // cluster_name
	claEndpoints protowire.Number = 2 // endpoints: the localities
	localityEPs  protowire.Number = 2 // a locality's lb_endpoints
)

// claPolicy is servemesh's policy (assignment) as a CLA's field 4 is
// encoded; activatorEncoded, the activator's localities
// (activatorLocalities) as field 2, by socket.
var claPolicy, activatorEncoded = mustEncode(&endpoint.ClusterLoadAssignment{Policy: assignment("", nil).GetPolicy()}), func() map[string][]byte {
	out := make(map[string][]byte, len(activatorLocalities))
	for socket, loc := range activatorLocalities {
		out[socket] = mustEncode(&endpoint.ClusterLoadAssignment{Endpoints: []*endpoint.LocalityLbEndpoints{loc}})
	}
	return out
}()

// mustEncode is a constant message's encoding.
func mustEncode(m proto.Message) []byte {
	b, err := marshalDeterministic(m)
	if err != nil {
		panic(err) // a constant message that does not encode: a bug
	}
	return b
}

// inboundBackendAssignments are every assignment of b, a backend reached
// over mTLS, encoded: its shared one (every node by its inbound listener),
// then its inbound and view assignments on each node running its
// replicas. They are framed from their endpoints' encodings where b's
// nodes and their inbound listeners pair one to one, else built and
// encoded one by one.
func inboundBackendAssignments(b ir.Backend) ([]Encoded, error) {
	out, ok, err := encodedNodeAssignments(b)
	if ok || err != nil {
		return out, err
	}
	one := &ir.DataPlane{Backends: []ir.Backend{b}}
	return encodeAssignments(slices.Concat(BuildAssignments(one), inboundAssignments(one), nodeViewAssignments(one)))
}

// encodeAssignments encodes each of assignments under its cluster name.
func encodeAssignments(assignments []*endpoint.ClusterLoadAssignment) ([]Encoded, error) {
	out := make([]Encoded, 0, len(assignments))
	for _, cla := range assignments {
		e, err := encode(cla.GetClusterName(), cla)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// encodedNodeAssignments are b's assignments (inboundBackendAssignments'
// order; on each node, by node, the inbound one first, then the view if b
// has views), framed. ok is false when b's nodes and inbound listeners do
// not pair one to one (an agent moving its inbound listener): then the
// caller builds them message by message.
func encodedNodeAssignments(b ir.Backend) (out []Encoded, ok bool, err error) {
	nodes, ok := groupByNode(b.Replicas)
	if !ok {
		return nil, false, nil
	}
	byListener, nodeEP := nodeEndpoints(nodes)
	views := hasNodeView(b)
	out = make([]Encoded, 0, 1+2*len(nodes))
	out = append(out, encodedAssignment(wire.ClusterName(b.Name), nodeEP, nil, wire.ActivatorSocket))
	eps := make([][]byte, 0, len(nodes))
	for i, g := range nodes {
		mine, err := replicaEndpoints(g.replicas)
		if err != nil {
			return nil, false, err
		}
		out = append(out, encodedAssignment(wire.InboundAssignmentName(b.Name, g.node), nil, mine, wire.ActivatorInboundSocket))
		if !views {
			continue
		}
		eps = eps[:0]
		for k, j := range byListener {
			if j != i {
				eps = append(eps, nodeEP[k])
			}
		}
		for k := range mine {
			mine[k].marked = true
		}
		out = append(out, encodedAssignment(wire.NodeViewAssignmentName(b.Name, g.node), eps, mine, wire.ActivatorSocket))
	}
	return out, true, nil
}

// nodeGroup is a node's replicas of a backend, by address, and the
// node's inbound listener.
type nodeGroup struct {
	node, inbound string
	replicas      []ir.Replica
}

// groupByNode groups replicas by node, sorted by node, each node's by
// address (byAddress's order); ok says each node has one inbound
// listener and no two nodes share one. A full mTLS publish groups every
// backend's replicas, and most backends run on a few nodes: their
// replicas are placed by node (placeByNode) and each node's few sorted,
// as sorting them all by node and address cost a twentieth of the
// publish; a backend on many nodes is sorted whole (sortByNode).
func groupByNode(replicas []ir.Replica) (out []nodeGroup, ok bool) {
	rs, ends := placeByNode(replicas)
	if rs == nil {
		rs, ends = sortByNode(replicas)
	}
	start := 0
	for _, end := range ends {
		g := rs[start:end:end]
		slices.SortStableFunc(g, func(a, b ir.Replica) int { return strings.Compare(a.Address, b.Address) })
		for _, r := range g {
			if r.Inbound != g[0].Inbound {
				return nil, false
			}
		}
		out = append(out, nodeGroup{node: g[0].Node, inbound: g[0].Inbound, replicas: g})
		start = end
	}
	listeners := make([]string, len(out))
	for i, g := range out {
		listeners[i] = g.inbound
	}
	slices.Sort(listeners)
	if len(slices.Compact(listeners)) != len(out) {
		return nil, false
	}
	return out, true
}

// placedNodes is how many nodes placeByNode looks replicas up among; a
// backend on more is sorted.
const placedNodes = 16

// placeByNode is a copy of replicas grouped by node, the nodes sorted and
// each node's replicas in their order, with where each node's group ends;
// nil if they run on more than placedNodes nodes.
func placeByNode(replicas []ir.Replica) (rs []ir.Replica, ends []int) {
	var nodes []string
	for _, r := range replicas {
		if !slices.Contains(nodes, r.Node) {
			if len(nodes) == placedNodes {
				return nil, nil
			}
			nodes = append(nodes, r.Node)
		}
	}
	slices.Sort(nodes)
	ends = make([]int, len(nodes)) // first, where each node's next replica goes
	for _, r := range replicas {
		for k := slices.Index(nodes, r.Node) + 1; k < len(nodes); k++ {
			ends[k]++
		}
	}
	rs = make([]ir.Replica, len(replicas))
	for _, r := range replicas {
		k := slices.Index(nodes, r.Node)
		rs[ends[k]] = r
		ends[k]++
	}
	return rs, ends
}

// sortByNode is a copy of replicas sorted by node, each node's in their
// order, with where each node's group ends.
func sortByNode(replicas []ir.Replica) (rs []ir.Replica, ends []int) {
	rs = slices.Clone(replicas)
	slices.SortStableFunc(rs, func(a, b ir.Replica) int { return strings.Compare(a.Node, b.Node) })
	for i := range rs {
		if i == len(rs)-1 || rs[i+1].Node != rs[i].Node {
			ends = append(ends, i+1)
		}
	}
	return rs, ends
}

// nodeEndpoints encodes the endpoints inboundAssignment lists for the
// nodes, in its order (by inbound listener): each the node's health and
// weight (nodeHealth), then its listener's host. byListener are the
// nodes' indexes in that order.
func nodeEndpoints(nodes []nodeGroup) (byListener []int, encoded [][]byte) {
	byListener = make([]int, len(nodes))
	for i := range nodes {
		byListener[i] = i
	}
	slices.SortFunc(byListener, func(a, b int) int { return strings.Compare(nodes[a].inbound, nodes[b].inbound) })
	encoded = make([][]byte, len(nodes))
	for k, i := range byListener {
		health, weight := nodeHealth(nodes[i].replicas)
		host, port := replicaHost(nodes[i].inbound)
		encoded[k] = appendHost(appendNodeHead(nil, healthStatus(health), uint32(weight)), host, port)
	}
	return byListener, encoded
}

// LbEndpoint's fields before its host, as inboundAssignment fills them.
const (
	endpointHealth protowire.Number = 2 // health_status
	endpointWeight protowire.Number = 4 // load_balancing_weight, a UInt32Value
	uint32Value    protowire.Number = 1 // UInt32Value's value
)

// appendNodeHead appends an endpoint's health and weight as proto.Marshal
// writes them (the health omitted when UNKNOWN, proto3's default).
func appendNodeHead(b []byte, health core.HealthStatus, weight uint32) []byte {
	if health != core.HealthStatus_UNKNOWN {
		b = protowire.AppendTag(b, endpointHealth, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(health))
	}
	b = protowire.AppendTag(b, endpointWeight, protowire.BytesType)
	if weight == 0 {
		return protowire.AppendVarint(b, 0)
	}
	b = protowire.AppendVarint(b, uint64(protowire.SizeTag(uint32Value)+protowire.SizeVarint(uint64(weight))))
	b = protowire.AppendTag(b, uint32Value, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(weight))
}

// replicaEndpoint is a replica's endpoint as an assignment lists it,
// written straight into the assignment's encoding (encodedAssignment):
// its fields but its host, encoded once for every health (endpointHeads),
// then its host (appendHost). proto.Marshal writes an endpoint's other
// fields by number and its host last (a oneof).
type replicaEndpoint struct {
	heads  *endpointHead
	marked bool // as the node's view lists it
	host   string
	port   uint32
}

func (r replicaEndpoint) head() []byte {
	if r.marked {
		return r.heads.marked
	}
	return r.heads.plain
}

func (r replicaEndpoint) size() int { return len(r.head()) + hostSize(r.host, r.port) }

// replicaEndpoints are a node's replicas' endpoints (rs, in the order
// BuildAssignment lists them) as its inbound assignment lists them;
// marked as its own, they are its view's (nodeViewAssignment: the local
// metadata, weight 1).
func replicaEndpoints(rs []ir.Replica) ([]replicaEndpoint, error) {
	out := make([]replicaEndpoint, len(rs))
	for i, r := range rs {
		heads, ok := endpointHeads[healthStatus(r.Health)]
		if !ok {
			return nil, fmt.Errorf("encode endpoint: health %v has no encoding", healthStatus(r.Health))
		}
		host, port := replicaHost(r.Address)
		out[i] = replicaEndpoint{heads: heads, host: host, port: port}
	}
	return out, nil
}

// The fields an endpoint's host is encoded in: LbEndpoint's endpoint,
// Endpoint's address and Address's socket address are each field 1; a
// SocketAddress has its address and port (its protocol, TCP, is the
// default and not written).
const (
	hostNested protowire.Number = 1
	socketHost protowire.Number = 2
	socketPort protowire.Number = 3
)

// appendHost appends to b the host of an endpoint at host:port as
// proto.Marshal writes LbEndpoint{HostIdentifier: Endpoint{Address:
// socketAddress(host, port)}} (TestAppendHost compares them).
func appendHost(b []byte, host string, port uint32) []byte {
	ep, addr, sa := hostSizes(host, port)
	b = slices.Grow(b, protowire.SizeTag(hostNested)+protowire.SizeBytes(ep))
	for _, size := range []int{ep, addr, sa} {
		b = protowire.AppendTag(b, hostNested, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(size))
	}
	b = protowire.AppendTag(b, socketHost, protowire.BytesType)
	b = protowire.AppendString(b, host)
	b = protowire.AppendTag(b, socketPort, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(port))
}

// hostSizes are the sizes of the nested messages appendHost writes: the
// endpoint, its address and its socket address.
func hostSizes(host string, port uint32) (ep, addr, sa int) {
	sa = protowire.SizeTag(socketHost) + protowire.SizeBytes(len(host)) + protowire.SizeTag(socketPort) + protowire.SizeVarint(uint64(port))
	addr = protowire.SizeTag(hostNested) + protowire.SizeBytes(sa)
	ep = protowire.SizeTag(hostNested) + protowire.SizeBytes(addr)
	return ep, addr, sa
}

// hostSize is how many bytes appendHost writes.
func hostSize(host string, port uint32) int {
	ep, _, _ := hostSizes(host, port)
	return protowire.SizeTag(hostNested) + protowire.SizeBytes(ep)
}

// endpointHead is an endpoint's fields but its host, encoded: plain, and
// marked local.
type endpointHead struct{ plain, marked []byte }

// endpointHeads are the endpointHead of each health.
var endpointHeads = func() map[core.HealthStatus]*endpointHead {
	out := map[core.HealthStatus]*endpointHead{}
	for v := range core.HealthStatus_name {
		h := core.HealthStatus(v)
		out[h] = &endpointHead{mustEncode(&endpoint.LbEndpoint{HealthStatus: h}),
			mustEncode(&endpoint.LbEndpoint{HealthStatus: h, Metadata: localMetadata(), LoadBalancingWeight: wrapperspb.UInt32(1)})}
	}
	return out
}()

// encodedAssignment frames an assignment of one locality holding the
// endpoints eps (each encoded) and replicas, then the activator on
// socket, then the policy, as proto.Marshal orders a
// ClusterLoadAssignment's fields.
func encodedAssignment(name string, eps [][]byte, replicas []replicaEndpoint, socket string) Encoded {
	size := 0
	for _, e := range eps {
		size += protowire.SizeTag(localityEPs) + protowire.SizeBytes(len(e))
	}
	for _, r := range replicas {
		size += protowire.SizeTag(localityEPs) + protowire.SizeBytes(r.size())
	}
	b := make([]byte, 0, len(name)+size+len(activatorEncoded[socket])+len(claPolicy)+16)
	b = protowire.AppendTag(b, claName, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = protowire.AppendTag(b, claEndpoints, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	for _, e := range eps {
		b = protowire.AppendTag(b, localityEPs, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	for _, r := range replicas {
		b = protowire.AppendTag(b, localityEPs, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(r.size()))
		b = appendHost(append(b, r.head()...), r.host, r.port)
	}
	b = append(append(b, activatorEncoded[socket]...), claPolicy...)
	return encodedAs(name, b, hashBytes(b))
}

func marshalDeterministic(m proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", proto.MessageName(m), err)
	}
	return b, nil
}
