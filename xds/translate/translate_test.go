package translate

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	accesslog "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/internal/protoyaml"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata and delete stale ones")

// goldenNode is the node every model case is translated for; listeners
// depend only on the node and have cases of their own.
var goldenNode = wire.ProxyNode{ID: "node-1", PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001}

// TestGolden translates each valid model in testdata/in into the resources
// every node shares. Invalid models are the model package's cases: none
// reaches translation.
func TestGolden(t *testing.T) {
	testutil.GoldenCases(t, "testdata/in", "testdata/out", *update, func(t *testing.T, input []byte) map[string][]byte {
		m, err := parseView(input)
		if err != nil {
			t.Fatalf("a translation case must be a valid model (invalid ones belong in meshspec/testdata): %v", err)
		}
		dp := lower(t, m)
		res, err := Translate(dp, goldenNode, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkEnvoyValid(t, res)
		return map[string][]byte{
			"ir.yaml":            marshalIR(t, dp),
			"routes.yaml":        marshal(t, res.Routes),
			"scoped-routes.yaml": marshal(t, res.ScopedRoutes),
			"clusters.yaml":      marshal(t, res.Clusters),
			"assignments.yaml":   marshal(t, res.Assignments),
		}
	})
}

// goldenMTLSNode is node-1 of the mTLS cases, and goldenMTLS their mesh.
var (
	goldenMTLSNode = wire.ProxyNode{ID: "node-1", PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001,
		InboundAddress: "10.0.0.1", InboundPort: 21000}
	goldenMTLS = &MTLS{IdentityPrefix: "spiffe://11111111-2222-3333-4444-555555555555.consul/ns/default/dc/dc1/svc/"}
)

// TestGoldenMTLS translates each model in testdata/mtls/in for node-1 of a
// mesh with mTLS: its routes, its listeners (the inbound one included), its
// clusters (over mTLS, and to its own replicas) and the shared assignments
// (nodes by their inbound listeners).
func TestGoldenMTLS(t *testing.T) {
	testutil.GoldenCases(t, "testdata/mtls/in", "testdata/mtls/out", *update, func(t *testing.T, input []byte) map[string][]byte {
		m, err := parseView(input)
		if err != nil {
			t.Fatalf("a translation case must be a valid model: %v", err)
		}
		dp := lowerMTLS(t, m)
		res, err := Translate(dp, goldenMTLSNode, goldenMTLS)
		if err != nil {
			t.Fatal(err)
		}
		checkEnvoyValid(t, res)
		return map[string][]byte{
			"ir.yaml":          marshalIR(t, dp),
			"routes.yaml":      marshal(t, res.Routes),
			"listeners.yaml":   marshal(t, res.Listeners),
			"clusters.yaml":    marshal(t, res.Clusters),
			"assignments.yaml": marshal(t, res.Assignments),
		}
	})
}

// TestMTLSRefusesPlainNode: a node without an inbound listener or secrets
// folder gets no config in a mesh with mTLS, and a bad identity prefix is
// refused.
func TestMTLSRefusesPlainNode(t *testing.T) {
	m := lowerMTLS(t, &meshspec.Model{Backends: []meshspec.Backend{{Name: "a"}}})
	if _, err := Translate(m, goldenNode, goldenMTLS); err == nil || !strings.Contains(err.Error(), "announces no inbound listener") {
		t.Fatalf("a plaintext node in an mTLS mesh: %v", err)
	}
	if _, err := Translate(m, goldenMTLSNode, &MTLS{IdentityPrefix: "https://x/"}); err == nil {
		t.Fatal("a bad identity prefix was accepted")
	}
}

// TestGoldenListeners builds each node's listeners from testdata/listeners/in.
func TestGoldenListeners(t *testing.T) {
	testutil.GoldenCases(t, "testdata/listeners/in", "testdata/listeners/out", *update, func(t *testing.T, input []byte) map[string][]byte {
		var node wire.ProxyNode
		if err := yaml.UnmarshalStrict(input, &node); err != nil {
			t.Fatal(err)
		}
		ls, err := buildListeners(node, nil)
		if err != nil {
			t.Fatal(err)
		}
		routes, scopes := BuildRoutes(&ir.DataPlane{})
		if !node.Public() { // a mesh-only node never asks for the public table
			routes = slices.DeleteFunc(routes, func(r *route.RouteConfiguration) bool { return wire.IsPublicRouteName(r.GetName()) })
		}
		checkEnvoyValid(t, &Resources{Listeners: ls, Routes: routes, ScopedRoutes: scopes})
		return map[string][]byte{"listeners.yaml": marshal(t, ls)}
	})
}

func marshal[T proto.Message](t *testing.T, items []T) []byte {
	t.Helper()
	b, err := protoyaml.MarshalList(items)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkEnvoyValid runs Envoy's own proto validation rules on every resource
// and go-control-plane's snapshot consistency check on the whole set.
func checkEnvoyValid(t *testing.T, res *Resources) {
	t.Helper()
	all := map[resource.Type][]types.Resource{}
	add := func(typ resource.Type, msgs ...proto.Message) {
		for _, m := range msgs {
			if v, ok := m.(interface{ ValidateAll() error }); ok {
				if err := v.ValidateAll(); err != nil {
					t.Errorf("%s fails Envoy's validation: %v", typ, err)
				}
			}
			all[typ] = append(all[typ], m)
		}
	}
	for _, r := range res.Listeners {
		add(resource.ListenerType, r)
	}
	for _, r := range res.Routes {
		add(resource.RouteType, r)
	}
	for _, r := range res.ScopedRoutes {
		add(resource.ScopedRouteType, r)
	}
	for _, r := range res.Clusters {
		add(resource.ClusterType, r)
	}
	for _, r := range res.Assignments {
		add(resource.EndpointType, r)
	}
	snap, err := cachev3.NewSnapshot("1", all)
	if err != nil {
		t.Fatalf("new snapshot: %v", err)
	}
	if err := snap.Consistent(); err != nil {
		t.Errorf("snapshot is not consistent: %v", err)
	}
}

// TestStatNamesReadBack checks the contract between the names translation
// gives Envoy resources and wire.ParseStat, with which agents read Envoy's
// stats: every route's and cluster's stats name their endpoint, listener
// and backend, even for an endpoint named like the public virtual host.
func TestStatNamesReadBack(t *testing.T) {
	m := &meshspec.Model{
		Backends: []meshspec.Backend{{Name: "v1.a", Replicas: []meshspec.Replica{{Address: "127.0.0.1:1"}}}},
		Endpoints: []meshspec.Endpoint{
			{Name: "public", Route: "/p", Methods: []string{"GET", "POST"}, Traffic: map[string]float64{"v1.a": 1}},
			{Name: "inner", Traffic: map[string]float64{"v1.a": 1}},
		},
	}
	res, err := Translate(lower(t, m), goldenNode, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[wire.Stat]bool{}
	for _, rc := range res.Routes {
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if r.GetStatPrefix() == "" {
					continue // direct responses (405) count no upstream requests
				}
				s, ok := wire.ParseStat("vhost." + vh.GetName() + ".route." + r.GetStatPrefix() + "." + wire.StatRequests)
				if !ok {
					t.Fatalf("route %s in vhost %s: its stats do not parse", r.GetName(), vh.GetName())
				}
				want := wire.MeshListener
				if wire.IsPublicRouteName(rc.GetName()) {
					want = wire.PublicListener
				}
				if s.Listener != want || (s.Endpoint != "public" && s.Endpoint != "inner") {
					t.Errorf("route %s in %s reads back as %+v; want endpoint and listener %s", r.GetName(), rc.GetName(), s, want)
				}
				seen[s] = true
			}
		}
	}
	if len(seen) != 3 { // public on both listeners, inner on the mesh only
		t.Errorf("route stats read back as %v; want public/public, public/mesh and inner/mesh", seen)
	}
	for _, c := range res.Clusters {
		s, ok := wire.ParseStat("cluster." + c.GetName() + "." + wire.StatActive)
		if strings.HasPrefix(c.GetName(), "_") { // servemesh's own: no backend's figures
			if ok {
				t.Errorf("cluster %s reads back as a backend's, %+v", c.GetName(), s)
			}
			continue
		}
		if !ok || s.Backend != "v1.a" {
			t.Errorf("cluster %s reads back as %+v, %v", c.GetName(), s, ok)
		}
	}
}

// parseView reads a translation case: a stored state whose backends list
// their replicas too, which unlike what users write (meshspec.Parse) may
// name their nodes and inbound listeners; the state (split) must be valid.
func parseView(input []byte) (*meshspec.Model, error) {
	js, err := yaml.YAMLToJSONStrict(input)
	if err != nil {
		return nil, err
	}
	var m meshspec.Model
	if err := meshspec.DecodeJSON(js, &m); err != nil {
		return nil, err
	}
	state, _ := split(&m)
	return &m, state.Validate()
}

// TestInboundHealthChangesOnlyAssignments: a node's own replicas come by
// EDS, so a replica's health change updates the node's inbound assignment
// and leaves its inbound cluster as it was (the cluster was STATIC and was
// replaced at each change).
func TestInboundHealthChangesOnlyAssignments(t *testing.T) {
	input, err := os.ReadFile("testdata/mtls/in/two-nodes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	before, err := parseView(input)
	if err != nil {
		t.Fatal(err)
	}
	after := meshspec.Clone(before)
	changed := false
	for i, r := range after.Backends[0].Replicas {
		if r.Node == goldenMTLSNode.ID && r.EffectiveHealth() == meshspec.HealthHealthy {
			after.Backends[0].Replicas[i].Health = meshspec.HealthUnhealthy
			changed = true
			break
		}
	}
	if !changed {
		t.Fatal("the case has no healthy replica on the node to change")
	}
	own := func(m *meshspec.Model) (*Resources, error) {
		return Translate(lowerMTLS(t, m), goldenMTLSNode, goldenMTLS)
	}
	b, err := own(before)
	if err != nil {
		t.Fatal(err)
	}
	a, err := own(after)
	if err != nil {
		t.Fatal(err)
	}
	name := after.Backends[0].Name
	find := func(r *Resources) (proto.Message, proto.Message) {
		var c, cla proto.Message
		for _, x := range r.Clusters {
			if x.GetName() == wire.InboundClusterName(name) {
				c = x
			}
		}
		for _, x := range r.Assignments {
			if x.GetClusterName() == wire.InboundAssignmentName(name, goldenMTLSNode.ID) {
				cla = x
			}
		}
		if c == nil || cla == nil {
			t.Fatalf("no inbound cluster or assignment of %s for %s", name, goldenMTLSNode.ID)
		}
		return c, cla
	}
	bc, bcla := find(b)
	ac, acla := find(a)
	if !proto.Equal(bc, ac) {
		t.Error("a replica's health change changed the node's inbound cluster")
	}
	if proto.Equal(bcla, acla) {
		t.Error("a replica's health change left the node's inbound assignment as it was")
	}
}

// TestNoAccessLog: a node that asks for no access log gets listeners that
// write none, inbound listener included; by default every one writes it.
func TestNoAccessLog(t *testing.T) {
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "b", Replicas: []meshspec.Replica{{Address: "127.0.0.1:9001", Node: "node-1", Inbound: "10.0.0.1:21000"}}}},
		Endpoints: []meshspec.Endpoint{{Name: "e", Route: "/e", Traffic: map[string]float64{"b": 1}}}}
	for _, off := range []bool{false, true} {
		node := goldenMTLSNode
		node.NoAccessLog = off
		res, err := Translate(lowerMTLS(t, m), node, goldenMTLS)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Listeners) != 3 {
			t.Fatalf("%d listeners, want public, mesh and inbound", len(res.Listeners))
		}
		for _, l := range res.Listeners {
			for _, fc := range l.GetFilterChains() {
				var manager hcm.HttpConnectionManager
				if err := fc.GetFilters()[0].GetTypedConfig().UnmarshalTo(&manager); err != nil {
					t.Fatal(err)
				}
				logged := slices.ContainsFunc(manager.GetAccessLog(), func(l *accesslog.AccessLog) bool { return l.GetName() == "envoy.access_loggers.file" })
				if logged == off {
					t.Errorf("listener %s, no_access_log %v: access log %v", l.GetName(), off, logged)
				}
			}
		}
	}
}

// TestModelAnswersListAFewModels: a model-routed endpoint's 400 and 404
// answers name its models, at most ten (route tables are sent whole).
func TestModelAnswersListAFewModels(t *testing.T) {
	var names []string
	for i := range 12 {
		names = append(names, fmt.Sprintf("m%02d", i))
	}
	if got := joinQuoted(names); !strings.HasSuffix(got, `"m09" and 2 more`) || strings.Contains(got, "m10") {
		t.Errorf("listed %s", got)
	}
	if got := joinQuoted(names[:2]); got != `"m00", "m01"` {
		t.Errorf("listed %s", got)
	}
}
