package translate

import (
	"maps"
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	rawbuffer "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	"google.golang.org/protobuf/encoding/protowire"
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

// localView is node's version of b's shared cluster c: c with the EDS
// service name of node's view (its socket matches, set by
// secureClusters, already reach local hosts without TLS). It shares c's
// messages but its EDS configuration (copying them cost a full mTLS
// publish a tenth of its time): a built cluster is read, never written.
func localView(c *cluster.Cluster, b ir.Backend, node string) *cluster.Cluster {
	return withEDSService(c, wire.NodeViewAssignmentName(b.Name, node))
}

// withEDSService is c asking for the assignment service by EDS, sharing
// c's messages but its EDS configuration.
func withEDSService(c *cluster.Cluster, service string) *cluster.Cluster {
	out := shallowCopy(c)
	out.EdsClusterConfig = &cluster.Cluster_EdsClusterConfig{EdsConfig: c.GetEdsClusterConfig().GetEdsConfig(), ServiceName: service}
	return out
}

// shallowCopy is a cluster with c's fields, sharing c's messages: every
// exported field of the generated struct, one for each of the message's
// fields and oneofs (its own state and unknown fields are unexported,
// and built clusters have none). Protoreflect's Range and Set cost a
// node's views of the backends it runs six times as much, and a
// reflected copy of the struct's fields ten times;
// TestShallowCopyHasEveryField sets every field, so a field a newer
// go-control-plane adds fails it until it is listed here.
func shallowCopy(c *cluster.Cluster) *cluster.Cluster {
	//nolint:staticcheck // deprecated fields are copied too: a cluster may set them
	return &cluster.Cluster{
		TransportSocketMatches:                  c.TransportSocketMatches,
		TransportSocketMatcher:                  c.TransportSocketMatcher,
		Name:                                    c.Name,
		AltStatName:                             c.AltStatName,
		StatsMatcher:                            c.StatsMatcher,
		ClusterDiscoveryType:                    c.ClusterDiscoveryType,
		EdsClusterConfig:                        c.EdsClusterConfig,
		ConnectTimeout:                          c.ConnectTimeout,
		PerConnectionBufferLimitBytes:           c.PerConnectionBufferLimitBytes,
		PerConnectionBufferHighWatermarkTimeout: c.PerConnectionBufferHighWatermarkTimeout,
		LbPolicy:                                c.LbPolicy,
		LoadAssignment:                          c.LoadAssignment,
		HealthChecks:                            c.HealthChecks,
		MaxRequestsPerConnection:                c.MaxRequestsPerConnection,
		CircuitBreakers:                         c.CircuitBreakers,
		UpstreamHttpProtocolOptions:             c.UpstreamHttpProtocolOptions,
		CommonHttpProtocolOptions:               c.CommonHttpProtocolOptions,
		HttpProtocolOptions:                     c.HttpProtocolOptions,
		Http2ProtocolOptions:                    c.Http2ProtocolOptions,
		TypedExtensionProtocolOptions:           c.TypedExtensionProtocolOptions,
		DnsRefreshRate:                          c.DnsRefreshRate,
		DnsJitter:                               c.DnsJitter,
		DnsFailureRefreshRate:                   c.DnsFailureRefreshRate,
		RespectDnsTtl:                           c.RespectDnsTtl,
		DnsLookupFamily:                         c.DnsLookupFamily,
		DnsResolvers:                            c.DnsResolvers,
		UseTcpForDnsLookups:                     c.UseTcpForDnsLookups,
		DnsResolutionConfig:                     c.DnsResolutionConfig,
		TypedDnsResolverConfig:                  c.TypedDnsResolverConfig,
		WaitForWarmOnInit:                       c.WaitForWarmOnInit,
		OutlierDetection:                        c.OutlierDetection,
		CleanupInterval:                         c.CleanupInterval,
		UpstreamBindConfig:                      c.UpstreamBindConfig,
		LbSubsetConfig:                          c.LbSubsetConfig,
		LbConfig:                                c.LbConfig,
		CommonLbConfig:                          c.CommonLbConfig,
		TransportSocket:                         c.TransportSocket,
		Metadata:                                c.Metadata,
		ProtocolSelection:                       c.ProtocolSelection,
		UpstreamConnectionOptions:               c.UpstreamConnectionOptions,
		CloseConnectionsOnHostHealthFailure:     c.CloseConnectionsOnHostHealthFailure,
		IgnoreHealthOnHostRemoval:               c.IgnoreHealthOnHostRemoval,
		Filters:                                 c.Filters,
		LoadBalancingPolicy:                     c.LoadBalancingPolicy,
		LrsServer:                               c.LrsServer,
		LrsReportEndpointMetrics:                c.LrsReportEndpointMetrics,
		TrackTimeoutBudgets:                     c.TrackTimeoutBudgets,
		UpstreamConfig:                          c.UpstreamConfig,
		TrackClusterStats:                       c.TrackClusterStats,
		PreconnectPolicy:                        c.PreconnectPolicy,
		ConnectionPoolPerDownstreamConnection:   c.ConnectionPoolPerDownstreamConnection,
		QueuingPolicies:                         c.QueuingPolicies,
	}
}

// localViewEncoded is localView's cluster, encoded from shared, the
// shared cluster's encoding. Protobuf merges a message's encodings when
// they are concatenated, a later singular field replacing an earlier one
// and messages merged field by field, so the shared cluster's encoding
// followed by that of an EDS configuration with the view's service name
// alone is the view's, without encoding the whole cluster again for each
// node that runs the backend (TestBuilderBuildsWhatSharedBuilds decodes
// every node's clusters as sent).
func localViewEncoded(shared Encoded, c *cluster.Cluster) Encoded {
	return appendEncoded(shared, edsServicePatch(c.GetEdsClusterConfig().GetServiceName()))
}

// appendEncoded is base, a resource's encoding, followed by patches,
// encodings of messages of its type that set some of its fields, under
// base's name. Its version hashes base's with the patches, which decide
// the encoding as well as hashing it whole would.
func appendEncoded(base Encoded, patches ...[]byte) Encoded {
	n := len(base.bytes())
	for _, p := range patches {
		n += len(p)
	}
	var hashed [256]byte // what the version hashes, on the stack unless longer
	b, version := append(make([]byte, 0, n), base.bytes()...), append(hashed[:0], base.Version...)
	for _, p := range patches {
		b, version = append(b, p...), append(version, p...)
	}
	return encodedAs(base.Name, b, hashBytes(version))
}

// Cluster.eds_cluster_config, and its service_name.
const (
	clusterEDSConfig protowire.Number = 3
	edsServiceName   protowire.Number = 2
)

// edsServicePatch is proto.Marshal's encoding of a cluster whose only
// field is an EDS configuration naming service, which is never empty
// (TestEDSServicePatch).
func edsServicePatch(service string) []byte {
	inner := protowire.SizeTag(edsServiceName) + protowire.SizeBytes(len(service))
	b := make([]byte, 0, protowire.SizeTag(clusterEDSConfig)+protowire.SizeBytes(inner))
	b = protowire.AppendTag(b, clusterEDSConfig, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(inner))
	b = protowire.AppendTag(b, edsServiceName, protowire.BytesType)
	return protowire.AppendString(b, service)
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
