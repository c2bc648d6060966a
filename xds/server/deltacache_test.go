package server

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"

	"github.com/servemesh/servemesh/xds/translate"
)

// testKind is a kind of route configurations, each named and versioned
// as versions says; a route configuration's content names its version.
func testKind(t testing.TB, versions map[string]string) *kind {
	t.Helper()
	k := &kind{version: fmt.Sprint(len(versions), versions), twins: map[string]types.Resource{}, versions: versions}
	for name, v := range versions {
		twin, err := translate.Encode(&route.RouteConfiguration{Name: name, VirtualHosts: []*route.VirtualHost{{Name: v}}})
		if err != nil {
			t.Fatal(err)
		}
		k.twins[name] = twin
	}
	return k
}

// cacheClient is one delta stream of a node against a deltaCache, driven
// as go-control-plane's server drives a cache (its Subscription, the
// version map each answer hands it, a watch per request) and holding
// what an Envoy would.
type cacheClient struct {
	t     *testing.T
	c     *deltaCache
	sub   stream.Subscription
	ch    chan cachev3.DeltaResponse
	node  *core.Node
	nonce int
	has   map[string]string // what the client holds: name -> version
	sent  int               // resources received
	stop  func()
}

func newCacheClient(t *testing.T, c *deltaCache, subscribe []string) *cacheClient {
	return newNodeClient(t, c, "n1", subscribe)
}

// newNodeClient is a stream of node, its first request sent.
func newNodeClient(t *testing.T, c *deltaCache, node string, subscribe []string) *cacheClient {
	cl := &cacheClient{t: t, c: c, ch: make(chan cachev3.DeltaResponse, 8), node: &core.Node{Id: node}, has: map[string]string{}}
	cl.sub = stream.NewDeltaSubscription(subscribe, nil, nil, true)
	cl.request(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResourceNamesSubscribe: subscribe})
	return cl
}

// request sends req as the server would: the last watch cancelled, the
// subscription updated, a new watch.
func (cl *cacheClient) request(req *discovery.DeltaDiscoveryRequest) {
	cl.t.Helper()
	cl.drain()
	for _, name := range req.GetResourceNamesUnsubscribe() {
		delete(cl.has, name) // as Envoy drops what it unsubscribes from
	}
	if cl.stop != nil {
		cl.stop()
		cl.sub.UpdateResourceSubscriptions(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe())
	}
	req.Node = cl.node
	stop, err := cl.c.CreateDeltaWatch(req, cl.sub, cl.ch)
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.stop = func() {
		if stop != nil {
			stop()
		}
	}
}

// drain takes every answer waiting, applies it and ACKs it.
func (cl *cacheClient) drain() {
	cl.t.Helper()
	for {
		select {
		case resp := <-cl.ch:
			cl.apply(resp)
			cl.request(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResponseNonce: fmt.Sprint(cl.nonce)})
		default:
			return
		}
	}
}

func (cl *cacheClient) apply(resp cachev3.DeltaResponse) {
	cl.t.Helper()
	out, err := resp.GetDeltaDiscoveryResponse()
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.nonce++
	for _, r := range out.GetResources() {
		var rc route.RouteConfiguration
		if err := r.GetResource().UnmarshalTo(&rc); err != nil {
			cl.t.Fatal(err)
		}
		if rc.GetName() != r.GetName() || rc.GetVirtualHosts()[0].GetName() != r.GetVersion() {
			cl.t.Fatalf("resource %s version %s carries %s version %s", r.GetName(), r.GetVersion(), rc.GetName(), rc.GetVirtualHosts()[0].GetName())
		}
		if v, ok := cl.has[r.GetName()]; ok && v == r.GetVersion() {
			cl.t.Fatalf("resource %s sent again at the version the client holds, %s", r.GetName(), v)
		}
		cl.has[r.GetName()] = r.GetVersion()
		cl.sent++
	}
	for _, name := range out.GetRemovedResources() {
		if _, ok := cl.has[name]; !ok && !cl.sub.IsWildcard() {
			cl.t.Fatalf("removed %s, which the client does not hold", name)
		}
		delete(cl.has, name)
	}
	cl.sub.SetReturnedResources(resp.GetReturnedResources())
}

// wants is what the client must hold of k.
func (cl *cacheClient) wants(k *kind) map[string]string {
	want := map[string]string{}
	for name, v := range k.allVersions() {
		if _, ok := cl.sub.SubscribedResources()[name]; ok || cl.sub.IsWildcard() {
			want[name] = v
		}
	}
	return want
}

// TestDeltaCacheFollowsEveryKind drives a stream through random kinds,
// subscriptions and unsubscriptions: after each step it holds exactly
// what its subscription names of the node's kind, is never sent a
// resource it holds at that version, and is never told of removals of
// what it does not hold.
//
// Three subscriptions: names; the legacy wildcard (no names at first),
// which names given later add to; and "*", which stays wildcard alone
// until names are added, and is again once they are unsubscribed (the
// stream then holds all of a kind: see held).
//
// Layered, each kind lies over a shared one (kind.under) that changes now
// and then, as a node's clusters lie over the mesh's: its own resources
// hide the shared ones of their names.
func TestDeltaCacheFollowsEveryKind(t *testing.T) {
	for _, mode := range []string{"names", "legacy wildcard", "explicit wildcard"} {
		for _, layered := range []bool{false, true} {
			for seed := range uint64(20) {
				t.Run(fmt.Sprintf("%s/layered=%v/seed=%d", mode, layered, seed), func(t *testing.T) { followEveryKind(t, mode, layered, seed) })
			}
		}
	}
}

// layeredKind is a kind of own's resources over a kind of shared's.
func layeredKind(t testing.TB, shared *kind, own map[string]string) *kind {
	k := testKind(t, own)
	k.under = shared
	for name := range own {
		if _, ok := shared.versionOf(name); ok {
			k.hidden++
		}
	}
	k.version = shared.version + "-" + k.version
	return k
}

func followEveryKind(t *testing.T, mode string, layered bool, seed uint64) {
	rng := rand.New(rand.NewPCG(1, 2+seed))
	names := make([]string, 40)
	for i := range names {
		names[i] = fmt.Sprintf("r%02d", i)
	}
	c := newDeltaCache(resource.RouteType)
	var first []string
	switch mode {
	case "names":
		first = names[:10]
	case "explicit wildcard":
		first = []string{"*"}
	}
	byName := names // what requests subscribe to and unsubscribe from
	if mode != "names" {
		byName = names[:3] // so that unsubscribing empties the names now and then
	}
	cl := newCacheClient(t, c, first)
	versions := map[string]string{}
	shared := testKind(t, map[string]string{})
	holdingAll := 0 // steps after which the stream held all of the kind, by its marker
	for step := range 400 {
		switch op := rng.IntN(10); {
		case op < 6: // a new kind: some resources change, come or go
			if layered && rng.IntN(4) == 0 { // the shared kind changes
				sv := maps.Clone(shared.versions)
				sv[names[rng.IntN(len(names))]] = fmt.Sprint("s", step)
				if rng.IntN(3) == 0 {
					delete(sv, names[rng.IntN(len(names))])
				}
				shared = testKind(t, sv)
			}
			versions = maps.Clone(versions)
			for range 1 + rng.IntN(4) {
				name := names[rng.IntN(len(names))]
				if rng.IntN(4) == 0 {
					delete(versions, name)
				} else {
					versions[name] = fmt.Sprint("v", step)
				}
			}
			k := testKind(t, versions)
			if layered {
				k = layeredKind(t, shared, versions)
			}
			if err := c.set(context.Background(), "n1", k); err != nil {
				t.Fatal(err)
			}
		case op < 8:
			cl.request(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResourceNamesSubscribe: []string{byName[rng.IntN(len(byName))]}})
		default:
			cl.request(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResourceNamesUnsubscribe: []string{byName[rng.IntN(len(byName))]}})
		}
		cl.drain()
		k := c.nodes["n1"].kind
		if k == nil {
			continue
		}
		if want := cl.wants(k); !maps.Equal(cl.has, want) {
			t.Fatalf("step %d: the client holds %v, its subscription names %v of the kind", step, cl.has, want)
		}
		if h := c.nodes["n1"].held[cl.ch]; h != nil && isHeldAll(h.state) {
			holdingAll++
		}
	}
	t.Logf("%d resources sent; %d steps ended holding all of the kind", cl.sent, holdingAll)
	if mode != "names" && holdingAll == 0 {
		t.Error("the stream never held all of its kind by a marker: the shared path went untested")
	}
}

// TestDeltaCacheAnswersFromTheChange: once a stream holds a kind, a new
// kind sends it what changed alone, and its ACK compares nothing, from
// the diff shared by every node that held the same kind.
func TestDeltaCacheAnswersFromTheChange(t *testing.T) {
	c := newDeltaCache(resource.RouteType)
	versions := map[string]string{}
	for i := range 100 {
		versions[fmt.Sprintf("r%03d", i)] = "v1"
	}
	k1 := testKind(t, versions)
	clients := make([]*cacheClient, 3)
	for i := range clients {
		node := fmt.Sprintf("n%d", i)
		if err := c.set(context.Background(), node, k1); err != nil {
			t.Fatal(err)
		}
		cl := newNodeClient(t, c, node, slices.Sorted(maps.Keys(versions)))
		cl.drain()
		if len(cl.has) != 100 {
			t.Fatalf("%s holds %d resources, want 100", node, len(cl.has))
		}
		clients[i] = cl
	}
	next := maps.Clone(versions)
	next["r007"], next["r100"] = "v2", "v2"
	delete(next, "r050")
	k2 := testKind(t, next)
	for i, cl := range clients {
		before := cl.sent
		if err := c.set(context.Background(), fmt.Sprintf("n%d", i), k2); err != nil {
			t.Fatal(err)
		}
		cl.request(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResourceNamesSubscribe: []string{"r100"}})
		cl.drain()
		if got := cl.sent - before; got != 2 {
			t.Errorf("n%d was sent %d resources for a change of two", i, got)
		}
		if !maps.Equal(cl.has, next) {
			t.Errorf("n%d holds %v, want %v", i, cl.has, next)
		}
	}
	if len(k2.diffs) != 1 {
		t.Errorf("the new kind keeps %d diffs, want the one every node shares", len(k2.diffs))
	}
	// A third kind: the streams hold k2 and take the diff from it.
	third := maps.Clone(next)
	third["r001"] = "v3"
	k3 := testKind(t, third)
	for i, cl := range clients {
		before := cl.sent
		if err := c.set(context.Background(), fmt.Sprintf("n%d", i), k3); err != nil {
			t.Fatal(err)
		}
		cl.drain()
		if got := cl.sent - before; got != 1 {
			t.Errorf("n%d was sent %d resources for a change of one", i, got)
		}
		if h := c.nodes[fmt.Sprintf("n%d", i)].held[cl.ch]; h == nil || h.kind != k3 {
			t.Errorf("n%d: the cache does not know it holds the last kind", i)
		}
	}
}

// TestDeltaCacheAnswersAFirstWildcardRequest: Envoy waits for the first
// answer to a wildcard subscription, even an empty one.
func TestDeltaCacheAnswersAFirstWildcardRequest(t *testing.T) {
	c := newDeltaCache(resource.ScopedRouteType)
	if err := c.set(context.Background(), "n1", &kind{version: "empty"}); err != nil {
		t.Fatal(err)
	}
	sub := stream.NewDeltaSubscription(nil, nil, nil, true)
	ch := make(chan cachev3.DeltaResponse, 1)
	if _, err := c.CreateDeltaWatch(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "n1"}, TypeUrl: resource.ScopedRouteType}, sub, ch); err != nil {
		t.Fatal(err)
	}
	select {
	case resp := <-ch:
		if got := resp.GetResponseVersion(); got != "empty" {
			t.Errorf("answered version %q, want empty", got)
		}
	default:
		t.Fatal("a first wildcard request to an empty kind was not answered")
	}
}

// Streams subscribed to everything of a type and nothing by name hold
// their node's kind's own version map, shared, not a copy each; the
// server keeps a small marker as each one's state. A marker whose stream
// the cache forgot ends the stream (its node reconnects): what it holds is
// unknown.
func TestWildcardStreamsShareTheirKind(t *testing.T) {
	c := newDeltaCache(resource.RouteType)
	versions := map[string]string{}
	for i := range 1000 {
		versions[fmt.Sprintf("r%04d", i)] = "v1"
	}
	k1 := testKind(t, versions)
	next := maps.Clone(versions)
	next["r0001"] = "v2"
	delete(next, "r0002")
	k2 := testKind(t, next)
	var clients []*cacheClient
	for i := range 3 {
		node := fmt.Sprintf("n%d", i)
		if err := c.set(context.Background(), node, k1); err != nil {
			t.Fatal(err)
		}
		cl := newNodeClient(t, c, node, nil)
		cl.drain()
		clients = append(clients, cl)
	}
	for _, k := range []*kind{k1, k2} {
		for i, cl := range clients {
			node := fmt.Sprintf("n%d", i)
			if err := c.set(context.Background(), node, k); err != nil {
				t.Fatal(err)
			}
			cl.drain()
			h := c.nodes[node].held[cl.ch]
			if h == nil || !sameMap(h.returned, k.allVersions()) || !isHeldAll(h.state) || len(cl.sub.ReturnedResources()) != 1 {
				t.Fatalf("%s: does not hold the kind's own versions by a marker (held %+v)", node, h != nil)
			}
			if !maps.Equal(cl.has, k.allVersions()) {
				t.Fatalf("%s holds %d resources, want the kind's %d", node, len(cl.has), len(k.allVersions()))
			}
		}
	}
	forgotten := clients[0]
	delete(c.nodes["n0"].held, forgotten.ch)
	req := &discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResponseNonce: "x", Node: forgotten.node}
	if _, err := c.CreateDeltaWatch(req, forgotten.sub, forgotten.ch); err == nil {
		t.Fatal("a stream whose marker the cache forgot was answered")
	}
}
