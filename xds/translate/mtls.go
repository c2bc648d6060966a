package translate

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// MTLS is the mesh's mTLS setting: every request for a replica servemesh
// runs goes from the calling node's Envoy to the inbound listener of the
// replica's node over mTLS, which forwards it to the replica on loopback.
type MTLS struct {
	// IdentityPrefix is the SPIFFE id of a service without its name, as the
	// CA issues them: "spiffe://<trust domain>/ns/default/dc/<dc>/svc/". A
	// backend's identity is the prefix and its name; a node's is the prefix
	// and wire.NodeServicePrefix and its id.
	IdentityPrefix string
}

// Validate checks the identity prefix.
func (t *MTLS) Validate() error {
	if !strings.HasPrefix(t.IdentityPrefix, "spiffe://") || !strings.HasSuffix(t.IdentityPrefix, "/svc/") {
		return fmt.Errorf("mtls identity prefix %q is not a SPIFFE id prefix ending in /svc/", t.IdentityPrefix)
	}
	return nil
}

// inboundAssignment lists b's nodes, each by its inbound listener, weighted
// by its healthy replicas: healthy with one or more, else draining if one
// drains, else unhealthy. The node's Envoy picks among its own replicas.
func inboundAssignment(b ir.Backend) *endpoint.ClusterLoadAssignment {
	nodes := byInbound(b)
	locality := &endpoint.LocalityLbEndpoints{}
	for _, in := range slices.Sorted(maps.Keys(nodes)) {
		health, weight := nodeHealth(nodes[in])
		ap := netip.MustParseAddrPort(in) // checked by Validate
		locality.LbEndpoints = append(locality.LbEndpoints, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: socketAddress(ap.Addr().String(), uint32(ap.Port())),
			}},
			HealthStatus:        healthStatus(health),
			LoadBalancingWeight: wrapperspb.UInt32(uint32(weight)),
		})
	}
	return assignment(wire.ClusterName(b.Name), locality)
}

// byInbound groups b's replicas by their node's inbound listener.
func byInbound(b ir.Backend) map[string][]ir.Replica {
	out := map[string][]ir.Replica{}
	for _, r := range b.Replicas {
		out[r.Inbound] = append(out[r.Inbound], r)
	}
	return out
}

// nodeHealth is how callers see a node running replicas rs of a
// backend: by its best replicas (healthy, then unknown, then draining),
// weighted by how many it has of them, so that every replica gets about
// the same share.
func nodeHealth(rs []ir.Replica) (ir.Health, int) {
	for _, h := range []ir.Health{ir.Healthy, ir.Unknown, ir.Draining} {
		n := 0
		for _, r := range rs {
			if r.Health == h {
				n++
			}
		}
		if n > 0 {
			return h, n
		}
	}
	return ir.Unhealthy, 1
}

// ForNode builds what is node's own: its listeners and, with t, its
// inbound listener, the clusters to its own replicas, and its view of each
// backend it runs replicas of, which replaces the shared cluster of the
// same name (MergeClusters). m is the model, and shared the clusters by
// name, that Shared built.
func ForNode(m *ir.DataPlane, node wire.ProxyNode, t *MTLS, shared map[string]*cluster.Cluster) (*Resources, error) {
	var local []ir.Backend
	if t != nil {
		local = localBackends(m, node.ID)
	}
	return forNode(node, t, local, shared, m.Tracing)
}

// forNode is ForNode given the backends with replicas on node, each with
// only its replicas there, sorted by name, and the filters its public
// listener needs.
func forNode(node wire.ProxyNode, t *MTLS, local []ir.Backend, shared map[string]*cluster.Cluster, tracing *ir.Tracing) (*Resources, error) {
	listeners, err := nodeListeners(node, t, local, tracing, func(b ir.Backend) (*listener.FilterChain, error) {
		return inboundChain(node, t, b, tracing)
	})
	if err != nil {
		return nil, err
	}
	clusters := nodeServiceClusters(t, tracing)
	for _, b := range local {
		own, err := backendClustersOn(b, node.ID, shared)
		if err != nil {
			return nil, err
		}
		clusters = append(clusters, own...)
	}
	return &Resources{Listeners: listeners, Clusters: clusters}, nil
}

// nodeListeners are node's listeners: its public and mesh ones and, with
// t and backends running here (local), its inbound listener, one filter
// chain per local backend, as chain makes it (inboundChain, or a copy the
// caller kept).
func nodeListeners(node wire.ProxyNode, t *MTLS, local []ir.Backend, tracing *ir.Tracing, chain func(ir.Backend) (*listener.FilterChain, error)) ([]*listener.Listener, error) {
	listeners, err := buildListeners(node, tracing)
	if err != nil {
		return nil, err
	}
	if t == nil {
		return listeners, nil
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if !node.MTLS() {
		return nil, fmt.Errorf("node %q announces no inbound listener, but the mesh runs mTLS: start its agent with mTLS", node.ID)
	}
	if len(local) == 0 {
		return listeners, nil // Envoy refuses a listener without filter chains
	}
	inbound, err := buildInboundListener(node, local, chain)
	if err != nil {
		return nil, err
	}
	listeners = append(listeners, inbound)
	sortByName(listeners, func(l *listener.Listener) string { return l.GetName() })
	return listeners, nil
}

// nodeServiceClusters are the clusters of the agent's services every
// node has: its rate limit service, its access log service (GenAI
// signals), the mesh's trace collector if it
// traces, and with t its picker (its inbound listener's for load-aware
// backends, its outbound listeners' for prompt-affine endpoints).
func nodeServiceClusters(t *MTLS, tracing *ir.Tracing) []*cluster.Cluster {
	out := []*cluster.Cluster{rateLimitServiceCluster(), genAICluster()}
	if tracing != nil {
		out = append(out, tracingCluster(tracing))
	}
	if t != nil {
		out = append(out, pickerCluster())
	}
	return out
}

// backendClustersOn are b's clusters on node, which runs replicas of it
// (b lists only those): its inbound cluster and, unless b is called
// through the inbound listener alone, the node's view of b, which
// replaces the shared cluster of that name.
func backendClustersOn(b ir.Backend, node string, shared map[string]*cluster.Cluster) ([]*cluster.Cluster, error) {
	inboundCluster, err := buildInboundCluster(b, node, len(b.Replicas))
	if err != nil {
		return nil, err
	}
	if !hasNodeView(b) {
		return []*cluster.Cluster{inboundCluster}, nil // called through the inbound listener, as other nodes call it
	}
	c, ok := shared[wire.ClusterName(b.Name)]
	if !ok {
		return nil, fmt.Errorf("node %q: no shared cluster of backend %q", node, b.Name)
	}
	return []*cluster.Cluster{inboundCluster, localView(c, b, node)}, nil
}

// ClustersByName indexes clusters by name, as ForNode takes them.
func ClustersByName(clusters []*cluster.Cluster) map[string]*cluster.Cluster {
	out := make(map[string]*cluster.Cluster, len(clusters))
	for _, c := range clusters {
		out[c.GetName()] = c
	}
	return out
}

// localBackends are m's backends reached over mTLS with a replica on node,
// sorted by name, each with only its replicas there.
func localBackends(m *ir.DataPlane, node string) []ir.Backend {
	var out []ir.Backend
	for _, b := range sortedBackends(m) {
		if !b.ViaInbound() {
			continue
		}
		if b = replicasOn(b, node); len(b.Replicas) > 0 {
			out = append(out, b)
		}
	}
	return out
}

// replicasOn is b with only its replicas on node.
func replicasOn(b ir.Backend, node string) ir.Backend {
	var here []ir.Replica
	for _, r := range b.Replicas {
		if r.Node == node {
			here = append(here, r)
		}
	}
	b.Replicas = here
	return b
}

// secureClusters gives the clusters of backends reached over mTLS the
// calling node's identity (from its SecretsDir, the same path on every
// node, so the clusters stay shared), each cluster's socket from socket
// (upstreamTLS, or the one a previous build made of it).
func secureClusters(m *ir.DataPlane, socket socketFunc, clusters []*cluster.Cluster) error {
	secure := map[string]bool{}
	for _, b := range m.Backends {
		if b.Reach == ir.ReachInbound {
			secure[wire.ClusterName(b.Name)] = true
		}
	}
	for _, c := range clusters {
		if !secure[c.GetName()] {
			continue
		}
		tls, err := socket(c.GetName(), c.GetTypedExtensionProtocolOptions() != nil)
		if err != nil {
			return err
		}
		c.TransportSocket = tls
		// The node's activator is on its own machine, without TLS.
		c.TransportSocketMatches = localRawSocket
		// Each replica's own limit is kept by its node's inbound cluster;
		// here a host is a node with several replicas.
		c.CircuitBreakers.PerHostThresholds = nil
	}
	return nil
}

// socketFunc is the transport socket of the cluster name, which speaks
// HTTP/2 if h2.
type socketFunc func(name string, h2 bool) (*core.TransportSocket, error)

// sockets is t's upstreamTLS.
func sockets(t *MTLS) socketFunc {
	return func(name string, h2 bool) (*core.TransportSocket, error) { return upstreamTLS(t, name, h2) }
}

// reusedSockets is t's upstreamTLS, reusing the sockets of prior, a
// backend's clusters built before by it: a socket depends on the mesh's
// identities, the cluster's name and its protocol alone, and a full mTLS
// publish built and packed one for each of thousands of backends (a
// twentieth of its time). Built clusters are read, never written, so the
// sockets are shared.
func reusedSockets(t *MTLS, prior []*cluster.Cluster) socketFunc {
	return func(name string, h2 bool) (*core.TransportSocket, error) {
		for _, c := range prior {
			if c.GetName() == name && (c.GetTypedExtensionProtocolOptions() != nil) == h2 && c.GetTransportSocket() != nil {
				return c.GetTransportSocket(), nil
			}
		}
		return upstreamTLS(t, name, h2)
	}
}

// upstreamTLS is how a node calls backend's nodes: with its own identity,
// asking for the backend by SNI and accepting only the backend's identity.
func upstreamTLS(t *MTLS, backend string, h2 bool) (*core.TransportSocket, error) {
	ctx := &tlsv3.UpstreamTlsContext{
		Sni: wire.BackendSNI(backend),
		CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{wire.FileSecret(wire.SecretsDir, wire.NodeSecret)},
			ValidationContextType:          validation(uriMatcher(&matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: t.IdentityPrefix + wire.BackendService(backend)}})),
		},
	}
	if h2 {
		ctx.CommonTlsContext.AlpnProtocols = []string{"h2"} // the inbound listener then speaks HTTP/2 too
	}
	return tlsSocket(ctx)
}

// validation trusts the CA roots in the node's secrets folder and accepts
// a peer whose URI SAN matches san.
func validation(san *tlsv3.SubjectAltNameMatcher) *tlsv3.CommonTlsContext_CombinedValidationContext {
	return &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
		DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{san}},
		ValidationContextSdsSecretConfig: wire.FileSecret(wire.SecretsDir, wire.RootsSecret),
	}}
}

func uriMatcher(m *matcher.StringMatcher) *tlsv3.SubjectAltNameMatcher {
	return &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI, Matcher: m}
}

func tlsSocket(ctx proto.Message) (*core.TransportSocket, error) {
	typed, err := anypb.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("pack TLS context: %w", err)
	}
	return &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: typed}}, nil
}
