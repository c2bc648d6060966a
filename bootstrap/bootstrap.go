package bootstrap

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/servemesh/servemesh/internal/protoyaml"
	"github.com/servemesh/servemesh/wire"
)

// XDSMaxBackoff caps how long a node waits between attempts to reconnect to
// the control plane.
const XDSMaxBackoff = 5 * time.Second

// StatsFlushInterval is how often Envoy merges its workers' histograms
// into what its admin API answers.
const StatsFlushInterval = time.Second

// latencyBuckets gives every cluster's request-time histogram the buckets
// of wire.LatencyBoundsMs.
func latencyBuckets() *metricsv3.StatsConfig {
	return &metricsv3.StatsConfig{HistogramBucketSettings: []*metricsv3.HistogramBucketSettings{{
		Match:   &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Suffix{Suffix: "." + wire.StatLatency}},
		Buckets: wire.LatencyBoundsMs,
	}}}
}

// ServiceCluster is the Envoy service cluster every servemesh node reports.
const ServiceCluster = "servemesh"

// Protocol is the xDS transport variant a node uses.
type Protocol string

// The xDS transport variants. Delta is the default: a change sends the
// resources it changed, where state of the world sends every resource of
// each type it touched (every route configuration at a traffic shift).
const (
	ProtocolSotW  Protocol = "sotw"
	ProtocolDelta Protocol = "delta"
)

// Options describe one node's Envoy.
type Options struct {
	// Node is the node's identity and listener settings.
	Node wire.ProxyNode
	// XDSAddress is the control plane's gRPC host:port (IP or DNS name), or
	// several, comma-separated: Envoy connects to one and fails over to
	// another when it goes away.
	XDSAddress string
	// AdminSocket is the path of the Unix socket Envoy's admin API listens
	// on, created with mode 0600; its folder should be 0700 (envoy.Launcher
	// makes it so). The admin API is unauthenticated and controls Envoy
	// (quitquitquit, log levels, config dumps), so it is never on a TCP
	// port a replica could reach.
	AdminSocket string
	// Protocol picks delta or state-of-the-world xDS; empty means delta.
	Protocol Protocol
	// XDSTLS, if set, makes the node reach the control plane over TLS with
	// its client certificate, verifying the controller's identity.
	XDSTLS *XDSTLS
	// Limits bound the connections and memory clients can take; zero
	// values are the defaults.
	Limits Limits
}

// XDSTLS is where a node's xDS identity is: the folder of its file-based
// SDS configs (wire.SecretFile), holding its Consul Connect leaf
// (wire.NodeSecret) and the CA roots that verify the controller
// (wire.RootsSecret). Its agent replaces them when Consul renews or
// re-signs them, and Envoy reloads them without a restart.
type XDSTLS struct {
	Secrets string
	// ServerSAN is the controller's SPIFFE id, exactly: its trust domain and
	// datacenter are the node's
	// ("spiffe://<trust domain>/ns/default/dc/<dc>/svc/servemesh-controller").
	ServerSAN string
}

// MaxAdminSocketPath is the longest Unix socket path Linux binds.
const MaxAdminSocketPath = 107

// CheckAdminSocket says why path cannot be the admin API's socket.
func CheckAdminSocket(path string) error {
	switch {
	case path == "":
		return fmt.Errorf("bootstrap: the admin socket path is empty; give the path of a Unix socket in a folder only the node's user reads")
	case len(path) > MaxAdminSocketPath:
		return fmt.Errorf("bootstrap: the admin socket path %q is %d bytes, over the %d a Unix socket allows; choose a shorter work folder", path, len(path), MaxAdminSocketPath)
	}
	return nil
}

// Build returns the node's bootstrap, validated by Envoy's proto rules.
func Build(o Options) (*bootstrapv3.Bootstrap, error) {
	if err := o.Node.Validate(); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	if err := CheckAdminSocket(o.AdminSocket); err != nil {
		return nil, err
	}
	if err := o.Limits.Check(); err != nil {
		return nil, err
	}
	overload, err := overloadManager(o.Limits)
	if err != nil {
		return nil, err
	}
	apiType := core.ApiConfigSource_DELTA_GRPC
	switch o.Protocol {
	case "", ProtocolDelta:
	case ProtocolSotW:
		if o.Node.ClustersOnDemand {
			return nil, fmt.Errorf("bootstrap: clusters on demand need delta xDS (Envoy asks for a cluster by name only on a delta stream); use xds protocol %q, or hold every cluster", ProtocolDelta)
		}
		apiType = core.ApiConfigSource_GRPC
	default:
		return nil, fmt.Errorf("bootstrap: xds protocol %q is unknown; use %q or %q", o.Protocol, ProtocolSotW, ProtocolDelta)
	}
	metadata, err := o.Node.Metadata()
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	xdsCluster, err := controlPlaneCluster(o.XDSAddress)
	if err != nil {
		return nil, err
	}
	if o.XDSTLS != nil {
		if xdsCluster.TransportSocket, err = xdsTransportSocket(*o.XDSTLS); err != nil {
			return nil, err
		}
	}
	ads := &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
	b := &bootstrapv3.Bootstrap{
		Node: &core.Node{Id: o.Node.ID, Cluster: ServiceCluster, Metadata: metadata},
		Admin: &bootstrapv3.Admin{Address: &core.Address{Address: &core.Address_Pipe{
			Pipe: &core.Pipe{Path: o.AdminSocket, Mode: 0o600},
		}}},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			AdsConfig: &core.ApiConfigSource{
				ApiType:             apiType,
				TransportApiVersion: core.ApiVersion_V3,
				GrpcServices: []*core.GrpcService{{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &core.GrpcService_EnvoyGrpc{
						ClusterName: wire.ControlPlaneCluster,
						// Envoy's default reconnect backoff grows to 30s; a node
						// whose control plane restarts should be back within
						// seconds.
						RetryPolicy: &core.RetryPolicy{RetryBackOff: &core.BackoffStrategy{
							BaseInterval: durationpb.New(250 * time.Millisecond),
							MaxInterval:  durationpb.New(XDSMaxBackoff),
						}},
					},
				}}},
				SetNodeOnFirstMessageOnly: true,
			},
			LdsConfig: ads,
			CdsConfig: ads,
		},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Clusters: []*cluster.Cluster{xdsCluster}},
		// The static layer holds the listeners' connection limits; an
		// admin layer lets operators override a shadow's fraction (runtime
		// key servemesh.shadow.<endpoint>.<backend>) on one node.
		LayeredRuntime: &bootstrapv3.LayeredRuntime{Layers: []*bootstrapv3.RuntimeLayer{
			{Name: "static", LayerSpecifier: &bootstrapv3.RuntimeLayer_StaticLayer{StaticLayer: runtimeLimits(o.Limits)}},
			{Name: "admin", LayerSpecifier: &bootstrapv3.RuntimeLayer_AdminLayer_{AdminLayer: &bootstrapv3.RuntimeLayer_AdminLayer{}}},
		}},
		// Histograms reach /stats only when Envoy flushes them (5 s by
		// default): a rollout's latency check reads them every second.
		StatsFlushInterval: durationpb.New(StatsFlushInterval),
		StatsConfig:        latencyBuckets(),
		OverloadManager:    overload,
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("bootstrap: generated config fails Envoy's validation: %w", err)
	}
	return b, nil
}

// YAML renders the node's bootstrap as the YAML Envoy reads with -c, after
// checking that it unmarshals back into the Bootstrap proto unchanged.
func YAML(o Options) ([]byte, error) {
	b, err := Build(o)
	if err != nil {
		return nil, err
	}
	out, err := protoyaml.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	var back bootstrapv3.Bootstrap
	if err := protoyaml.Unmarshal(out, &back); err != nil {
		return nil, fmt.Errorf("bootstrap: rendered YAML does not read back: %w", err)
	}
	return out, nil
}

// xdsTransportSocket is TLS to the control plane with the node's client
// certificate, checking the controller's SPIFFE id.
func xdsTransportSocket(t XDSTLS) (*core.TransportSocket, error) {
	if !strings.HasPrefix(t.Secrets, "/") {
		return nil, fmt.Errorf("bootstrap: xds TLS: secrets folder %q is not an absolute path", t.Secrets)
	}
	ctx, err := anypb.New(&tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		AlpnProtocols:                  []string{"h2"},
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{wire.FileSecret(t.Secrets, wire.NodeSecret)},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext: &tlsv3.CertificateValidationContext{
				MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{SanType: tlsv3.SubjectAltNameMatcher_URI,
					Matcher: &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: t.ServerSAN}}}},
			},
			ValidationContextSdsSecretConfig: wire.FileSecret(t.Secrets, wire.RootsSecret),
		}},
	}})
	if err != nil {
		return nil, fmt.Errorf("bootstrap: xds TLS: %w", err)
	}
	return &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: ctx}}, nil
}

func controlPlaneCluster(addresses string) (*cluster.Cluster, error) {
	discovery := cluster.Cluster_STATIC
	var endpoints []*endpoint.LbEndpoint
	for _, addr := range strings.Split(addresses, ",") {
		host, port, err := splitHostPort("xds address", strings.TrimSpace(addr))
		if err != nil {
			return nil, err
		}
		if _, err := netip.ParseAddr(host); err != nil {
			discovery = cluster.Cluster_STRICT_DNS
		}
		endpoints = append(endpoints, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: &core.Address{
				Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Address: host, PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
				}},
			}}},
		})
	}
	http2, err := anypb.New(&httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &core.Http2ProtocolOptions{}},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("bootstrap: pack http2 options: %w", err)
	}
	return &cluster.Cluster{
		Name:                          wire.ControlPlaneCluster,
		ClusterDiscoveryType:          &cluster.Cluster_Type{Type: discovery},
		ConnectTimeout:                durationpb.New(time.Second),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": http2},
		LoadAssignment: &endpoint.ClusterLoadAssignment{
			ClusterName: wire.ControlPlaneCluster,
			Endpoints:   []*endpoint.LocalityLbEndpoints{{LbEndpoints: endpoints}},
		},
	}, nil
}
