package translate

import (
	"fmt"
	"maps"
	"slices"

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
// three nodes has seven in all, most of them made of the same endpoints.
// A full publish of a large mesh spent a third of its time building and
// encoding them one by one. encodedNodeAssignments encodes each endpoint
// once, a replica's as its node reaches it and a node's as others reach
// it, and frames each node's assignments from those encodings with
// protowire: the bytes proto.Marshal would make of the assignments
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

// nodeAssignments are b's inbound and view assignments on every node
// running its replicas, encoded: framed from their endpoints' encodings
// where its nodes and their inbound listeners pair one to one, else
// built and encoded one by one.
func nodeAssignments(b ir.Backend) ([]Encoded, error) {
	if !b.ViaInbound() {
		return nil, nil
	}
	out, ok, err := encodedNodeAssignments(b)
	if ok || err != nil {
		return out, err
	}
	one := &ir.DataPlane{Backends: []ir.Backend{b}}
	for _, cla := range append(inboundAssignments(one), nodeViewAssignments(one)...) {
		e, err := encode(cla.GetClusterName(), cla)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// encodedNodeAssignments are b's inbound and view assignments on every
// node running its replicas, encoded (eachNodeOf's order: by node, the
// inbound one first, then the view if b has views). ok is false when b's
// nodes and inbound listeners do not pair one to one (an agent moving its
// inbound listener): then the caller builds them message by message.
func encodedNodeAssignments(b ir.Backend) (out []Encoded, ok bool, err error) {
	byNode, inbound, ok := nodesOf(b)
	if !ok {
		return nil, false, nil
	}
	// inboundAssignment lists a node each, sorted by inbound listener.
	listeners := slices.Sorted(maps.Values(inbound))
	nodeEP := make(map[string][]byte, len(listeners)) // by inbound listener
	for i, ep := range inboundAssignment(b).Endpoints[0].LbEndpoints {
		if nodeEP[listeners[i]], err = marshalDeterministic(ep); err != nil {
			return nil, false, err
		}
	}
	for _, node := range slices.Sorted(maps.Keys(byNode)) {
		plain := BuildAssignment(ir.Backend{Name: b.Name, Replicas: localReplicas(byNode[node])}).Endpoints[0].LbEndpoints
		mine, marked, err := replicaEndpoints(plain)
		if err != nil {
			return nil, false, err
		}
		out = append(out, encodedAssignment(wire.InboundAssignmentName(b.Name, node), mine, wire.ActivatorInboundSocket))
		if !hasNodeView(b) {
			continue
		}
		var eps [][]byte
		for _, in := range listeners {
			if in != inbound[node] {
				eps = append(eps, nodeEP[in])
			}
		}
		out = append(out, encodedAssignment(wire.NodeViewAssignmentName(b.Name, node), append(eps, marked...), wire.ActivatorSocket))
	}
	return out, true, nil
}

// replicaEndpoints encodes a node's replicas' endpoints (eps, as
// BuildAssignment lists them) as its inbound assignment lists them, and
// marked as its own in its view (nodeViewAssignment: the local metadata,
// weight 1). proto.Marshal writes an endpoint's other fields by number
// and its host last (a oneof), so each is its fields but the host,
// encoded once for every health (endpointHeads), followed by its host.
func replicaEndpoints(eps []*endpoint.LbEndpoint) (plain, marked [][]byte, err error) {
	plain, marked = make([][]byte, len(eps)), make([][]byte, len(eps))
	for i, ep := range eps {
		host, err := marshalDeterministic(&endpoint.LbEndpoint{HostIdentifier: ep.HostIdentifier})
		if err != nil {
			return nil, nil, err
		}
		head, ok := endpointHeads[ep.GetHealthStatus()]
		if !ok {
			return nil, nil, fmt.Errorf("encode endpoint: health %v has no encoding", ep.GetHealthStatus())
		}
		plain[i], marked[i] = append(slices.Clip(head.plain), host...), append(slices.Clip(head.marked), host...)
	}
	return plain, marked, nil
}

// endpointHeads are an endpoint's fields but its host, encoded, by health:
// plain, and marked local.
var endpointHeads = func() map[core.HealthStatus]struct{ plain, marked []byte } {
	out := map[core.HealthStatus]struct{ plain, marked []byte }{}
	for v := range core.HealthStatus_name {
		h := core.HealthStatus(v)
		out[h] = struct{ plain, marked []byte }{mustEncode(&endpoint.LbEndpoint{HealthStatus: h}),
			mustEncode(&endpoint.LbEndpoint{HealthStatus: h, Metadata: localMetadata(), LoadBalancingWeight: wrapperspb.UInt32(1)})}
	}
	return out
}()

// nodesOf groups b's replicas by node, with each node's inbound listener;
// ok says each node has one inbound listener and no two nodes share one.
func nodesOf(b ir.Backend) (byNode map[string][]ir.Replica, inbound map[string]string, ok bool) {
	byNode, inbound = map[string][]ir.Replica{}, map[string]string{}
	owner := map[string]string{} // node by inbound listener
	for _, r := range b.Replicas {
		if in, seen := inbound[r.Node]; seen && in != r.Inbound {
			return nil, nil, false
		}
		if n, seen := owner[r.Inbound]; seen && n != r.Node {
			return nil, nil, false
		}
		inbound[r.Node], owner[r.Inbound] = r.Inbound, r.Node
		byNode[r.Node] = append(byNode[r.Node], r)
	}
	return byNode, inbound, true
}

// encodedAssignment frames an assignment of one locality holding the
// endpoints eps (each encoded), then the activator on socket, then the
// policy, as proto.Marshal orders a ClusterLoadAssignment's fields.
func encodedAssignment(name string, eps [][]byte, socket string) Encoded {
	size := 0
	for _, e := range eps {
		size += protowire.SizeTag(localityEPs) + protowire.SizeBytes(len(e))
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
	b = append(append(b, activatorEncoded[socket]...), claPolicy...)
	return encodedAs(name, (&endpoint.ClusterLoadAssignment{}).ProtoReflect().Type(), b, hashBytes(b))
}

func marshalDeterministic(m proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", proto.MessageName(m), err)
	}
	return b, nil
}
