package translate

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	mutation "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	previoushosts "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// retryOn retries only failures where the request never reached the replica,
// so retrying is safe for every method.
const retryOn = "connect-failure,refused-stream,reset-before-request"

// retryOnIdempotent also retries a request whose connection was reset after
// it was sent (a replica that died mid-request): safe for idempotent methods.
const retryOnIdempotent = retryOn + ",reset"

// retriedHeaders are, for each retryOn, the headers of an answer a node's
// inbound listener made itself (inboundLocalReplies) that the caller
// retries too: the same failures, one hop further.
var retriedHeaders = map[string][]string{
	retryOn:           {wire.UnreachedHeader},
	retryOnIdempotent: {wire.UnreachedHeader, wire.ResetHeader},
}

// idempotentMethods are retried after a reset.
var idempotentMethods = map[string]bool{"GET": true, "HEAD": true, "OPTIONS": true}

// BuildRoutes builds the public route configurations and scopes and the
// mesh's: one route configuration per endpoint and the scope that selects
// it.
//
// Public: one route configuration, and its scope, per first path segment
// of the routed endpoints (publicroutes.go); each holds a virtual host for
// any Host in which each endpoint matches its path and sub-paths, longest
// route first so "/api/v2" wins over "/api". Mesh: every endpoint,
// headless ones included, by the Host header: the mesh listener's scoped
// routes (wire.MeshRoutes) pick the endpoint's scope by the host (without
// its port), and the scope names the endpoint's own route configuration.
// Either way one endpoint's change is one small resource, a request whose
// method the endpoint does not allow gets 405 with an Allow header, and an
// unknown path or host gets Envoy's 404.
func BuildRoutes(m *ir.DataPlane) ([]*route.RouteConfiguration, []*route.ScopedRouteConfiguration) {
	groups := byRouteKey(routedEndpoints(m), func(e ir.Endpoint) string { return e.Route })
	routes := make([]*route.RouteConfiguration, 0, len(m.Endpoints)+len(groups))
	scopes := make([]*route.ScopedRouteConfiguration, 0, len(m.Endpoints)+len(groups))
	for _, key := range sortedNames(groups) {
		publicRoutes := modelListRoutes(groups[key])
		for _, e := range groups[key] {
			publicRoutes = append(publicRoutes, endpointRoutes(e, pathMatch(e.Route), public)...)
		}
		routes = append(routes, publicRoutesConfig(key, publicRoutes))
		scopes = append(scopes, publicScope(key))
	}
	for _, e := range m.Endpoints {
		rc, scope := meshRoutes(e)
		routes = append(routes, rc)
		scopes = append(scopes, scope)
	}
	sortByName(routes, (*route.RouteConfiguration).GetName)
	sortByName(scopes, (*route.ScopedRouteConfiguration).GetName)
	return routes, scopes
}

// sortByRoute sorts endpoints longest route first, then by route, the order
// the public table matches them in.
func sortByRoute[T any](items []T, routeOf func(T) string) {
	sort.Slice(items, func(i, j int) bool {
		a, b := routeOf(items[i]), routeOf(items[j])
		if len(a) != len(b) {
			return len(a) > len(b)
		}
		return a < b
	})
}

// virtualHost holds routes for any host, with what every endpoint's
// routes share set once rather than on each route (a route table is sent
// whole, and this is 40% of the public one): the header naming the backend
// each request goes to, the headers removed, and the retry policy of
// non-idempotent requests, which a route that needs another sets itself.
func virtualHost(name string, routes []*route.Route) *route.VirtualHost {
	return &route.VirtualHost{
		Name:    name,
		Domains: []string{"*"},
		Routes:  routes,
		// Each backend's requests name it (wire.BackendHeader), for the
		// activator: the router sets the chosen cluster, whose name is
		// the backend's (wire.ClusterName), before it adds the headers.
		RequestHeadersToAdd: backendHeader("%UPSTREAM_CLUSTER%"),
		// And each answer names the backend that gave it, whatever the
		// replica said (none on the mesh's own answers: Envoy drops a
		// header whose value is empty), so a split can be watched from
		// outside.
		ResponseHeadersToAdd: backendHeader("%UPSTREAM_CLUSTER%"),
		// What a node's inbound listener tells its callers stays inside;
		// only a node marks a request as a shadow.
		ResponseHeadersToRemove: []string{wire.UnreachedHeader, wire.ResetHeader, wire.LoadReportHeader, wire.LoadReportBinHeader},
		RequestHeadersToRemove:  []string{wire.ShadowHeader},
		RetryPolicy:             sharedRetryPolicy(),
	}
}

// meshRoutes is an endpoint's mesh route configuration (one virtual host,
// named after the endpoint for its stats, taking any host: its scope chose
// it already) and the scope whose key is the endpoint's name.
func meshRoutes(e ir.Endpoint) (*route.RouteConfiguration, *route.ScopedRouteConfiguration) {
	name := wire.MeshRouteName(e.Name)
	rc := &route.RouteConfiguration{Name: name, VirtualHosts: []*route.VirtualHost{virtualHost(e.Name, endpointRoutes(e, pathMatch("/"), mesh))}}
	scope := &route.ScopedRouteConfiguration{
		Name:                   name,
		RouteConfigurationName: name,
		Key: &route.ScopedRouteConfiguration_Key{Fragments: []*route.ScopedRouteConfiguration_Key_Fragment{{
			Type: &route.ScopedRouteConfiguration_Key_Fragment_StringKey{StringKey: e.Name},
		}}},
	}
	return rc, scope
}

// pathMatch matches a route and its sub-paths ("/a" matches "/a" and "/a/b",
// not "/ab"); "/" matches everything.
func pathMatch(path string) func() *route.RouteMatch {
	return func() *route.RouteMatch {
		if path == "/" {
			return &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}}
		}
		return &route.RouteMatch{PathSpecifier: &route.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: path}}
	}
}

// caller says which listener a route table is for: the public one, where
// anyone connects, or the mesh one, where the node's replicas do.
type caller bool

const (
	public caller = true
	mesh   caller = false
)

// endpointRouter is how an endpoint's requests are routed, registered by
// the endpoint's setting: forward makes the routes of one group of methods
// (named name, retried on retry), answers the routes that answer requests
// the router itself refuses, before the 405 route. An endpoint has one.
type endpointRouter interface {
	forward(e ir.Endpoint, match func() *route.RouteMatch, methods []string, name, retry string, from caller) []*route.Route
	answers(e ir.Endpoint, match func() *route.RouteMatch, methods *route.HeaderMatcher) []*route.Route
}

// routerOf is e's router: by the model its body names (model_routing,
// inference.go), or by its split.
func routerOf(e ir.Endpoint) endpointRouter {
	if e.Models != nil {
		return byModel{}
	}
	return bySplit{}
}

// bySplit routes by the endpoint's match rules first, in order, each to
// its backend; then by its weighted split.
type bySplit struct{}

func (bySplit) forward(e ir.Endpoint, match func() *route.RouteMatch, methods []string, name, retry string, from caller) []*route.Route {
	var routes []*route.Route
	for i, rule := range e.Match {
		if rule.MeshOnly && from == public {
			continue
		}
		m := match()
		m.Headers = []*route.HeaderMatcher{methodMatcher(methods), ruleMatcher(rule)}
		ruled := e
		ruled.Traffic, ruled.Sticky = map[string]float64{rule.Backend: 1}, nil
		routes = append(routes, forwardingRoute(fmt.Sprintf("%s/match-%d", name, i), m, ruled, retry, from))
	}
	m := match()
	m.Headers = []*route.HeaderMatcher{methodMatcher(methods)}
	return append(routes, forwardingRoute(name, m, e, retry, from))
}

func (bySplit) answers(ir.Endpoint, func() *route.RouteMatch, *route.HeaderMatcher) []*route.Route {
	return nil
}

// byModel routes by the model a request's body names (model_routing).
type byModel struct{}

func (byModel) forward(e ir.Endpoint, match func() *route.RouteMatch, methods []string, name, retry string, from caller) []*route.Route {
	return modelRoutes(e, match, methodMatcher(methods), name, retry, from)
}

func (byModel) answers(e ir.Endpoint, match func() *route.RouteMatch, methods *route.HeaderMatcher) []*route.Route {
	return modelAnswers(e, match, methods)
}

// endpointRoutes returns the routes that forward an endpoint's allowed
// methods (idempotent ones first, retried even after a reset; then the
// rest), then the one that answers every other method with 405.
func endpointRoutes(e ir.Endpoint, match func() *route.RouteMatch, from caller) []*route.Route {
	methods := e.Methods
	var idempotent, other []string
	for _, m := range methods {
		if idempotentMethods[m] {
			idempotent = append(idempotent, m)
		} else {
			other = append(other, m)
		}
	}
	router := routerOf(e)
	var routes []*route.Route
	for _, group := range []struct {
		suffix, retry string
		methods       []string
	}{{"", retryOnIdempotent, idempotent}, {"/non-idempotent", retryOn, other}} {
		if len(group.methods) == 0 {
			continue
		}
		name := e.Name
		if len(idempotent) > 0 {
			name += group.suffix
		}
		routes = append(routes, router.forward(e, match, group.methods, name, group.retry, from)...)
	}
	routes = append(routes, router.answers(e, match, methodMatcher(methods))...)
	return append(routes,
		&route.Route{
			Name:  e.Name + "/method-not-allowed",
			Match: match(),
			Action: &route.Route_DirectResponse{DirectResponse: &route.DirectResponseAction{
				Status: 405,
				Body: &core.DataSource{Specifier: &core.DataSource_InlineString{
					InlineString: fmt.Sprintf("method not allowed; endpoint %q accepts %s\n", e.Name, strings.Join(methods, ", ")),
				}},
			}},
			ResponseHeadersToAdd: []*core.HeaderValueOption{{
				Header:       &core.HeaderValue{Key: "allow", Value: strings.Join(methods, ", ")},
				AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
			}},
		})
}

// forwardingRoute forwards the requests m matches by e's traffic policy.
// Every forwarding route of an endpoint counts into its route stats:
// vhost.<vhost>.route.<endpoint>.upstream_rq_*.
func forwardingRoute(name string, m *route.RouteMatch, e ir.Endpoint, retry string, from caller) *route.Route {
	r := &route.Route{Name: name, Match: m, StatPrefix: wire.RouteStatPrefix(e.Name), Action: &route.Route_Route{Route: routeAction(e, retry)}}
	patchForwarding(e, r, routeSite{from: from, idempotent: retry == retryOnIdempotent})
	return r
}

// ruleMatcher matches a request's header, or its cookie, as rule says.
func ruleMatcher(rule ir.Match) *route.HeaderMatcher {
	if rule.Cookie != "" {
		// Cookies share one header ("a=1; canary=true"): match the one
		// cookie's value within it, whole.
		value := regexp.QuoteMeta(rule.Exact)
		switch {
		case rule.Prefix != "":
			value = regexp.QuoteMeta(rule.Prefix) + "[^;]*"
		case rule.Regex != "":
			value = "(?:" + rule.Regex + ")"
		}
		return stringMatcher("cookie", &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_SafeRegex{SafeRegex: &matcher.RegexMatcher{
			Regex: `(?:.*;\s*)?` + regexp.QuoteMeta(rule.Cookie) + "=" + value + `(?:;.*)?`}}})
	}
	var sm *matcher.StringMatcher
	switch {
	case rule.Prefix != "":
		sm = &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Prefix{Prefix: rule.Prefix}}
	case rule.Regex != "":
		sm = &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_SafeRegex{SafeRegex: &matcher.RegexMatcher{Regex: rule.Regex}}}
	default:
		sm = &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: rule.Exact}}
	}
	return stringMatcher(rule.Header, sm)
}

func stringMatcher(header string, sm *matcher.StringMatcher) *route.HeaderMatcher {
	return &route.HeaderMatcher{Name: header, HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: sm}}
}

func methodMatcher(methods []string) *route.HeaderMatcher {
	return &route.HeaderMatcher{
		Name: ":method",
		HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: &matcher.StringMatcher{
			MatchPattern: &matcher.StringMatcher_SafeRegex{SafeRegex: &matcher.RegexMatcher{
				Regex: strings.Join(methods, "|"),
			}},
		}},
	}
}

// previousHosts makes a retry pick a replica other than those already tried:
// a dead replica fails fast, so a least-request balancer would otherwise
// keep choosing it.
var previousHosts = func() *anypb.Any {
	a, err := anypb.New(&previoushosts.PreviousHostsPredicate{})
	if err != nil {
		panic(err) // a static, valid message
	}
	return a
}()

// defaultRetries is how often a request that reached no replica is tried
// again, and retryBackOff the base of Envoy's jittered exponential delays
// between tries (each drawn below base * 2^try, at most 10 * base).
// Between a replica's death and the data plane's knowing it (its agent
// marks it critical at once; Consul, the controller and xDS follow, within
// tens of milliseconds on an idle machine and several hundred under load),
// a backend's only replica fails every try at once: five tries backed off
// from 50 ms span about 600 ms on average, by when the node's activator
// holds the request instead. The e2e test that kills the only replica of a
// backend under load failed 2 of about 10,000 requests with three tries
// from 25 ms, and 5 of 7,000 with five from 25 ms while the rest of the
// tests ran beside it.
const (
	defaultRetries = 5
	retryBackOff   = 50 * time.Millisecond
)

// retryPolicy retries on retryOn, at most defaultRetries times, each time on a host not
// tried yet (a replica, or a node's inbound listener). Finding one may take
// several draws: least-request prefers a dead host (it fails fast, so it
// has no request in flight), and picks it about 5 times in 9 among three
// hosts; with 5 redraws, 1 of 36,633 requests drew the dead host on every
// attempt while it was still listed (e2e, an agent killed under load), so
// 10 are allowed.
func retryPolicy(retryOn string) *route.RetryPolicy {
	return &route.RetryPolicy{
		RetryOn:      retryOn,
		NumRetries:   wrapperspb.UInt32(defaultRetries),
		RetryBackOff: &route.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(retryBackOff)},
		RetryHostPredicate: []*route.RetryPolicy_RetryHostPredicate{{
			Name:       "envoy.retry_host_predicates.previous_hosts",
			ConfigType: &route.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: previousHosts},
		}},
		HostSelectionRetryMaxAttempts: 10,
	}
}

// routeRetryPolicy is a route's retry policy for the failures in retry,
// and the same failures one hop further (the headers a node's inbound
// listener marks its own answers with).
func routeRetryPolicy(retry string) *route.RetryPolicy {
	policy := retryPolicy(retry)
	policy.RetryOn += ",retriable-headers"
	for _, h := range retriedHeaders[retry] {
		policy.RetriableHeaders = append(policy.RetriableHeaders, &route.HeaderMatcher{
			Name: h, HeaderMatchSpecifier: &route.HeaderMatcher_PresentMatch{PresentMatch: true}})
	}
	return policy
}

// sharedRetryPolicy is the retry policy of a non-idempotent request to an
// endpoint with no retry or timeout settings: the virtual host's, which
// such routes leave unset.
func sharedRetryPolicy() *route.RetryPolicy { return routeRetryPolicy(retryOn) }

// sharedRetry is sharedRetryPolicy, to compare routes' policies with; it
// is never part of a resource.
var sharedRetry = sharedRetryPolicy()

// widenRetries adds an endpoint's retry conditions to policy, for
// idempotent methods or, if the endpoint says so, every method; and its
// number of retries.
func widenRetries(policy *route.RetryPolicy, r *ir.Retry, idempotent bool) {
	if r == nil {
		return
	}
	if r.Attempts > 0 {
		policy.NumRetries = wrapperspb.UInt32(uint32(r.Attempts))
	}
	if !idempotent && !r.NonIdempotent {
		return
	}
	for _, on := range r.On {
		if on == "503" {
			policy.RetriableStatusCodes = append(policy.RetriableStatusCodes, 503)
			on = "retriable-status-codes"
		}
		if !slices.Contains(strings.Split(policy.RetryOn, ","), on) {
			policy.RetryOn += "," + on
		}
	}
}

// hashPolicy hashes the sticky key: a header, or a cookie (which Envoy only
// reads, never sets: without it a request is split at random).
func hashPolicy(k ir.Sticky) *route.RouteAction_HashPolicy {
	if k.Cookie != "" {
		return &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_Cookie_{Cookie: &route.RouteAction_HashPolicy_Cookie{Name: k.Cookie}}}
	}
	return &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_Header_{Header: &route.RouteAction_HashPolicy_Header{HeaderName: k.Header}}}
}

// seconds is a protobuf duration of s seconds (0: none).
func seconds(s float64) *durationpb.Duration {
	return durationpb.New(time.Duration(s * float64(time.Second)))
}

// routeAction sends an endpoint's requests to its backends by weight and
// mirrors the shadowed proportions.
func routeAction(e ir.Endpoint, retry string) *route.RouteAction {
	// No timeout unless the endpoint sets one (Envoy's default is 15 s).
	// The route's own retry policy, which its features widen
	// (patchForwarding).
	action := &route.RouteAction{RetryPolicy: routeRetryPolicy(retry), Timeout: seconds(e.TimeoutS)}
	if e.IdleTimeoutS > 0 {
		action.IdleTimeout = seconds(e.IdleTimeoutS)
	}
	weights := splitWeights(e.Traffic)
	if len(weights) == 1 {
		action.ClusterSpecifier = &route.RouteAction_Cluster{Cluster: wire.ClusterName(weights[0].Backend)}
	} else {
		split := &route.WeightedCluster{}
		for _, w := range weights {
			split.Clusters = append(split.Clusters, &route.WeightedCluster_ClusterWeight{
				Name:   wire.ClusterName(w.Backend),
				Weight: wrapperspb.UInt32(w.Weight),
			})
		}
		if k := e.Sticky; k != nil {
			// The key's hash picks the backend: the same key, the same
			// backend, on every node; a weight change moves only the keys
			// whose share moved.
			split.RandomValueSpecifier = &route.WeightedCluster_UseHashPolicy{UseHashPolicy: wrapperspb.Bool(true)}
			action.HashPolicy = []*route.RouteAction_HashPolicy{hashPolicy(*k)}
		}
		action.ClusterSpecifier = &route.RouteAction_WeightedClusters{WeightedClusters: split}
	}
	for _, backend := range slices.Sorted(maps.Keys(e.Shadows)) {
		proportion := e.Shadows[backend]
		if proportion <= 0 {
			continue // a proportion of 0 means no shadow, as in Ray Serve
		}
		// The runtime fraction must be explicit: a mirror policy without
		// one mirrors every request.
		action.RequestMirrorPolicies = append(action.RequestMirrorPolicies, &route.RouteAction_RequestMirrorPolicy{
			Cluster: wire.ClusterName(backend),
			RuntimeFraction: &core.RuntimeFractionalPercent{
				DefaultValue: &typev3.FractionalPercent{
					Numerator:   fractionPPM(proportion),
					Denominator: typev3.FractionalPercent_MILLION,
				},
				RuntimeKey: wire.ShadowRuntimeKey(e.Name, backend),
			},
			RequestHeadersMutations: []*mutation.HeaderMutation{
				{Action: &mutation.HeaderMutation_Append{Append: &core.HeaderValueOption{
					Header:       &core.HeaderValue{Key: wire.ShadowHeader, Value: e.Name},
					AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
				}}},
				{Action: &mutation.HeaderMutation_Append{Append: backendHeader(backend)[0]}},
			},
		})
	}
	return action
}
