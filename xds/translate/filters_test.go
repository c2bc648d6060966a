package translate

import (
	"slices"
	"testing"

	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// TestFilterTable: every row of the filter table is on a chain and says
// why it sits there; the router ends every chain; and each chain's filters
// come in the table's order (goldens pin their configuration).
func TestFilterTable(t *testing.T) {
	for _, f := range httpFilters {
		if len(f.on) == 0 || len(f.why) < 20 || f.build == nil {
			t.Errorf("filter %s: every row needs its chains, its reason and its builder", f.name)
		}
	}
	names := func(c chain, in filterInput) []string {
		t.Helper()
		built, err := filtersFor(c, in)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range built {
			out = append(out, f.GetName())
		}
		return out
	}
	aware := ir.Backend{Name: "llm", Reach: ir.ReachInbound, Picked: true}
	for _, c := range []struct {
		chain chain
		in    filterInput
		want  []string
	}{
		{outbound, filterInput{}, []string{"envoy.filters.http.grpc_stats", localRateLimitFilter, jsonToMetadataFilter, luaFilter, globalRateLimitOpenFilter, globalRateLimitClosedFilter, usageReaderFilter, "envoy.filters.http.router"}},
		// The public chain holds every route-enabled filter, whatever the
		// endpoints use (their change would drain the listener), with the
		// fallback first; the picker's with mTLS.
		{outbound, filterInput{public: true}, []string{routeFallbackFilter, "envoy.filters.http.grpc_stats", localRateLimitFilter, jsonToMetadataFilter, luaFilter, globalRateLimitOpenFilter, globalRateLimitClosedFilter, usageReaderFilter, "envoy.filters.http.router"}},
		{outbound, filterInput{public: true, mtls: true},
			[]string{routeFallbackFilter, "envoy.filters.http.grpc_stats", localRateLimitFilter, jsonToMetadataFilter, luaFilter, globalRateLimitOpenFilter, globalRateLimitClosedFilter, callerPickerFilter, usageReaderFilter,
				wire.EndpointSubsetFilter, endpointPickerFilter, wire.EndpointRouteFilter, "envoy.filters.http.router"}},
		// A node whose clusters come on demand asks for the one a
		// request's route chose last, before the router, on both chains.
		{outbound, filterInput{public: true, onDemand: true}, []string{routeFallbackFilter, "envoy.filters.http.grpc_stats", localRateLimitFilter, jsonToMetadataFilter, luaFilter, globalRateLimitOpenFilter, globalRateLimitClosedFilter, usageReaderFilter, onDemandFilter, "envoy.filters.http.router"}},
		// An external picker is asked once the cluster is here.
		{outbound, filterInput{onDemand: true, mtls: true}, []string{"envoy.filters.http.grpc_stats", localRateLimitFilter, jsonToMetadataFilter, luaFilter, globalRateLimitOpenFilter, globalRateLimitClosedFilter, callerPickerFilter, usageReaderFilter, onDemandFilter,
			wire.EndpointSubsetFilter, endpointPickerFilter, wire.EndpointRouteFilter, "envoy.filters.http.router"}},
		{inbound, filterInput{backend: ir.Backend{Name: "api"}}, []string{"servemesh.replica_report_scrub", "envoy.filters.http.router"}},
		{inbound, filterInput{backend: aware}, []string{"envoy.filters.http.ext_proc", "servemesh.replica_report_scrub", "envoy.filters.http.router"}},
	} {
		if got := names(c.chain, c.in); !slices.Equal(got, c.want) {
			t.Errorf("chain %d for %q: %v, want %v", c.chain, c.in.backend.Name, got, c.want)
		}
	}
}

// TestBackendFeatures: a backend's features are asked at each resource
// they change: a load-aware backend's nodes call their replicas through
// their inbound listener (no node view); a plain backend uses none; every
// node of an mTLS mesh has its picker's cluster once, whatever it runs.
func TestBackendFeatures(t *testing.T) {
	plain := ir.Backend{Name: "api"}
	aware := ir.Backend{Name: "llm", Reach: ir.ReachInbound, Picked: true, PromptAware: true}
	if len(featuresOf(plain)) != 0 || !hasNodeView(plain) {
		t.Fatalf("a plain backend uses %d features (node view %v)", len(featuresOf(plain)), hasNodeView(plain))
	}
	if hasNodeView(aware) {
		t.Fatal("a load-aware backend's node gets its own view: its picker would not see those requests")
	}
	here := []ir.Replica{{Address: "127.0.0.1:9001", Health: ir.Healthy, Node: goldenMTLSNode.ID, Inbound: "10.0.0.1:21000"}}
	plain.Reach, plain.MaxConcurrent, plain.Replicas = ir.ReachInbound, 1, here
	aware.MaxConcurrent, aware.Replicas = 1, here
	shared, err := BuildClusters(&ir.DataPlane{Backends: []ir.Backend{plain, aware}})
	if err != nil {
		t.Fatal(err)
	}
	for _, local := range [][]ir.Backend{nil, {plain}, {plain, aware}} {
		res, err := forNode(goldenMTLSNode, goldenMTLS, local, ClustersByName(shared), nil)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range res.Clusters {
			if c.GetName() == wire.PickerCluster {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("a node running %d backends has the picker's cluster %d times, want once", len(local), n)
		}
	}
}

// TestFeaturesAreRegisteredOnce: each feature has one row in its table,
// under a name of its own, and a backend uses exactly the ones its IR
// says.
func TestFeaturesAreRegisteredOnce(t *testing.T) {
	var names []string
	for _, f := range backendFeatures {
		names = append(names, f.name())
	}
	for _, f := range routeFeatures {
		names = append(names, f.name())
	}
	for _, f := range managerFeatures {
		names = append(names, f.name())
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	if len(slices.Compact(sorted)) != len(names) {
		t.Fatalf("feature names %v are not unique", names)
	}
	b := ir.Backend{Name: "g", HTTP2: true, Outlier: &ir.Outlier{Consecutive5xx: 3}}
	var used []string
	for _, f := range featuresOf(b) {
		used = append(used, f.name())
	}
	if !slices.Equal(used, []string{"grpc", "outlier"}) {
		t.Fatalf("a gRPC backend with outlier detection uses %v", used)
	}
}

// TestInboundRoutesAreInline: every chain of a node's inbound listener
// carries its routes inline, naming no route configuration by RDS; the
// xDS server's consistency check skips reading them back for that.
func TestInboundRoutesAreInline(t *testing.T) {
	here := []ir.Replica{{Address: "127.0.0.1:9001", Health: ir.Healthy, Node: goldenMTLSNode.ID, Inbound: "10.0.0.1:21000"}}
	local := []ir.Backend{
		{Name: "api", Reach: ir.ReachInbound, MaxConcurrent: 1, Replicas: here},
		{Name: "llm", Reach: ir.ReachInbound, Picked: true, MaxConcurrent: 1, Replicas: here},
	}
	shared, err := BuildClusters(&ir.DataPlane{Backends: local})
	if err != nil {
		t.Fatal(err)
	}
	res, err := forNode(goldenMTLSNode, goldenMTLS, local, ClustersByName(shared), nil)
	if err != nil {
		t.Fatal(err)
	}
	chains := 0
	for _, l := range res.Listeners {
		if l.GetName() != wire.InboundListener {
			continue
		}
		for _, c := range l.GetFilterChains() {
			for _, f := range c.GetFilters() {
				m := &hcm.HttpConnectionManager{}
				if err := f.GetTypedConfig().UnmarshalTo(m); err != nil {
					continue // not a connection manager
				}
				chains++
				if m.GetRouteConfig() == nil {
					t.Errorf("inbound chain %q takes its routes otherwise than inline: %T", c.GetName(), m.GetRouteSpecifier())
				}
			}
		}
	}
	if chains < len(local) {
		t.Fatalf("the inbound listener has %d connection managers; want one for each of %d backends", chains, len(local))
	}
}
