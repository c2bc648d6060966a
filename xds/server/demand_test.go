package server

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestClustersOnDemand: a node whose clusters come on demand starts with
// its own clusters alone, every route besides; naming one cluster of an
// endpoint gets it the clusters of every endpoint that sends to it (api's
// split: v1 and v2, and its shadow v4), not the rest of the mesh (v3), and
// it is in sync; a name the mesh does not have gets nothing.
func TestClustersOnDemand(t *testing.T) {
	s, conn, _ := startServer(t)
	m := testModel("127.0.0.1:9001")
	m.Backends = append(m.Backends,
		meshspec.Backend{Name: "v3", Replicas: []meshspec.Replica{{Address: "127.0.0.1:9003"}}},
		meshspec.Backend{Name: "v4", Replicas: []meshspec.Replica{{Address: "127.0.0.1:9004"}}})
	m.Endpoints[0].Shadows = map[string]float64{"v4": 0.1}
	m.Endpoints = append(m.Endpoints, meshspec.Endpoint{Name: "other", Route: "/other", Traffic: map[string]float64{"v3": 1}})
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	node := wire.ProxyNode{ID: "od", PublicAddress: "127.0.0.1", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001, ClustersOnDemand: true}
	meta, err := node.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	api, other := wire.MeshRouteName("api"), wire.MeshRouteName("other")
	publicAPI, publicOther := wire.PublicRouteName("api"), wire.PublicRouteName("other")
	c, got := openDelta(t, conn, &core.Node{Id: node.ID, Metadata: meta},
		subscription{resource.ClusterType, nil}, subscription{resource.ListenerType, nil},
		subscription{resource.ScopedRouteType, nil}, subscription{resource.RouteType, []string{api, other, publicAPI, publicOther}})
	for typ, want := range map[string][]string{
		resource.ClusterType: {wire.GenAICluster, wire.RateLimitCluster},
		resource.RouteType:   {api, other, publicAPI, publicOther},
	} {
		if !slices.Equal(got[typ], want) {
			t.Errorf("a node with clusters on demand, at first: %s %v; want %v", typ, got[typ], want)
		}
	}
	if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"v2"}}); err != nil {
		t.Fatal(err)
	}
	if got := c.nextResources(); !slices.Equal(got, []string{"v1", "v2", "v4"}) {
		t.Errorf("after naming v2: %v; want api's clusters v1, v2 and its shadow v4 (not other's v3)", got)
	}
	testutil.WaitFor(t, 5*time.Second, "the node in sync", func() bool {
		st := s.Status()
		return len(st) == 1 && st[0].InSync
	})

	// A name the mesh lacks is kept (its backend may come) but sends
	// nothing; the next real change sends just what changed.
	if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"nope"}}); err != nil {
		t.Fatal(err)
	}
	m = meshspec.Clone(m)
	m.Backends[2].Config.MaxConcurrentQueries = 7 // v3: other's, not held
	m.Backends[0].Config.MaxConcurrentQueries = 7 // v1: held
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	if got := c.nextResources(); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("after a change to v1 and v3: %v; want v1 alone", got)
	}
}

// TestDemandIsNotCoalesced: a request waits for what its node asks for on
// demand, so the publisher sends it at once, not after the hold-off that
// coalesces model changes (a minute here).
func TestDemandIsNotCoalesced(t *testing.T) {
	s, conn, _ := startServerHolding(t, time.Minute, 2*time.Minute)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	node := wire.ProxyNode{ID: "od", MeshAddress: "127.0.0.1", MeshPort: 15001, ClustersOnDemand: true}
	meta, err := node.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	// The first publish (the model) waits the hold-off; a new node is
	// published on its own.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // well under the hold-off
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &deltaClient{t: t, stream: stream}
	if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: node.ID, Metadata: meta}, TypeUrl: resource.ClusterType,
		ResourceNamesSubscribe: []string{"*", "v1"}}); err != nil {
		t.Fatal(err)
	}
	if got := c.nextResources(); !slices.Contains(got, "v1") {
		t.Fatalf("clusters %v; want v1, asked for by name", got)
	}
}

// TestMeshOnlyRoutesOnDemand: a node without a public listener whose
// clusters come on demand gets every mesh scope with on_demand set and no
// route configuration until it names one, then that one alone; a change
// to another endpoint sends it nothing, a change to the named one its
// routes.
func TestMeshOnlyRoutesOnDemand(t *testing.T) {
	s, conn, _ := startServer(t)
	m := withOther(testModel("127.0.0.1:9001"))
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	node := wire.ProxyNode{ID: "od", MeshAddress: "127.0.0.1", MeshPort: 15001, ClustersOnDemand: true}
	meta, err := node.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	api, other := wire.MeshRouteName("api"), wire.MeshRouteName("other")
	c, _ := openDelta(t, conn, &core.Node{Id: node.ID, Metadata: meta},
		subscription{resource.ClusterType, nil}, subscription{resource.ListenerType, nil})
	if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ScopedRouteType}); err != nil {
		t.Fatal(err)
	}
	resp := c.next()
	c.ack(resp)
	var scopes []string
	for _, r := range resp.GetResources() {
		var sc route.ScopedRouteConfiguration
		if err := r.GetResource().UnmarshalTo(&sc); err != nil {
			t.Fatal(err)
		}
		if !sc.GetOnDemand() {
			t.Errorf("scope %s is not on demand", sc.GetName())
		}
		scopes = append(scopes, sc.GetName())
	}
	slices.Sort(scopes)
	if !slices.Equal(scopes, []string{api, other}) {
		t.Errorf("scopes %v; want the mesh's, %s and %s", scopes, api, other)
	}
	if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResourceNamesSubscribe: []string{api}}); err != nil {
		t.Fatal(err)
	}
	if got := c.nextResources(); !slices.Equal(got, []string{api}) {
		t.Errorf("after naming %s: %v", api, got)
	}
	testutil.WaitFor(t, 5*time.Second, "the node in sync", func() bool {
		st := s.Status()
		return len(st) == 1 && st[0].InSync
	})
	m = meshspec.Clone(m)
	m.Endpoints[1].Traffic = map[string]float64{"v3": 0.5, "v1": 0.5}
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the node in sync with a change to other, which it never asked for", func() bool {
		st := s.Status()[0]
		return st.InSync && st.Generation == st.ModelGeneration
	})
	m = meshspec.Clone(m)
	m.Endpoints[0].Traffic = map[string]float64{"v1": 0.9, "v2": 0.1}
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	if got := c.nextResources(); !slices.Equal(got, []string{api}) {
		t.Errorf("after a change to api: %v; want its routes", got)
	}
}

// TestDemandIsBounded: a node naming more clusters than a mesh can have
// is held to maxDemanded; a node whose clusters do not come on demand
// records none.
func TestDemandIsBounded(t *testing.T) {
	s, conn, _ := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	od := wire.ProxyNode{ID: "od", MeshAddress: "127.0.0.1", MeshPort: 15001, ClustersOnDemand: true}
	meta, err := od.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	openDelta(t, conn, &core.Node{Id: od.ID, Metadata: meta}, subscription{resource.ClusterType, nil})
	openDelta(t, conn, servemeshNode(t, "all"), subscription{resource.ClusterType, nil})
	names := make([]string, maxDemanded+10)
	for i := range names {
		names[i] = fmt.Sprintf("c%d", i)
	}
	s.mu.Lock()
	var streams []streamKey
	for id := range s.streams {
		streams = append(streams, id)
	}
	s.mu.Unlock()
	for _, id := range streams {
		s.demand(id, resource.ClusterType, names)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.nodes["od"].demanded[resource.ClusterType]); n != maxDemanded {
		t.Errorf("the on-demand node holds %d names; want at most %d", n, maxDemanded)
	}
	if n := len(s.nodes["all"].demanded[resource.ClusterType]); n != 0 {
		t.Errorf("a node holding every cluster recorded %d names; want none", n)
	}
}

// nextResources ACKs answers until one sends resources, and returns
// their names, sorted. go-control-plane answers a subscription to a name
// it does not hold yet with an empty answer (Envoy waits on).
func (c *deltaClient) nextResources() []string {
	c.t.Helper()
	for {
		resp := c.next()
		c.ack(resp)
		if len(resp.GetResources()) == 0 {
			continue
		}
		var names []string
		for _, r := range resp.GetResources() {
			names = append(names, r.GetName())
		}
		slices.Sort(names)
		return names
	}
}
