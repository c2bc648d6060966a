package translate

import (
	"fmt"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimit "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	localrl "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// localRateLimitFilter names the outbound listeners' local rate limit
// filter: off but on the routes of endpoints with a rate limit, whose
// route carries the endpoint's bucket (localRateLimitOn).
const localRateLimitFilter = "envoy.filters.http.local_ratelimit"

// rateLimitKey is the descriptor key of a rate limit's header.
const rateLimitKey = "servemesh_rate_limit_key"

// localRateLimit is the filter on a listener: no bucket of its own, so
// idle but on a route with one (filter_enabled unset: none of the
// requests).
func localRateLimit(in filterInput) (*hcm.HttpFilter, error) {
	config, err := anypb.New(&localrl.LocalRateLimit{StatPrefix: "servemesh_rate_limit"})
	if err != nil {
		return nil, fmt.Errorf("pack local rate limit filter: %w", err)
	}
	return &hcm.HttpFilter{Name: localRateLimitFilter, Disabled: in.offUntilRouted(), ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: config}}, nil
}

// localRateLimitOn turns the filter on for a route of e with e's bucket
// (stats under wire.RateLimitStatPrefix): one for the endpoint, or, with
// a header, one per value (up to wire.MaxRateLimitKeys a node) and
// one for the requests without it. An answer over the limit is a 429
// with Retry-After and the x-ratelimit-* headers.
func localRateLimitOn(e ir.Endpoint) *anypb.Any {
	l := e.RateLimit
	bucket := &typev3.TokenBucket{MaxTokens: uint32(l.Burst), TokensPerFill: wrapperspb.UInt32(uint32(l.RequestsPerSecond)),
		FillInterval: durationpb.New(time.Second)}
	on := &core.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{Numerator: 100, Denominator: typev3.FractionalPercent_HUNDRED}}
	config := &localrl.LocalRateLimit{
		StatPrefix:              wire.RateLimitStatPrefix(e.Name),
		Status:                  &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
		TokenBucket:             bucket,
		FilterEnabled:           on,
		FilterEnforced:          on,
		EnableXRatelimitHeaders: ratelimit.XRateLimitHeadersRFCVersion_DRAFT_VERSION_03,
		EnableRetryAfterHeader:  true,
	}
	if l.Header != "" {
		config.RateLimits = []*route.RateLimit{{Actions: []*route.RateLimit_Action{{ActionSpecifier: &route.RateLimit_Action_RequestHeaders_{
			RequestHeaders: &route.RateLimit_Action_RequestHeaders{HeaderName: l.Header, DescriptorKey: rateLimitKey}}}}}}
		// A value left out: each value its own bucket (dynamic descriptors).
		config.Descriptors = []*ratelimit.LocalRateLimitDescriptor{{Entries: []*ratelimit.RateLimitDescriptor_Entry{{Key: rateLimitKey}}, TokenBucket: bucket}}
		config.MaxDynamicDescriptors = wrapperspb.UInt32(wire.MaxRateLimitKeys)
		config.AlwaysConsumeDefaultTokenBucket = wrapperspb.Bool(false)
	}
	return mustAny(&route.FilterConfig{Config: mustAny(config)})
}

// localRateLimits is rate_limit.local: the routes of an endpoint with a
// rate limit turn the filter on with its bucket, on every node's public
// and mesh listeners.
type localRateLimits struct{}

func (localRateLimits) name() string            { return "rate_limit" }
func (localRateLimits) uses(e ir.Endpoint) bool { return e.RateLimit != nil }
func (localRateLimits) forward(e ir.Endpoint, r *route.Route, _ routeSite) {
	if r.TypedPerFilterConfig == nil {
		r.TypedPerFilterConfig = map[string]*anypb.Any{}
	}
	r.TypedPerFilterConfig[localRateLimitFilter] = localRateLimitOn(e)
}
