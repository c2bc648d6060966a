package translate

import (
	"fmt"

	accesslog "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	reqwithoutquery "github.com/envoyproxy/go-control-plane/envoy/extensions/formatter/req_without_query/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// BuildListeners builds a node's listeners: the loopback mesh one serving
// every endpoint by Host header and, unless the node is mesh-only
// (wire.ProxyNode.Public), the public one serving routed endpoints;
// with tracing, both trace their requests. Both hold every route-enabled
// filter, whatever the endpoints use: a listener that changed with them
// would be drained, and its open connections keep the old filters (an
// endpoint's new limit passed them by) until Envoy closes them at the
// drain's end, long answers included.
func buildListeners(node wire.ProxyNode, tracing *ir.Tracing) ([]*listener.Listener, error) {
	if err := node.Validate(); err != nil {
		return nil, err
	}
	mesh, err := httpListener(node, tracing, wire.MeshListener, node.MeshAddress, node.MeshPort, meshScopes())
	if err != nil {
		return nil, err
	}
	if !node.Public() {
		return []*listener.Listener{mesh}, nil
	}
	public, err := httpListener(node, tracing, wire.PublicListener, node.PublicAddress, node.PublicPort, publicScopes())
	if err != nil {
		return nil, err
	}
	if node.PublicTLS != "" {
		if err := serveTLS(public, node.PublicTLS); err != nil {
			return nil, err
		}
	}
	return []*listener.Listener{mesh, public}, nil // sorted by name
}

// serveTLS makes l serve HTTPS with the certificate of the file-based SDS
// config at sdsPath (which Envoy watches and reloads), offering HTTP/2 and
// HTTP/1.1 by ALPN.
func serveTLS(l *listener.Listener, sdsPath string) error {
	socket, err := tlsSocket(&tlsv3.DownstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		AlpnProtocols: []string{"h2", "http/1.1"},
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{
			Name: wire.PublicTLSSecret,
			SdsConfig: &core.ConfigSource{
				ResourceApiVersion:    core.ApiVersion_V3,
				ConfigSourceSpecifier: &core.ConfigSource_PathConfigSource{PathConfigSource: &core.PathConfigSource{Path: sdsPath}},
			},
		}},
	}})
	if err != nil {
		return fmt.Errorf("listener %s: %w", l.Name, err)
	}
	l.FilterChains[0].TransportSocket = socket
	return nil
}

// upgrades are the protocol upgrades every HTTP listener passes through to
// the replica: WebSocket.
func upgrades() []*hcm.HttpConnectionManager_UpgradeConfig {
	return []*hcm.HttpConnectionManager_UpgradeConfig{{UpgradeType: "websocket"}}
}

// routeSource sets where a listener's HTTP connection manager takes its
// routes from.
type routeSource func(*hcm.HttpConnectionManager)

// meshScopes takes the mesh listener's routes from the endpoints' scopes
// (scoped RDS), keyed by the request's host without its port: "predict"
// and "predict:15001" both pick the scope of endpoint predict, whose
// route configuration (wire.MeshRouteName) comes by RDS. A host no scope
// has gets Envoy's 404.
func meshScopes() routeSource {
	host := &hcm.ScopedRoutes_ScopeKeyBuilder_FragmentBuilder_HeaderValueExtractor{
		Name:             ":authority",
		ElementSeparator: ":",
		ExtractType:      &hcm.ScopedRoutes_ScopeKeyBuilder_FragmentBuilder_HeaderValueExtractor_Index{Index: 0},
	}
	return func(m *hcm.HttpConnectionManager) {
		m.RouteSpecifier = &hcm.HttpConnectionManager_ScopedRoutes{ScopedRoutes: &hcm.ScopedRoutes{
			Name: wire.MeshRoutes,
			ScopeKeyBuilder: &hcm.ScopedRoutes_ScopeKeyBuilder{Fragments: []*hcm.ScopedRoutes_ScopeKeyBuilder_FragmentBuilder{{
				Type: &hcm.ScopedRoutes_ScopeKeyBuilder_FragmentBuilder_HeaderValueExtractor_{HeaderValueExtractor: host},
			}}},
			RdsConfigSource: adsConfigSource(),
			ConfigSpecifier: &hcm.ScopedRoutes_ScopedRds{ScopedRds: &hcm.ScopedRds{ScopedRdsConfigSource: adsConfigSource()}},
		}}
	}
}

func httpListener(node wire.ProxyNode, tracing *ir.Tracing, name, address string, port uint32, routes routeSource) (*listener.Listener, error) {
	filters, err := filtersFor(outbound, filterInput{mtls: node.MTLS(), public: name == wire.PublicListener, onDemand: node.ClustersOnDemand})
	if err != nil {
		return nil, fmt.Errorf("listener %s: %w", name, err)
	}
	manager := patchManager(node, name, &hcm.HttpConnectionManager{
		StatPrefix: name,
		CodecType:  hcm.HttpConnectionManager_AUTO,
		// Match routes on the normalised path, so "/a/../b" cannot reach an
		// endpoint that "/b" would not.
		NormalizePath:  wrapperspb.Bool(true),
		MergeSlashes:   true,
		UpgradeConfigs: upgrades(),
		HttpFilters:    filters,
		// A request that matches no endpoint is told so: Envoy's own 404
		// has no body.
		LocalReplyConfig: noRouteReply(name),
	})
	limits := edgeLimitsOf(name)
	limits.bound(manager)
	routes(manager)
	if err := traceManager(manager, tracing, node.ID, genAITags()...); err != nil {
		return nil, fmt.Errorf("listener %s: %w", name, err)
	}
	managerConfig, err := anypb.New(manager)
	if err != nil {
		return nil, fmt.Errorf("listener %s: pack http connection manager: %w", name, err)
	}
	return &listener.Listener{
		Name:                          name,
		Address:                       socketAddress(address, port),
		PerConnectionBufferLimitBytes: wrapperspb.UInt32(limits.bufferBytes),
		FilterChains: []*listener.FilterChain{{
			Filters: []*listener.Filter{{
				Name:       "envoy.filters.network.http_connection_manager",
				ConfigType: &listener.Filter_TypedConfig{TypedConfig: managerConfig},
			}},
		}},
	}, nil
}

// noRouteReply is what a listener answers, with its 404, to a request no
// route matches (Envoy's response flag NR): the method, host and path it
// asked for, and nothing of the routes there are.
func noRouteReply(listenerName string) *hcm.LocalReplyConfig {
	what := "no endpoint serves %REQ(:METHOD)% %REQ(:AUTHORITY)%%REQ_WITHOUT_QUERY(:PATH)%"
	if listenerName == wire.MeshListener {
		what += " in the mesh (a request names its endpoint in its Host header)"
	}
	return &hcm.LocalReplyConfig{Mappers: []*hcm.ResponseMapper{{
		Filter: &accesslog.AccessLogFilter{FilterSpecifier: &accesslog.AccessLogFilter_ResponseFlagFilter{
			ResponseFlagFilter: &accesslog.ResponseFlagFilter{Flags: []string{"NR"}}}},
		BodyFormatOverride: &core.SubstitutionFormatString{
			Format: &core.SubstitutionFormatString_TextFormatSource{
				TextFormatSource: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: "servemesh: " + what + "\n"}}},
			Formatters: []*core.TypedExtensionConfig{reqWithoutQuery},
		},
	}}}
}

// reqWithoutQuery is Envoy's formatter of a path without its query
// (REQ_WITHOUT_QUERY), which a format names to use.
var reqWithoutQuery = &core.TypedExtensionConfig{Name: "envoy.formatter.req_without_query",
	TypedConfig: mustAny(&reqwithoutquery.ReqWithoutQuery{})}

// adsConfigSource points a resource at the aggregated xDS stream.
func adsConfigSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

func socketAddress(address string, port uint32) *core.Address {
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Protocol:      core.SocketAddress_TCP,
		Address:       address,
		PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
	}}}
}
