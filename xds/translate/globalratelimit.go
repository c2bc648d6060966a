package translate

import (
	"fmt"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	rlsconfig "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	globalrl "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// The outbound listeners' global rate limit filters: one that lets
// requests through while the node's rate limit service cannot answer and
// one that refuses them (Envoy's failure mode is the filter's, not a
// route's), both off but on the routes of endpoints with a global limit,
// which turn on the one of their failure mode with their descriptors
// (globalRateLimitOn).
const (
	globalRateLimitOpenFilter   = "servemesh.global_rate_limit_open"
	globalRateLimitClosedFilter = "servemesh.global_rate_limit_closed"
)

// RateLimitTimeout bounds a request's wait for the node's rate limit
// service; past it, the failure mode holds. The service is on the node,
// answering from a store every node shares in a millisecond or two, and
// with an error within its own Redis timeout (200 ms) while the store is
// down; this is for a service that hangs.
const RateLimitTimeout = 500 * time.Millisecond

// globalRateLimit is one of the two filters on a listener, no
// descriptors of its own: closed refuses requests with a 503 while the
// node's rate limit service cannot answer.
func globalRateLimit(closed bool) (*hcm.HttpFilter, error) {
	name, prefix := globalRateLimitOpenFilter, "servemesh_open"
	if closed {
		name, prefix = globalRateLimitClosedFilter, "servemesh_closed"
	}
	config, err := anypb.New(&globalrl.RateLimit{
		Domain:          wire.RateLimitDomain,
		Timeout:         durationpb.New(RateLimitTimeout),
		FailureModeDeny: closed,
		StatusOnError:   &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
		RateLimitService: &rlsconfig.RateLimitServiceConfig{
			GrpcService:         &core.GrpcService{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: wire.RateLimitCluster}}},
			TransportApiVersion: core.ApiVersion_V3,
		},
		EnableXRatelimitHeaders: globalrl.RateLimit_DRAFT_VERSION_03,
		EnableRetryAfterHeader:  true,
		StatPrefix:              prefix,
	})
	if err != nil {
		return nil, fmt.Errorf("pack global rate limit filter: %w", err)
	}
	return &hcm.HttpFilter{Name: name, Disabled: true, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: config}}, nil
}

// globalRateLimitOn is the per-route config of e's global limit: the
// descriptor the node's rate limit service counts it by (the endpoint,
// then the header's value or the client's address, if the limit counts
// by either; a request without the header is counted as the endpoint's).
func globalRateLimitOn(e ir.Endpoint) *anypb.Any {
	g := e.GlobalRateLimit
	actions := []*route.RateLimit_Action{{ActionSpecifier: &route.RateLimit_Action_GenericKey_{
		GenericKey: &route.RateLimit_Action_GenericKey{DescriptorKey: wire.RateLimitEndpointKey, DescriptorValue: e.Name}}}}
	switch {
	case g.Header != "":
		actions = append(actions, &route.RateLimit_Action{ActionSpecifier: &route.RateLimit_Action_RequestHeaders_{
			RequestHeaders: &route.RateLimit_Action_RequestHeaders{HeaderName: g.Header, DescriptorKey: wire.RateLimitHeaderKey, SkipIfAbsent: true}}})
	case g.ClientAddress:
		actions = append(actions, &route.RateLimit_Action{ActionSpecifier: &route.RateLimit_Action_RemoteAddress_{
			RemoteAddress: &route.RateLimit_Action_RemoteAddress{}}})
	}
	return mustAny(&route.FilterConfig{Config: mustAny(&globalrl.RateLimitPerRoute{
		RateLimits: []*route.RateLimit{{Actions: actions}}, Domain: wire.RateLimitDomain})})
}

// globalRateLimits is rate_limit.global: the routes of an endpoint with a
// global limit turn on the filter of its failure mode with its
// descriptor, on every node's public and mesh listeners.
type globalRateLimits struct{}

func (globalRateLimits) name() string            { return "rate_limit.global" }
func (globalRateLimits) uses(e ir.Endpoint) bool { return e.GlobalRateLimit != nil }
func (globalRateLimits) forward(e ir.Endpoint, r *route.Route, _ routeSite) {
	if r.TypedPerFilterConfig == nil {
		r.TypedPerFilterConfig = map[string]*anypb.Any{}
	}
	r.TypedPerFilterConfig[globalRateLimitFilterOf(e)] = globalRateLimitOn(e)
}

// globalRateLimitFilterOf is the filter of e's failure mode.
func globalRateLimitFilterOf(e ir.Endpoint) string {
	if e.GlobalRateLimit.FailClosed {
		return globalRateLimitClosedFilter
	}
	return globalRateLimitOpenFilter
}

// rateLimitServiceCluster reaches the node's rate limit service, a gRPC
// server its agent runs on a unix socket in the Envoy's folder. Every
// node has it: Envoy connects only when a route asks.
func rateLimitServiceCluster() *cluster.Cluster {
	return &cluster.Cluster{
		Name:                 wire.RateLimitCluster,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(ConnectTimeout),
		LoadAssignment: &endpoint.ClusterLoadAssignment{ClusterName: wire.RateLimitCluster, Endpoints: []*endpoint.LocalityLbEndpoints{{
			LbEndpoints: []*endpoint.LbEndpoint{{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_Pipe{Pipe: &core.Pipe{Path: wire.RateLimitSocket}}},
			}}}},
		}}},
		TypedExtensionProtocolOptions: http2Options(),
	}
}
