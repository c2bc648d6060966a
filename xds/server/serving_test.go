package server

import (
	"context"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// publish sets testModel, v1's replica at addr, as the data plane of
// store revision rev.
func (tc servingCase) publish(t *testing.T, addr string, rev uint64) {
	t.Helper()
	dp := lowered(t, testModel(addr))
	dp.Revision = rev
	if err := tc.s.SetDataPlane(dp); err != nil {
		t.Fatal(err)
	}
}

type servingCase struct{ s *Server }

// openSynced opens node n1's delta stream, subscribed to testModel's
// clusters, listeners and routes, and waits until it holds them; it
// returns the stream and the subscriptions.
func openSynced(t *testing.T, s *Server, conn *grpc.ClientConn) (*deltaClient, []subscription) {
	t.Helper()
	subs := []subscription{{resource.ClusterType, nil}, {resource.ListenerType, nil}, {resource.ScopedRouteType, nil},
		{resource.RouteType, []string{wire.MeshRouteName("api"), wire.PublicRouteName("api")}}}
	c, _ := openDelta(t, conn, servemeshNode(t, "n1"), subs...)
	testutil.WaitFor(t, 5*time.Second, "the node's clusters, listeners and routes in sync", func() bool {
		st := s.Status()
		return len(st) == 1 && st[0].InSync
	})
	return c, subs
}

// waiting is what Serving says the nodes do not serve yet of v1.
func (tc servingCase) waiting() string {
	return strings.Join(tc.s.Serving([]string{"v1"}).Waiting, "; ")
}

// TestServingFollowsAssignmentACKs: a node serves a backend's replicas
// once it ACKed their assignment, not when its clusters are in sync; a
// change of replicas alone is waited for until the node ACKs it; a node
// that opens its stream again stating what it holds serves at once.
func TestServingFollowsAssignmentACKs(t *testing.T) {
	s, conn, _ := startServer(t)
	tc := servingCase{s}
	tc.publish(t, "127.0.0.1:9001", 5)
	if got := s.Serving([]string{"v1", "gone"}); got.Nodes != 0 || got.Revision != 5 || got.Healthy["v1"] != 1 || len(got.Healthy) != 1 {
		t.Fatalf("no node yet: %+v; want no node, revision 5, v1's one replica healthy and nothing of a backend it lacks", got)
	}
	c, subs := openSynced(t, s, conn)
	if w := tc.waiting(); !strings.Contains(w, "node n1: has not received backend v1's replicas yet (assignment v1: it holds version none") {
		t.Fatalf("in sync but no assignment asked for: waiting %q; want it waiting for v1's replicas", w)
	}
	if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"v1", "v2"}}); err != nil {
		t.Fatal(err)
	}
	resp := c.next()
	if w := tc.waiting(); w == "" {
		t.Fatal("the assignments sent but not ACKed: served; want waiting")
	}
	c.ack(resp)
	testutil.WaitFor(t, 5*time.Second, "the node to serve v1 once it ACKed its assignment", func() bool { return tc.waiting() == "" })
	held := map[string]string{}
	for _, r := range resp.GetResources() {
		held[r.GetName()] = r.GetVersion()
	}

	// v1's replica moves: only its assignment changes.
	tc.publish(t, "127.0.0.1:9011", 6)
	if got := s.Serving([]string{"v1"}); got.Revision != 6 || len(got.Waiting) == 0 {
		t.Fatalf("right after a change: %+v; want revision 6, waited for", got)
	}
	for {
		resp := c.next()
		if resp.GetTypeUrl() != resource.EndpointType {
			c.ack(resp)
			continue
		}
		// The assignment may reach the node before the publisher records
		// the node's snapshot of generation 6 (it sends assignments
		// first): until then the node is waited for that generation.
		// Either way it is waited for until it ACKs the assignment.
		testutil.WaitFor(t, 5*time.Second, "v1's unACKed assignment to be what the node is waited for", func() bool {
			w := tc.waiting()
			if w == "" {
				t.Fatal("the moved replica's assignment sent, not ACKed: served; want v1's assignment waited for")
			}
			return strings.Contains(w, "assignment v1")
		})
		c.ack(resp)
		for _, r := range resp.GetResources() {
			held[r.GetName()] = r.GetVersion()
		}
		break
	}
	testutil.WaitFor(t, 5*time.Second, "the node to serve the moved replica", func() bool { return tc.waiting() == "" })

	// The node's Envoy opens its stream again (its controller restarted,
	// say), stating what it holds: it is sent nothing new and serves.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.stream.CloseSend()
	again, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2 := &deltaClient{t: t, stream: again}
	if err := again.Send(&discovery.DeltaDiscoveryRequest{Node: servemeshNode(t, "n1"), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	c2.recv(1)
	for _, sub := range subs[1:] {
		if err := again.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: sub.typ, ResourceNamesSubscribe: sub.names}); err != nil {
			t.Fatal(err)
		}
		c2.recv(1)
	}
	if err := again.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"v1", "v2"},
		InitialResourceVersions: held}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the node that stated what it holds to serve", func() bool { return tc.waiting() == "" })
}

// TestServingOnStateOfTheWorld: on a state-of-the-world stream, the
// assignments a node ACKed are hashed as the translation versions them.
func TestServingOnStateOfTheWorld(t *testing.T) {
	s, conn, _ := startServer(t)
	tc := servingCase{s}
	tc.publish(t, "127.0.0.1:9001", 3)
	st := openSotW(t, conn)
	st.send(&discovery.DiscoveryRequest{Node: servemeshNode(t, "w1"), TypeUrl: resource.ClusterType})
	st.send(ack(st.expect(resource.ClusterType)))
	st.send(&discovery.DiscoveryRequest{TypeUrl: resource.ListenerType})
	st.send(ack(st.expect(resource.ListenerType)))
	st.send(&discovery.DiscoveryRequest{TypeUrl: resource.ScopedRouteType})
	st.send(ack(st.expect(resource.ScopedRouteType)))
	routes := []string{wire.MeshRouteName("api"), wire.PublicRouteName("api")}
	st.send(&discovery.DiscoveryRequest{TypeUrl: resource.RouteType, ResourceNames: routes})
	st.send(ack(st.expect(resource.RouteType), routes...))
	st.send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"v1", "v2"}})
	eds := st.expect(resource.EndpointType)
	if w := tc.waiting(); w == "" {
		t.Fatal("the assignments sent but not ACKed: served; want waiting")
	}
	st.send(ack(eds, "v1", "v2"))
	testutil.WaitFor(t, 5*time.Second, "the state-of-the-world node to serve v1", func() bool { return tc.waiting() == "" })
	if got := s.Serving(nil); got.Nodes != 1 || got.Revision != 3 {
		t.Errorf("Serving: %+v; want one node at revision 3", got)
	}
}

// TestAnAssignmentACKedAfterALaterResponseIsHeld: a delta response sends
// only what changed, so a node that ACKs two assignments responses in a
// row, the second sent before it ACKed the first, holds what both sent.
// The first ACK was taken for a stale one and dropped (only the last
// response was remembered), and the node was waited for, for good, for
// the assignment it had (make flake run 5: `traffic set --wait` waited 5
// minutes for one).
func TestAnAssignmentACKedAfterALaterResponseIsHeld(t *testing.T) {
	s, conn, _ := startServer(t)
	tc := servingCase{s}
	tc.publish(t, "127.0.0.1:9001", 5)
	c, _ := openSynced(t, s, conn)
	var sent []*discovery.DeltaDiscoveryResponse
	for _, name := range []string{"v1", "v2"} {
		if err := c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{name}}); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, c.next())
	}
	for _, resp := range sent {
		c.ack(resp)
	}
	testutil.WaitFor(t, 5*time.Second, "the node to serve v1 and v2 once it ACKed both responses", func() bool {
		return len(s.Serving([]string{"v1", "v2"}).Waiting) == 0
	})
}
