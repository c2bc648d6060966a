package translate

import (
	"fmt"

	grpcstats "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/grpc_stats/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// chain is a kind of HTTP connection manager servemesh configures.
type chain int

const (
	// outbound: a node's public and mesh listeners, which send requests
	// to backends.
	outbound chain = iota
	// inbound: a node's inbound listener's chain for one backend it runs
	// (mTLS), which sends requests to that backend's replicas here.
	inbound
)

// filterInput is what a chain's filters are decided from: the chain, and
// the backend of an inbound chain (outbound chains' filters are the same
// for every endpoint, and are switched on per route).
type filterInput struct {
	chain   chain
	backend ir.Backend
	// mtls: the node runs mesh mTLS (its agent runs a picker).
	mtls bool
	// public: the outbound chain is the public listener's.
	public bool
	// onDemand: the node's clusters come on demand (ondemand.go).
	onDemand bool
}

// offUntilRouted is the Disabled of a filter that a route turns on. Envoy
// makes a request's filters on the route first matched: on the mesh
// listener that is its route, so such filters are off but on their
// routes; on the public one a request can be matched again in the root's
// scope after its filters are made (publicroutes.go), so there they are
// on, and idle on a route without their config: each such filter's own
// config does nothing.
func (in filterInput) offUntilRouted() bool { return !in.public }

// httpFilter is one row of the filter table: an Envoy HTTP filter (by the
// name it has in the chain), the chains it is on, why it sits where it does, and how it is built (nil
// and no error: not on this chain for this input).
type httpFilter struct {
	name  string
	on    []chain
	why   string
	build func(filterInput) (*hcm.HttpFilter, error)
}

// httpFilters is the one ordered table of every HTTP filter servemesh
// puts on a listener, first to last. A feature that filters requests adds
// its row here, at the position its reason gives; filtersFor builds a
// chain's filters from it, in this order.
var httpFilters = []httpFilter{
	{name: routeFallbackFilter, on: []chain{outbound},
		why: "first on the public listener, before any filter acts on the route: a request no route of its first segment's scope " +
			"matched is matched again in the root's (off on every public virtual host, so it runs only while no route matched; publicroutes.go)",
		build: routeFallback},
	{name: "envoy.filters.http.grpc_stats", on: []chain{outbound},
		why: "first, so that it sees every gRPC call's status, whatever a later filter answers: " +
			"cluster.<backend>.grpc.failure counts the calls that fail with an HTTP 200 (the router then leaves them to it)",
		build: func(filterInput) (*hcm.HttpFilter, error) { return grpcStatsFilter() }},
	{name: localRateLimitFilter, on: []chain{outbound},
		why: "before the body is read: a request over its endpoint's rate limit is refused on its headers, " +
			"on the route Envoy first matches (a model-routed endpoint's first route carries the limit too; off but on rate-limited endpoints' routes)",
		build: localRateLimit},
	{name: jsonToMetadataFilter, on: []chain{outbound},
		why: "before the route is matched again: it reads the model a JSON body names into metadata " +
			"(off but on model-routed endpoints' routes, which buffer the body)",
		build: readModelFilter},
	{name: luaFilter, on: []chain{outbound},
		why:   "right after the model is read: it clears the route cache, so the route is matched again by the model's metadata",
		build: rematchFilter},
	{name: globalRateLimitOpenFilter, on: []chain{outbound},
		why: "after the model is read and the route matched again: Envoy's global rate limit asks nothing on a route that sends " +
			"nowhere, as a model-routed endpoint's first route; the node's rate limit service counts the request with every node's, " +
			"and charges a token quota when the answer ends (off but on the routes of endpoints with a global limit or token quota that fails open)",
		build: func(in filterInput) (*hcm.HttpFilter, error) { return globalRateLimit(in, false) }},
	{name: globalRateLimitClosedFilter, on: []chain{outbound},
		why:   "next to the one that fails open: the same for endpoints whose global limit fails closed",
		build: func(in filterInput) (*hcm.HttpFilter, error) { return globalRateLimit(in, true) }},
	{name: callerPickerFilter, on: []chain{outbound},
		why: "after the model is read and the route matched again (its model route's settings then apply), before the router: " +
			"the node's picker reads the body, names the prompt's prefix, which the route hashes, and the node it is placed on, " +
			"and rewrites the model where the model's route says (off but on routes to prompt-aware backends and models with a rewrite)",
		build: func(in filterInput) (*hcm.HttpFilter, error) {
			if !in.mtls {
				return nil, nil // no picker: no prompt-aware backend either
			}
			return callerPicker(in)
		}},
	{name: usageReaderFilter, on: []chain{outbound},
		why: "after the route is matched again, so a model route's settings apply: on the way back it reads each answer's tokens " +
			"(usage.total_tokens) for the global rate limit filter to charge to its token quota when the answer ends " +
			"(off but on routes of endpoints with a token quota)",
		build: usageReader},
	{name: onDemandFilter, on: []chain{outbound},
		why: "last before the router, once every filter that may choose the route again has run: on a node whose clusters " +
			"come on demand, a request whose route sends to a cluster the node does not hold waits while Envoy asks for it",
		build: onDemandClusters},
	{name: wire.EndpointSubsetFilter, on: []chain{outbound},
		why: "after the cluster is here (on demand) and every filter that may choose the route has run: it puts the ready replicas " +
			"of the backend the route chose (in a split, the backend drawn) in the Endpoint Picker Protocol's subset hint " +
			"(off but on routes to backends with an external picker)",
		build: endpointSubset},
	{name: endpointPickerFilter, on: []chain{outbound},
		why: "next: it asks the backend's external picker which replica takes the request, with the subset hint, " +
			"and tells it, on the way back, which served (off but on routes to backends with an external picker)",
		build: endpointPicker},
	{name: wire.EndpointRouteFilter, on: []chain{outbound},
		why: "after the picker, before the router: it keeps of the picker's list the backend's replicas on the first one's node, " +
			"names that node for the cluster and the replicas for its inbound listener; on the way back, before the picker sees " +
			"the answer, it moves the served replica the inbound listener named into the picker's metadata",
		build: endpointRoute},
	{name: "envoy.filters.http.ext_proc", on: []chain{inbound},
		why: "first on the inbound hop of a load-aware backend: the node's picker chooses the replica (override_host) " +
			"before the router sends it, and adds the node's load report to the answer",
		build: func(in filterInput) (*hcm.HttpFilter, error) {
			if !loadAware(in.backend) {
				return nil, nil
			}
			return pickerFilter(in.backend)
		}},
	{name: "servemesh.replica_report_scrub", on: []chain{inbound}, // a header_mutation filter
		why: "after the picker, so on the way back (filters see the answer in reverse) it strips the replica's own load reports " +
			"before the picker adds the node's: a replica cannot forge what callers weigh nodes by",
		build: func(filterInput) (*hcm.HttpFilter, error) { return replicaReportScrub() }},
	{name: "envoy.filters.http.router", on: []chain{outbound, inbound},
		why:   "last: it sends the request",
		build: routerFilter},
}

// filtersFor builds c's HTTP filters for in, in the table's order.
func filtersFor(c chain, in filterInput) ([]*hcm.HttpFilter, error) {
	in.chain = c
	var out []*hcm.HttpFilter
	for _, f := range httpFilters {
		if !onChain(f, c) {
			continue
		}
		built, err := f.build(in)
		if err != nil {
			return nil, fmt.Errorf("http filter %s: %w", f.name, err)
		}
		if built != nil {
			if built.GetName() != f.name {
				return nil, fmt.Errorf("http filter %s: built as %s; the table names it otherwise", f.name, built.GetName())
			}
			out = append(out, built)
		}
	}
	return out, nil
}

func onChain(f httpFilter, c chain) bool {
	for _, on := range f.on {
		if on == c {
			return true
		}
	}
	return false
}

// grpcStatsFilter counts gRPC calls by status, without per-method stats.
func grpcStatsFilter() (*hcm.HttpFilter, error) {
	cfg, err := anypb.New(&grpcstats.FilterConfig{
		PerMethodStatSpecifier: &grpcstats.FilterConfig_StatsForAllMethods{StatsForAllMethods: wrapperspb.Bool(false)},
	})
	if err != nil {
		return nil, fmt.Errorf("pack grpc_stats filter: %w", err)
	}
	return &hcm.HttpFilter{Name: "envoy.filters.http.grpc_stats", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: cfg}}, nil
}

// routerFilter sends the request. On an outbound chain it leaves a gRPC
// call's own failures (a reset, a timeout) to grpc_stats rather than
// charging a 5xx too, so no call is counted twice.
func routerFilter(in filterInput) (*hcm.HttpFilter, error) {
	cfg := &router.Router{SuppressGrpcRequestFailureCodeStats: in.chain == outbound}
	packed, err := anypb.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("pack router filter: %w", err)
	}
	return &hcm.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: packed}}, nil
}
