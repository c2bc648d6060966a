package server

import (
	"context"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// TestAckedAllNeedsNoACKForAnEmptyType: a node of an empty mesh holds
// scopes but no route configuration, so its Envoy never asks for routes;
// it is in sync once it ACKed the rest (the controller reported such a
// node out of sync forever). A type with resources still needs its ACK.
func TestAckedAllNeedsNoACKForAnEmptyType(t *testing.T) {
	full := func(version string) *kind {
		return &kind{version: version, twins: map[string]types.Resource{"x": nil}, versions: map[string]string{"x": version}}
	}
	empty := &kind{version: "e3b0c44298fc1c14", twins: map[string]types.Resource{}, versions: map[string]string{}}
	n := &nodeState{
		set: snapshot{resource.ClusterType: full("c1"), resource.ListenerType: full("l1"),
			resource.ScopedRouteType: empty, resource.RouteType: empty},
		acked: map[string]string{resource.ClusterType: "c1", resource.ListenerType: "l1", resource.ScopedRouteType: "e3b0c44298fc1c14"},
	}
	if !n.ackedAll() {
		t.Fatal("a node that ACKed every type it has resources of is reported out of sync")
	}
	n.acked[resource.RouteType] = "r-old" // its last scope went away: it unsubscribed
	if !n.ackedAll() {
		t.Fatal("a node that unsubscribed from the routes it no longer has is reported out of sync")
	}
	n.set[resource.RouteType] = full("r2")
	if n.ackedAll() {
		t.Fatal("a node that did not ACK its routes is reported in sync")
	}
	n.acked[resource.RouteType] = "r2"
	n.acked[resource.ListenerType] = "l0"
	if n.ackedAll() {
		t.Fatal("a node that did not ACK its listeners is reported in sync")
	}
}

// TestANodeThatMovesControllersHoldingItAllIsInSync: when its controller
// fails over, a node's Envoy opens a stream to the new one stating, per
// resource, what it holds. Where that is all it should hold, the delta
// cache sends nothing for the type, so nothing gets ACKed: the new
// controller reported the node out of sync until the type next changed
// (TestChaos, seed 1796552480201358021: every node held every route the
// controller expected, and none was in sync). What a node states it holds
// of the latest is what it ACKed.
func TestANodeThatMovesControllersHoldingItAllIsInSync(t *testing.T) {
	dp := lowered(t, testModel("127.0.0.1:9001"))
	first, conn, _ := startServer(t)
	if err := first.SetDataPlane(dp); err != nil {
		t.Fatal(err)
	}
	routes := []string{wire.MeshRouteName("api"), wire.PublicRouteName("api")}
	subs := []subscription{{resource.ClusterType, nil}, {resource.ListenerType, nil}, {resource.ScopedRouteType, nil}, {resource.RouteType, routes}}
	held := holding(t, conn, subs)
	if len(held[resource.RouteType]) != len(routes) {
		t.Fatalf("the node holds routes %v; want %v", held[resource.RouteType], routes)
	}

	second, conn, _ := startServer(t)
	if err := second.SetDataPlane(dp); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &deltaClient{t: t, stream: stream}
	go func() { // ACK what is sent, until the stream ends
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			_ = stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
		}
	}()
	for i, sub := range subs {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: sub.typ, ResourceNamesSubscribe: sub.names, InitialResourceVersions: held[sub.typ]}
		if i == 0 {
			req.Node = servemeshNode(t, "n1")
		}
		if err := c.stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	if err := testutil.Until(5*time.Second, func() bool {
		st := second.Status()
		return len(st) == 1 && st[0].InSync
	}); err != nil {
		t.Fatalf("the node holding all it should is not in sync with its new controller: %+v", second.Status())
	}
}

// holding opens a delta stream as node n1, subscribes to subs in turn and
// ACKs the answers; it returns, per type, the versions of what it holds.
func holding(t *testing.T, conn *grpc.ClientConn, subs []subscription) map[string]map[string]string {
	t.Helper()
	c, _ := openDelta(t, conn, servemeshNode(t, "n1"))
	held := map[string]map[string]string{}
	for i, sub := range subs {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: sub.typ, ResourceNamesSubscribe: sub.names}
		if i == 0 {
			req.Node = servemeshNode(t, "n1")
		}
		if err := c.stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp := c.next()
		c.ack(resp)
		held[sub.typ] = map[string]string{}
		for _, r := range resp.GetResources() {
			held[sub.typ][r.GetName()] = r.GetVersion()
		}
	}
	_ = c.stream.CloseSend()
	return held
}
