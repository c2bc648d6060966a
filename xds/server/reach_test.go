package server

import (
	"context"
	"slices"
	"sort"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// deltaClient is a delta ADS stream that ACKs what it receives.
type deltaClient struct {
	t      *testing.T
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
}

// subscription is one type a deltaClient asks for: names, or nil for all.
type subscription struct {
	typ   string
	names []string
}

// openDelta opens a delta stream as node and subscribes to each type in
// turn, taking the answer to each; it returns the names each type got.
func openDelta(t *testing.T, conn *grpc.ClientConn, node *core.Node, subs ...subscription) (*deltaClient, map[string][]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &deltaClient{t: t, stream: stream}
	got := map[string][]string{}
	for i, sub := range subs {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: sub.typ, ResourceNamesSubscribe: sub.names}
		if i == 0 {
			req.Node = node
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		for typ, names := range c.recv(1) {
			got[typ] = names
		}
	}
	return c, got
}

// next is the stream's next answer, not ACKed yet (ack).
func (c *deltaClient) next() *discovery.DeltaDiscoveryResponse {
	c.t.Helper()
	resp, err := c.stream.Recv()
	if err != nil {
		c.t.Fatal(err)
	}
	return resp
}

// ack ACKs resp.
func (c *deltaClient) ack(resp *discovery.DeltaDiscoveryResponse) {
	c.t.Helper()
	if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
		c.t.Fatal(err)
	}
}

// recv ACKs n answers and returns the names each type's held, sorted.
func (c *deltaClient) recv(n int) map[string][]string {
	c.t.Helper()
	got := map[string][]string{}
	for range n {
		resp, err := c.stream.Recv()
		if err != nil {
			c.t.Fatal(err)
		}
		if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
			c.t.Fatal(err)
		}
		typ, names := resp.GetTypeUrl(), got[resp.GetTypeUrl()]
		for _, r := range resp.GetResources() {
			names = append(names, r.GetName())
		}
		sort.Strings(names)
		got[typ] = names // set even if empty: the type was answered
	}
	return got
}

// withOther adds to m an endpoint other, routed at /other, of a backend
// v3 of its own.
func withOther(m *meshspec.Model) *meshspec.Model {
	m.Backends = append(m.Backends, meshspec.Backend{Name: "v3", Replicas: []meshspec.Replica{{Address: "127.0.0.1:9003"}}})
	m.Endpoints = append(m.Endpoints, meshspec.Endpoint{Name: "other", Route: "/other", Traffic: map[string]float64{"v3": 1}})
	return m
}

// TestNodesGetWhatTheyReach: a node that reaches only some endpoints
// (wire.ProxyNode.Reachable) gets their mesh routes, scopes and backends'
// clusters alone, is not woken by a change to an endpoint it does not
// reach, and is in sync; a public node that reaches them gets every public
// route configuration and scope and every cluster besides.
func TestNodesGetWhatTheyReach(t *testing.T) {
	s, conn, _ := startServer(t)
	m := withOther(testModel("127.0.0.1:9001"))
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	api := wire.MeshRouteName("api")
	subs := func(routes ...string) []subscription {
		return []subscription{{resource.ClusterType, nil}, {resource.EndpointType, []string{"v1", "v2", "v3"}},
			{resource.ListenerType, nil}, {resource.ScopedRouteType, nil}, {resource.RouteType, routes}}
	}
	reaching := wire.ProxyNode{ID: "reach", MeshAddress: "127.0.0.1", MeshPort: 15001, Reachable: []string{"api"}}
	meta, err := reaching.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	c, got := openDelta(t, conn, &core.Node{Id: reaching.ID, Metadata: meta}, subs(api)...)
	for typ, want := range map[string][]string{resource.ClusterType: {wire.GenAICluster, wire.RateLimitCluster, "v1", "v2"}, resource.ScopedRouteType: {api}, resource.RouteType: {api}} {
		if !slices.Equal(got[typ], want) {
			t.Errorf("a mesh-only node reaching api got %s %v; want %v", typ, got[typ], want)
		}
	}
	public := reaching
	public.ID, public.PublicAddress, public.PublicPort = "reach-public", "127.0.0.1", 8080
	if meta, err = public.Metadata(); err != nil {
		t.Fatal(err)
	}
	publicAPI, publicOther := wire.PublicRouteName("api"), wire.PublicRouteName("other")
	_, got = openDelta(t, conn, &core.Node{Id: public.ID, Metadata: meta}, subs(api, publicAPI, publicOther)...)
	for typ, want := range map[string][]string{resource.ClusterType: {wire.GenAICluster, wire.RateLimitCluster, "v1", "v2", "v3"},
		resource.ScopedRouteType: {api, publicAPI, publicOther}, resource.RouteType: {api, publicAPI, publicOther}} {
		if !slices.Equal(got[typ], want) {
			t.Errorf("a public node reaching api got %s %v; want %v", typ, got[typ], want)
		}
	}
	testutil.WaitFor(t, 5*time.Second, "both nodes in sync", func() bool {
		st := s.Status()
		return len(st) == 2 && st[0].InSync && st[1].InSync
	})

	// A change to other sends the mesh-only node nothing, and it is in
	// sync at once; a change to api sends it api's mesh routes alone.
	m = meshspec.Clone(m)
	m.Endpoints[1].Traffic = map[string]float64{"v3": 0.5, "v1": 0.5}
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the mesh-only node in sync with the change to other", func() bool {
		st := s.Status()[0] // sorted by id: "reach" first
		return st.InSync && st.Generation == st.ModelGeneration
	})
	m = meshspec.Clone(m)
	m.Endpoints[0].Traffic = map[string]float64{"v1": 0.9, "v2": 0.1}
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	if got := c.recv(1); !slices.Equal(got[resource.RouteType], []string{api}) || len(got) != 1 {
		t.Errorf("the mesh-only node's next answer: %v; want api's mesh routes alone (nothing of other's change)", got)
	}
	testutil.WaitFor(t, 5*time.Second, "the mesh-only node in sync with the change to api", func() bool {
		st := s.Status()[0]
		return st.InSync && st.Generation == st.ModelGeneration
	})
}

// TestMeshOnlyNodesGetNoPublicScopes: Envoy asks for every scope, and
// fetches the route configuration of each it gets, so a node without a
// public listener is sent the mesh's scopes alone, while a public node
// gets the public ones besides; a change to a public route configuration
// then never reaches the mesh-only node.
func TestMeshOnlyNodesGetNoPublicScopes(t *testing.T) {
	s, conn, _ := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	api, publicAPI := wire.MeshRouteName("api"), wire.PublicRouteName("api")
	subs := []subscription{{resource.ClusterType, nil}, {resource.EndpointType, []string{"v1", "v2"}},
		{resource.ListenerType, nil}, {resource.ScopedRouteType, nil}}
	for _, c := range []struct {
		node *core.Node
		want []string
	}{
		{meshOnlyNode(t, "mesh-only"), []string{api}},
		{servemeshNode(t, "public"), []string{api, publicAPI}},
	} {
		_, got := openDelta(t, conn, c.node, subs...)
		if !slices.Equal(got[resource.ScopedRouteType], c.want) {
			t.Errorf("node %s got scopes %v; want %v", c.node.GetId(), got[resource.ScopedRouteType], c.want)
		}
	}
}
