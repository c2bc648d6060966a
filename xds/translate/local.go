package translate

import (
	"maps"
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	rawbuffer "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// Same-node calls. With mTLS, a backend's shared cluster lists its nodes
// by their inbound listeners, and a node running replicas of it would call
// its own inbound listener over TLS. Such a node gets its own version of
// the cluster instead (localView): the same cluster, whose assignment
// (NodeViewAssignmentName) lists the other nodes as the shared one does
// and the node's own replicas directly on loopback, marked local, which
// the cluster reaches without TLS. Weights stay per replica (a node by its
// healthy replicas, a local replica 1), so splits and shadows keep their
// proportions.

// localMatch marks a node's own replicas in its view of a backend.
const (
	localMatchFilter = "envoy.transport_socket_match"
	localMatchKey    = "servemesh_local"
	localSocket      = "local"
)

// localView is node's version of b's shared cluster c: a copy of c with
// the EDS service name of node's view (its socket matches, set by
// secureClusters, already reach local hosts without TLS).
func localView(c *cluster.Cluster, b ir.Backend, node string) *cluster.Cluster {
	out := proto.CloneOf(c)
	out.EdsClusterConfig = &cluster.Cluster_EdsClusterConfig{EdsConfig: c.GetEdsClusterConfig().GetEdsConfig(), ServiceName: wire.NodeViewAssignmentName(b.Name, node)}
	return out
}

// nodeViewAssignments are, for every backend reached over mTLS and every
// node running replicas of it, that node's view of it: the other nodes by
// their inbound listeners, its own replicas on loopback.
func nodeViewAssignments(m *ir.DataPlane) []*endpoint.ClusterLoadAssignment {
	var out []*endpoint.ClusterLoadAssignment
	eachNodeOf(m, func(b ir.Backend, node string, own []ir.Replica) {
		if hasNodeView(b) {
			out = append(out, withActivator(nodeViewAssignment(b, node, own), wire.ActivatorSocket))
		}
	})
	return out
}

func nodeViewAssignment(b ir.Backend, node string, own []ir.Replica) *endpoint.ClusterLoadAssignment {
	others := b
	others.Replicas = nil
	for _, r := range b.Replicas {
		if r.Node != node {
			others.Replicas = append(others.Replicas, r)
		}
	}
	locality := &endpoint.LocalityLbEndpoints{}
	if len(others.Replicas) > 0 {
		locality.LbEndpoints = inboundAssignment(others).Endpoints[0].LbEndpoints
	}
	mine := BuildAssignment(ir.Backend{Name: b.Name, Replicas: localReplicas(own)})
	for _, ep := range mine.Endpoints[0].LbEndpoints {
		ep.Metadata = localMetadata()
		ep.LoadBalancingWeight = wrapperspb.UInt32(1)
		locality.LbEndpoints = append(locality.LbEndpoints, ep)
	}
	return assignment(wire.NodeViewAssignmentName(b.Name, node), locality)
}

// eachNodeOf calls fn for every backend of m reached over mTLS and every
// node running replicas of it, with those replicas, in order.
func eachNodeOf(m *ir.DataPlane, fn func(b ir.Backend, node string, own []ir.Replica)) {
	for _, b := range sortedBackends(m) {
		if !b.ViaInbound() {
			continue
		}
		byNode := map[string][]ir.Replica{}
		for _, r := range b.Replicas {
			byNode[r.Node] = append(byNode[r.Node], r)
		}
		for _, node := range slices.Sorted(maps.Keys(byNode)) {
			fn(b, node, byNode[node])
		}
	}
}

// localReplicas are replicas as their own node reaches them: by address.
func localReplicas(rs []ir.Replica) []ir.Replica {
	out := make([]ir.Replica, 0, len(rs))
	for _, r := range rs {
		out = append(out, ir.Replica{Address: r.Address, Health: r.Health})
	}
	return out
}

// localMetadata marks a host the node reaches on its own machine, without
// TLS (localRawSocket). One value, shared by every such host of every
// assignment (a node of a large mesh has thousands): built assignments
// are read, never written.
func localMetadata() *core.Metadata { return localHostMetadata }

var localHostMetadata = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
	localMatchFilter: {Fields: map[string]*structpb.Value{localMatchKey: structpb.NewBoolValue(true)}},
}}

// localRawSocket is the transport socket match of the hosts localMetadata
// marks: plain bytes, on a cluster whose other hosts need TLS. One value,
// shared by every cluster reached over mTLS: built clusters are read,
// never written.
var localRawSocket = []*cluster.Cluster_TransportSocketMatch{{
	Name:            localSocket,
	Match:           &structpb.Struct{Fields: map[string]*structpb.Value{localMatchKey: structpb.NewBoolValue(true)}},
	TransportSocket: &core.TransportSocket{Name: "envoy.transport_sockets.raw_buffer", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(&rawbuffer.RawBuffer{})}},
}}
