package translate

import (
	"fmt"
	"maps"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsconfig "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	globalrl "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

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
func globalRateLimit(in filterInput, closed bool) (*hcm.HttpFilter, error) {
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
	return &hcm.HttpFilter{Name: name, Disabled: in.offUntilRouted(), ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: config}}, nil
}

// globalRateLimitsOn are the per-route configs of e's global limit and
// token quota, by the filter of each one's failure mode (both may be on
// one): the descriptors the node's rate limit service counts them by.
func globalRateLimitsOn(e ir.Endpoint) map[string]*anypb.Any {
	limits := map[string][]*route.RateLimit{}
	if g := e.GlobalRateLimit; g != nil {
		filter := globalRateLimitFilterFor(g.FailClosed)
		limits[filter] = append(limits[filter], &route.RateLimit{Actions: globalLimitActions(e.Name, g)})
	}
	if q := e.TokenQuota; q != nil {
		filter := globalRateLimitFilterFor(q.FailClosed)
		limits[filter] = append(limits[filter], tokenQuotaLimits(e.Name, q)...)
	}
	out := make(map[string]*anypb.Any, len(limits))
	for filter, l := range limits {
		out[filter] = mustAny(&route.FilterConfig{Config: mustAny(&globalrl.RateLimitPerRoute{RateLimits: l, Domain: wire.RateLimitDomain})})
	}
	return out
}

// globalLimitActions are the descriptor of a global limit: the endpoint,
// then the header's value or the client's address, if the limit counts
// by either (a request without the header is counted as the endpoint's).
func globalLimitActions(endpoint string, g *ir.GlobalRateLimit) []*route.RateLimit_Action {
	actions := []*route.RateLimit_Action{genericKey(wire.RateLimitEndpointKey, endpoint)}
	switch {
	case g.Header != "":
		actions = append(actions, headerKey(g.Header))
	case g.ClientAddress:
		actions = append(actions, &route.RateLimit_Action{ActionSpecifier: &route.RateLimit_Action_RemoteAddress_{
			RemoteAddress: &route.RateLimit_Action_RemoteAddress{}}})
	}
	return actions
}

// tokenQuotaLimits are a token quota's two calls of the node's rate limit
// service: before the request, a check that adds nothing (refused once
// the answered tokens reached the quota), and when the answer ends, the
// charge of its tokens, as the usage reader found them (an answer without
// usage charges nothing: Envoy drops a descriptor whose addend is not a
// number).
func tokenQuotaLimits(endpoint string, q *ir.TokenQuota) []*route.RateLimit {
	actions := func() []*route.RateLimit_Action {
		a := []*route.RateLimit_Action{genericKey(wire.RateLimitTokensKey, endpoint)}
		if q.Header != "" {
			a = append(a, headerKey(q.Header))
		}
		if q.PerModel {
			a = append(a, modelKey())
		}
		return a
	}
	return []*route.RateLimit{
		{Actions: actions(), HitsAddend: &route.RateLimit_HitsAddend{Number: wrapperspb.UInt64(0)}},
		{Actions: actions(), ApplyOnStreamDone: true,
			HitsAddend: &route.RateLimit_HitsAddend{Format: "%DYNAMIC_METADATA(" + wire.UsageMetadata + ":" + chargedKey(q) + ")%"}},
	}
}

// chargedKey is what an answer of a quota is charged: its weighted cost,
// or its total tokens.
func chargedKey(q *ir.TokenQuota) string {
	if q.Weighted() {
		return wire.UsageCostKey
	}
	return wire.UsageTokensKey
}

func genericKey(key, value string) *route.RateLimit_Action {
	return &route.RateLimit_Action{ActionSpecifier: &route.RateLimit_Action_GenericKey_{
		GenericKey: &route.RateLimit_Action_GenericKey{DescriptorKey: key, DescriptorValue: value}}}
}

// modelKey is the request's model (model routing's metadata) as
// wire.RateLimitModelKey; a request without one is counted without it.
func modelKey() *route.RateLimit_Action {
	return &route.RateLimit_Action{ActionSpecifier: &route.RateLimit_Action_Metadata{Metadata: &route.RateLimit_Action_MetaData{
		DescriptorKey: wire.RateLimitModelKey,
		MetadataKey: &metadatav3.MetadataKey{Key: wire.ModelMetadata,
			Path: []*metadatav3.MetadataKey_PathSegment{{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: wire.ModelKey}}}},
		Source:       route.RateLimit_Action_MetaData_DYNAMIC,
		SkipIfAbsent: true,
	}}}
}

// headerKey is the header's value as wire.RateLimitHeaderKey; a request
// without the header is counted without it.
func headerKey(header string) *route.RateLimit_Action {
	return &route.RateLimit_Action{ActionSpecifier: &route.RateLimit_Action_RequestHeaders_{
		RequestHeaders: &route.RateLimit_Action_RequestHeaders{HeaderName: header, DescriptorKey: wire.RateLimitHeaderKey, SkipIfAbsent: true}}}
}

// globalRateLimits is rate_limit.global and rate_limit.tokens: the routes
// of an endpoint with either turn on the filter of each one's failure
// mode with its descriptors, and, for a token quota, the usage reader,
// on every node's public and mesh listeners.
type globalRateLimits struct{}

func (globalRateLimits) name() string { return "rate_limit.global" }
func (globalRateLimits) uses(e ir.Endpoint) bool {
	return e.GlobalRateLimit != nil || e.TokenQuota != nil
}
func (globalRateLimits) forward(e ir.Endpoint, r *route.Route, _ routeSite) {
	if r.TypedPerFilterConfig == nil {
		r.TypedPerFilterConfig = map[string]*anypb.Any{}
	}
	maps.Copy(r.TypedPerFilterConfig, globalRateLimitsOn(e))
}

// globalRateLimitFilterFor is the filter of a failure mode.
func globalRateLimitFilterFor(closed bool) string {
	if closed {
		return globalRateLimitClosedFilter
	}
	return globalRateLimitOpenFilter
}

// rateLimitServiceCluster reaches the node's rate limit service, a gRPC
// server its agent runs on a unix socket in the Envoy's folder. Every
// node has it: Envoy connects only when a route asks.
func rateLimitServiceCluster() *cluster.Cluster {
	return unixSocketCluster(wire.RateLimitCluster, wire.RateLimitSocket)
}
