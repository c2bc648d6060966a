package translate

import (
	"fmt"
	"slices"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// Features are registered, not branched: each is one implementation of
// the interface of the resources it changes, registered once in its
// table, and translation asks the features a backend, an endpoint or a
// node uses at each resource instead of testing each feature where the
// resource is built. HTTP filters have their own table (filters.go), in
// the order they run.
//
//   - backendFeatures change a backend's clusters and how its nodes call
//     it: gRPC (HTTP/2 to replicas and nodes), outlier detection,
//     load-aware picking and prompt affinity.
//   - routeFeatures change an endpoint's forwarding routes: its retries,
//     the criticality its requests are marked with, the hashes of prompt
//     affinity, its rate limit, and the reading of its answers.
//   - managerFeatures change every HTTP connection manager of a node's
//     listeners: its access log, and the log of the answers read.

// backendFeature is one feature's part in translating a backend: what it
// changes of the backend's clusters and of how its nodes call it.
type backendFeature interface {
	name() string
	// uses reports whether backend b uses the feature.
	uses(b ir.Backend) bool
	// cluster changes the backend's cluster, the one its callers use: of
	// its replicas in a plaintext mesh, of its nodes with mTLS.
	cluster(b ir.Backend, c *cluster.Cluster) error
	// inboundCluster changes a node's cluster of its own replicas of the
	// backend (its inbound listener's, with mTLS). It reads b's
	// configuration, not its replicas: a node's inbound cluster is
	// rebuilt when their count there changes, not when they do.
	inboundCluster(b ir.Backend, c *cluster.Cluster) error
	// viaInboundOnly is true when a node running replicas of the backend
	// calls them through its own inbound listener, as other nodes do,
	// rather than through its own view of the backend (replicas on
	// loopback).
	viaInboundOnly() bool
}

// backendFeatures are the registered backend features, in the order they
// apply.
var backendFeatures = []backendFeature{grpcBackend{}, outlierEjection{}, loadAwarePicking{}, promptAffinity{}, externalPicking{}}

// featuresOf are the features b uses, in backendFeatures' order.
func featuresOf(b ir.Backend) []backendFeature {
	var out []backendFeature
	for _, f := range backendFeatures {
		if f.uses(b) {
			out = append(out, f)
		}
	}
	return out
}

// patchCluster applies b's features to its cluster c.
func patchCluster(b ir.Backend, c *cluster.Cluster) error {
	for _, f := range featuresOf(b) {
		if err := f.cluster(b, c); err != nil {
			return fmt.Errorf("backend %s, %s: %w", b.Name, f.name(), err)
		}
	}
	return nil
}

// patchInboundCluster applies b's features to a node's inbound cluster c.
func patchInboundCluster(b ir.Backend, c *cluster.Cluster) error {
	for _, f := range featuresOf(b) {
		if err := f.inboundCluster(b, c); err != nil {
			return fmt.Errorf("backend %s, %s: %w", b.Name, f.name(), err)
		}
	}
	return nil
}

// hasNodeView reports whether a node running replicas of b gets its own
// view of b's cluster.
func hasNodeView(b ir.Backend) bool {
	return !slices.ContainsFunc(featuresOf(b), backendFeature.viaInboundOnly)
}

// backendBase is what a backend feature that changes nothing but its
// clusters leaves as it is.
type backendBase struct{}

func (backendBase) viaInboundOnly() bool { return false }

// grpcBackend is protocol grpc (or http2): every hop speaks HTTP/2, in
// cleartext (h2c) to replicas and over TLS with ALPN h2 to other nodes'
// inbound listeners (upstreamTLS reads the protocol options this sets).
// The outbound chains' grpc_stats filter counts every call's status.
type grpcBackend struct{ backendBase }

func (grpcBackend) name() string           { return "grpc" }
func (grpcBackend) uses(b ir.Backend) bool { return b.HTTP2 }
func (grpcBackend) cluster(_ ir.Backend, c *cluster.Cluster) error {
	c.TypedExtensionProtocolOptions = http2Options()
	return nil
}
func (g grpcBackend) inboundCluster(b ir.Backend, c *cluster.Cluster) error { return g.cluster(b, c) }

// outlierEjection is outlier: a host that keeps failing is ejected for a
// while, by every calling node (a host there is a node, with mTLS) and by
// each node among its own replicas.
type outlierEjection struct{ backendBase }

func (outlierEjection) name() string           { return "outlier" }
func (outlierEjection) uses(b ir.Backend) bool { return b.Outlier != nil }
func (outlierEjection) cluster(b ir.Backend, c *cluster.Cluster) error {
	c.OutlierDetection = outlierDetection(b.Outlier)
	return nil
}
func (o outlierEjection) inboundCluster(b ir.Backend, c *cluster.Cluster) error {
	return o.cluster(b, c)
}

// loadAwarePicking is load_aware: calling nodes weigh the backend's nodes
// by the load reports on their answers (client-side weighted round robin),
// and each node's picker picks the replica (ext_proc on the inbound
// listener, then override_host), so a node calls its own replicas through
// its inbound listener too, where the picker sees every request. The IR
// has it only where there is an inbound listener (ir.Backend.Picked).
type loadAwarePicking struct{}

func (loadAwarePicking) name() string                                   { return "load_aware" }
func (loadAwarePicking) uses(b ir.Backend) bool                         { return b.Picked }
func (loadAwarePicking) cluster(_ ir.Backend, c *cluster.Cluster) error { return loadAwareCluster(c) }
func (loadAwarePicking) inboundCluster(_ ir.Backend, c *cluster.Cluster) error {
	return pickedReplicaCluster(c)
}

// viaInboundOnly: yes. (The picker's cluster is every mTLS node's:
// forNode.)
func (loadAwarePicking) viaInboundOnly() bool { return true }

// promptAffinity is a prompt-aware backend's node choice: calling nodes'
// pickers place each request's affinity key (its prompt's prefix, its
// conversation or its model) on one of the backend's nodes, as many keys
// on each as its share of the replicas (agent/picker/placement), and the
// cluster of nodes takes the node named (override_host) while it is
// healthy; otherwise, or when none is named, Maglev hashes the key, loads
// bounded (no node takes more than promptBalanceFactor percent of the
// average's requests in flight). So a prefix reaches the node whose
// replica holds it; the node's picker then picks that replica
// (loadAwarePicking).
type promptAffinity struct{ backendBase }

func (promptAffinity) name() string                                      { return "prompt_affinity" }
func (promptAffinity) uses(b ir.Backend) bool                            { return b.PromptAffinity }
func (promptAffinity) cluster(_ ir.Backend, c *cluster.Cluster) error    { return boundedHashCluster(c) }
func (promptAffinity) inboundCluster(ir.Backend, *cluster.Cluster) error { return nil }

// routeSite is where a forwarding route is: the listener its requests came
// through, and whether it forwards idempotent methods only.
type routeSite struct {
	from       caller
	idempotent bool
}

// routeFeature is one feature's part in an endpoint's forwarding routes.
type routeFeature interface {
	name() string
	uses(e ir.Endpoint) bool
	// forward changes r, a forwarding route of e at site; its action's
	// retry policy is the route's own (routeRetryPolicy) until every
	// feature has run.
	forward(e ir.Endpoint, r *route.Route, site routeSite)
}

// routeFeatures are the registered route features, in the order they
// apply.
var routeFeatures = []routeFeature{endpointRetries{}, firstByteRetries{}, criticalityMark{}, promptPrefixHash{}, localRateLimits{}, globalRateLimits{}, answerReading{}, tracedRoutes{}, endpointPickers{}}

// patchForwarding applies e's route features to r, then leaves to the
// virtual host a retry policy that is the virtual host's.
func patchForwarding(e ir.Endpoint, r *route.Route, site routeSite) {
	for _, f := range routeFeatures {
		if f.uses(e) {
			f.forward(e, r, site)
		}
	}
	if action := r.GetRoute(); proto.Equal(action.GetRetryPolicy(), sharedRetry) {
		action.RetryPolicy = nil
	}
}

// endpointRetries is retry and per_try_timeout_s: an endpoint's own retry
// conditions and attempts, for idempotent methods (or, non_idempotent,
// every method); a try that runs out is retried for idempotent methods
// (Envoy answers it as a 504 of the gateway).
type endpointRetries struct{}

func (endpointRetries) name() string            { return "retry" }
func (endpointRetries) uses(e ir.Endpoint) bool { return e.Retry != nil || e.PerTryTimeoutS > 0 }
func (endpointRetries) forward(e ir.Endpoint, r *route.Route, site routeSite) {
	policy := r.GetRoute().GetRetryPolicy()
	widenRetries(policy, e.Retry, site.idempotent)
	if e.PerTryTimeoutS > 0 {
		policy.PerTryTimeout = seconds(e.PerTryTimeoutS)
		if site.idempotent {
			policy.RetryOn += ",gateway-error"
		}
	}
}

// firstByteRetries is first_byte_timeout_s, its backends' (see
// ir.Endpoint.FirstByteTimeoutS): each try waits that long at most for its
// answer to start (Envoy's per-try timeout, which it ignores once the
// answer has started downstream), then the request is tried again on
// another host, whatever its method: "reset" covers the try given up, and
// the answer a node's inbound listener makes when its replica resets.
// The retry after a stall goes at once: the tries back off from
// stallBackOff instead of retryBackOff, and there are stallRetries of
// them, which span as long on average as the default ones (about 600 ms)
// for a replica that died before the data plane knew. From 50 ms, a
// stalled request waited up to 50 ms more than the bound for its retry.
type firstByteRetries struct{}

// stallBackOff and stallRetries are firstByteRetries' back-off base and
// tries: each drawn below base * 2^try, at most stallMaxBackOff.
const (
	stallBackOff    = 5 * time.Millisecond
	stallMaxBackOff = 640 * time.Millisecond
	stallRetries    = 8
)

func (firstByteRetries) name() string            { return "first_byte_timeout" }
func (firstByteRetries) uses(e ir.Endpoint) bool { return e.FirstByteTimeoutS > 0 }
func (firstByteRetries) forward(e ir.Endpoint, r *route.Route, _ routeSite) {
	policy := r.GetRoute().GetRetryPolicy()
	if t := policy.GetPerTryTimeout(); t == nil || t.AsDuration() > seconds(e.FirstByteTimeoutS).AsDuration() {
		policy.PerTryTimeout = seconds(e.FirstByteTimeoutS)
	}
	if !slices.Contains(strings.Split(policy.RetryOn, ","), "reset") {
		policy.RetryOn += ",reset"
	}
	policy.RetryBackOff = &route.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(stallBackOff), MaxInterval: durationpb.New(stallMaxBackOff)}
	policy.NumRetries = wrapperspb.UInt32(max(policy.GetNumRetries().GetValue(), stallRetries))
	for _, h := range retriedHeaders[retryOnIdempotent] {
		if !slices.ContainsFunc(policy.RetriableHeaders, func(m *route.HeaderMatcher) bool { return m.GetName() == h }) {
			policy.RetriableHeaders = append(policy.RetriableHeaders, &route.HeaderMatcher{
				Name: h, HeaderMatchSpecifier: &route.HeaderMatcher_PresentMatch{PresentMatch: true}})
		}
	}
}

// criticalityMark is criticality: every request is marked with its
// criticality for the pickers (criticalityHeader says who may say what).
type criticalityMark struct{}

func (criticalityMark) name() string          { return "criticality" }
func (criticalityMark) uses(ir.Endpoint) bool { return true }
func (criticalityMark) forward(e ir.Endpoint, r *route.Route, site routeSite) {
	r.RequestHeadersToAdd = criticalityHeader(e, site.from)
}

// promptPrefixHash turns the caller picker filter on for the routes of
// an endpoint that sends to a prompt-aware backend, and hashes the prefix
// it names to pick the node (promptAffinity).
type promptPrefixHash struct{}

func (promptPrefixHash) name() string            { return "prompt_prefix_hash" }
func (promptPrefixHash) uses(e ir.Endpoint) bool { return e.PromptAffinity }
func (promptPrefixHash) forward(e ir.Endpoint, r *route.Route, _ routeSite) {
	if r.TypedPerFilterConfig == nil {
		r.TypedPerFilterConfig = map[string]*anypb.Any{}
	}
	r.TypedPerFilterConfig[callerPickerFilter] = callerPickerOn(e, nil)
	action := r.GetRoute()
	// A conversation's own header first, when it has one: it then keeps
	// its node whatever its prompt (Terminal: Envoy stops at a hash).
	for _, h := range e.AffinityHeaders {
		action.HashPolicy = append(action.HashPolicy, &route.RouteAction_HashPolicy{Terminal: true,
			PolicySpecifier: &route.RouteAction_HashPolicy_Header_{Header: &route.RouteAction_HashPolicy_Header{HeaderName: h}}})
	}
	action.HashPolicy = append(action.HashPolicy, &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_Header_{
		Header: &route.RouteAction_HashPolicy_Header{HeaderName: wire.PromptAffinityHeader}}})
}

// managerFeature is one feature's part in a node's HTTP connection
// managers (its public, mesh and inbound listeners').
type managerFeature interface {
	name() string
	uses(node wire.ProxyNode) bool
	// manager changes the connection manager of the listener named
	// listener.
	manager(listener string, m *hcm.HttpConnectionManager)
}

// managerFeatures are the registered connection-manager features.
var managerFeatures = []managerFeature{accessLogging{}, answerSignals{}}

// managerFeaturesOf names the connection-manager features node uses: a
// manager built for one node is another's when they use the same.
func managerFeaturesOf(node wire.ProxyNode) string {
	var names []string
	for _, f := range managerFeatures {
		if f.uses(node) {
			names = append(names, f.name())
		}
	}
	return strings.Join(names, ",")
}

// patchManager applies node's connection-manager features to m, the
// manager of its listener named listener.
func patchManager(node wire.ProxyNode, listener string, m *hcm.HttpConnectionManager) *hcm.HttpConnectionManager {
	for _, f := range managerFeatures {
		if f.uses(node) {
			f.manager(listener, m)
		}
	}
	return m
}

// accessLogging is the node's access log (accesslog.go), unless its agent
// turned it off.
type accessLogging struct{}

func (accessLogging) name() string                  { return "access_log" }
func (accessLogging) uses(node wire.ProxyNode) bool { return !node.NoAccessLog }
func (accessLogging) manager(listener string, m *hcm.HttpConnectionManager) {
	m.AccessLog = accessLogs(listener)
}
