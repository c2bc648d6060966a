package translate

import (
	"fmt"
	"sync"

	accesslog "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutation "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	headermutation "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// buildInboundListener is node's inbound listener: one filter chain per
// backend with replicas here, chosen by the SNI the caller asks for,
// presenting the backend's identity and requiring a client certificate of
// a servemesh node. A connection that names no such backend, or brings no
// or another certificate, is closed.
func buildInboundListener(node wire.ProxyNode, local []ir.Backend, chainOf func(ir.Backend) (*listener.FilterChain, error)) (*listener.Listener, error) {
	l, err := inboundListenerHead(node)
	if err != nil {
		return nil, err
	}
	for _, b := range local {
		chain, err := chainOf(b)
		if err != nil {
			return nil, err
		}
		l.FilterChains = append(l.FilterChains, chain)
	}
	return l, nil
}

// inboundChain serves backend on the inbound listener: mTLS terminated
// with the backend's identity, then HTTP to the backend's replicas here.
func inboundChain(node wire.ProxyNode, t *MTLS, b ir.Backend, tracing *ir.Tracing) (*listener.FilterChain, error) {
	backend := b.Name
	downstream := &tlsv3.DownstreamTlsContext{
		RequireClientCertificate: wrapperspb.Bool(true),
		CommonTlsContext: &tlsv3.CommonTlsContext{
			// HTTP/2 for callers of HTTP/2 and gRPC backends, which ask for it.
			AlpnProtocols:                  []string{"h2", "http/1.1"},
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{wire.FileSecret(wire.SecretsDir, wire.BackendSecret(backend))},
			ValidationContextType: validation(uriMatcher(&matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Prefix{
				Prefix: t.IdentityPrefix + wire.NodeServicePrefix}})),
		},
	}
	socket, err := tlsSocket(downstream)
	if err != nil {
		return nil, fmt.Errorf("inbound listener, backend %s: %w", backend, err)
	}
	filters, err := filtersFor(inbound, filterInput{backend: b})
	if err != nil {
		return nil, fmt.Errorf("inbound listener, backend %s: %w", backend, err)
	}
	served, scrubbed := servedReplicaHeaders(b)
	manager := inboundLimits.applied(patchManager(node, wire.InboundListener, &hcm.HttpConnectionManager{
		StatPrefix:     wire.InboundListener + "_" + backend,
		CodecType:      hcm.HttpConnectionManager_AUTO,
		UpgradeConfigs: upgrades(),
		RouteSpecifier: &hcm.HttpConnectionManager_RouteConfig{RouteConfig: &route.RouteConfiguration{
			Name: wire.InboundListener + "_" + backend,
			// The listener and its cluster come in separate updates, in
			// either order: an inline route naming a cluster Envoy does not
			// have yet is otherwise refused, and not asked for again.
			ValidateClusters: wrapperspb.Bool(false),
			VirtualHosts: []*route.VirtualHost{{
				Name: "_inbound", Domains: []string{"*"},
				Routes: []*route.Route{{
					Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
					// The hop's span, when traced.
					Decorator: &route.Decorator{Operation: "inbound " + backend},
					// With an external picker: the replica that served.
					ResponseHeadersToAdd:    served,
					ResponseHeadersToRemove: scrubbed,
					Action: &route.Route_Route{Route: &route.RouteAction{
						ClusterSpecifier: &route.RouteAction_Cluster{Cluster: wire.InboundClusterName(backend)},
						// The calling node keeps the endpoint's timeouts.
						Timeout:     durationpb.New(0),
						IdleTimeout: durationpb.New(0),
						// Another replica here, if the request reached none
						// (or the activator held it until one was ready);
						// then the caller tries another node.
						RetryPolicy: inboundRetryPolicy(),
					}},
				}},
			}},
		}},
		HttpFilters:      filters,
		LocalReplyConfig: inboundLocalReplies,
	}))
	// The hop's span is the caller's upstream span's child; a shadow copy
	// says whose (the caller's mirror marks it).
	if err := traceManager(manager, tracing, node.ID, literalTag(wire.TagBackend, backend), headerTag(wire.TagShadowOf, wire.ShadowHeader)); err != nil {
		return nil, fmt.Errorf("inbound listener, backend %s: %w", backend, err)
	}
	packed, err := anypb.New(manager)
	if err != nil {
		return nil, fmt.Errorf("inbound listener: pack http connection manager: %w", err)
	}
	return &listener.FilterChain{
		Name:             wire.BackendSecret(backend),
		FilterChainMatch: &listener.FilterChainMatch{ServerNames: []string{wire.BackendSNI(backend)}, TransportProtocol: "tls"},
		TransportSocket:  socket,
		// A caller that has not finished its TLS handshake by then is cut.
		TransportSocketConnectTimeout: durationpb.New(inboundHandshakeTimeout),
		Filters: []*listener.Filter{{
			Name:       "envoy.filters.network.http_connection_manager",
			ConfigType: &listener.Filter_TypedConfig{TypedConfig: packed},
		}},
	}, nil
}

// inboundListenerHead is node's inbound listener without its filter
// chains.
func inboundListenerHead(node wire.ProxyNode) (*listener.Listener, error) {
	inspector, err := anypb.New(&tlsinspector.TlsInspector{})
	if err != nil {
		return nil, fmt.Errorf("inbound listener: pack tls inspector: %w", err)
	}
	return &listener.Listener{
		Name:                          wire.InboundListener,
		Address:                       socketAddress(node.InboundAddress, node.InboundPort),
		PerConnectionBufferLimitBytes: wrapperspb.UInt32(inboundLimits.bufferBytes),
		ListenerFilters: []*listener.ListenerFilter{{
			Name:       "envoy.filters.listener.tls_inspector",
			ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: inspector},
		}},
	}, nil
}

// chainKey is what a backend's inbound chain depends on besides the
// mesh's mTLS and tracing, which are a Builder's: the backend's
// configuration (configHash), the connection-manager features its node
// uses and, when the mesh traces, the node, whose name its spans carry.
type chainKey struct {
	backend, config, managers, tracedBy string
}

// nodeChainKey is the part of the key of node's chains that is the
// node's; each chain adds its backend and configuration (of).
func nodeChainKey(node wire.ProxyNode, tracing *ir.Tracing) chainKey {
	k := chainKey{managers: managerFeaturesOf(node)}
	if tracing != nil {
		k.tracedBy = node.ID
	}
	return k
}

// of is the key of backend's chain, of configuration config, on k's node.
func (k chainKey) of(backend, config string) chainKey {
	k.backend, k.config = backend, config
	return k
}

// sharedChains are the inbound chains one ForNodes built, by what they
// depend on: a backend on three nodes had its chain built three times
// alike (a first mTLS publish of a 30-node mesh built 9,000 where 3,000
// differ). Built chains are read, never written, so nodes share them.
type sharedChains struct {
	mu    sync.Mutex
	built map[chainKey]*listener.FilterChain
	off   bool // an uncached builder's: every node builds its own
}

// get is the chain of key, built by build if no node has built it yet.
// Two nodes may build the same chain at once; both are the same, and the
// first stored is kept.
func (s *sharedChains) get(key chainKey, build func() (*listener.FilterChain, error)) (*listener.FilterChain, error) {
	if s.off {
		return build()
	}
	s.mu.Lock()
	c, ok := s.built[key]
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	c, err := build()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if first, ok := s.built[key]; ok {
		return first, nil
	}
	s.built[key] = c
	return c, nil
}

// inboundRetryPolicy retries what reached no replica: on a replica of the
// node not tried yet, and when the node's activator answers that one is
// ready now.
func inboundRetryPolicy() *route.RetryPolicy {
	policy := retryPolicy(retryOn + ",retriable-headers")
	policy.RetriableHeaders = []*route.HeaderMatcher{{
		Name: wire.UnreachedHeader, HeaderMatchSpecifier: &route.HeaderMatcher_PresentMatch{PresentMatch: true}}}
	return policy
}

// inboundLocalReplies mark the answers the inbound listener makes itself
// when its replicas do not answer, by why, so the calling node retries
// what is safe to retry on another node (retriedHeaders). Envoy's response
// flags: UF connection failure, UH no healthy replica, UO overflow (all
// busy), NC no such cluster (yet), URX retries exhausted, all before the
// request reached a replica; UR and UC a reset after it was sent.
var inboundLocalReplies = &hcm.LocalReplyConfig{Mappers: []*hcm.ResponseMapper{
	localReplyHeader([]string{"UF", "UH", "UO", "NC", "URX"}, wire.UnreachedHeader),
	localReplyHeader([]string{"UR", "UC"}, wire.ResetHeader),
}}

func localReplyHeader(flags []string, header string) *hcm.ResponseMapper {
	return &hcm.ResponseMapper{
		Filter: &accesslog.AccessLogFilter{FilterSpecifier: &accesslog.AccessLogFilter_ResponseFlagFilter{
			ResponseFlagFilter: &accesslog.ResponseFlagFilter{Flags: flags}}},
		HeadersToAdd: []*core.HeaderValueOption{{
			Header:       &core.HeaderValue{Key: header, Value: "1"},
			AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}},
	}
}

// buildInboundCluster reaches b's replicas on node, replicas of them,
// each at most max_concurrent_queries at a time, with the rest queued. Its
// replicas come by EDS (inboundAssignments), so a replica's health change
// leaves the cluster as it is, and their count is all it reads of them.
func buildInboundCluster(b ir.Backend, node string, replicas int) (*cluster.Cluster, error) {
	c := &cluster.Cluster{
		Name:                 wire.InboundClusterName(b.Name),
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig: &cluster.Cluster_EdsClusterConfig{EdsConfig: edsConfigSource(),
			ServiceName: wire.InboundAssignmentName(b.Name, node)},
		ConnectTimeout:  durationpb.New(ConnectTimeout),
		LbPolicy:        cluster.Cluster_LEAST_REQUEST,
		CommonLbConfig:  &cluster.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: 0}},
		CircuitBreakers: circuitBreakersOf(b, replicas),
	}
	return c, patchInboundCluster(b, c)
}

// inboundAssignments are, for every node with replicas of a backend reached
// over mTLS, the assignment of its inbound cluster: its own replicas on
// loopback, with their health. Sorted by name.
func inboundAssignments(m *ir.DataPlane) []*endpoint.ClusterLoadAssignment {
	var out []*endpoint.ClusterLoadAssignment
	eachNodeOf(m, func(b ir.Backend, node string, own []ir.Replica) {
		cla := BuildAssignment(ir.Backend{Name: b.Name, Replicas: localReplicas(own)})
		cla.ClusterName = wire.InboundAssignmentName(b.Name, node)
		out = append(out, withActivator(cla, wire.ActivatorInboundSocket))
	})
	return out
}

// replicaReportScrub removes the load reports a replica sends, in its
// answer's headers or trailers, text or binary: callers weigh nodes by
// reports, so a replica's own would steer its backend's traffic mesh-wide.
// It sits just before the router, so answers pass it before the picker's
// filter, which adds the node's report.
func replicaReportScrub() (*hcm.HttpFilter, error) {
	var remove []*mutation.HeaderMutation
	for _, h := range []string{wire.LoadReportHeader, wire.LoadReportBinHeader} {
		remove = append(remove, &mutation.HeaderMutation{Action: &mutation.HeaderMutation_Remove{Remove: h}})
	}
	cfg, err := anypb.New(&headermutation.HeaderMutation{Mutations: &headermutation.Mutations{
		ResponseMutations: remove, ResponseTrailersMutations: remove,
	}})
	if err != nil {
		return nil, fmt.Errorf("inbound listener: pack header mutation: %w", err)
	}
	return &hcm.HttpFilter{Name: "servemesh.replica_report_scrub", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: cfg}}, nil
}
