package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/translate"
)

// TestCacheOffPublishesTheSame: a server with its caches on and one with
// them off (Options.CacheOff) give every node the same snapshot, type by
// type: the same version, the same resources at the same versions, the
// same bytes; through whole changes (every backend's replicas) and small
// ones (a traffic set, a replica's health, a backend's configuration),
// for nodes that run replicas, nodes that run none, a node that reaches
// some endpoints and a node without a public listener.
func TestCacheOffPublishesTheSame(t *testing.T) {
	var servers [2]*Server
	for i, off := range []bool{false, true} {
		servers[i] = New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CacheOff: off})
		if err := servers[i].RequireMTLS(&translate.MTLS{IdentityPrefix: "spiffe://td.consul/ns/default/dc/dc1/svc/"}); err != nil {
			t.Fatal(err)
		}
	}
	const nodes = 6 // n4 and n5 run no replica; n4 reaches two endpoints, n5 has no public listener
	for i := range nodes {
		n := wire.ProxyNode{ID: fmt.Sprintf("n%d", i), PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001,
			InboundAddress: fmt.Sprintf("10.255.0.%d", i+1), InboundPort: 21000}
		switch i {
		case 4:
			n.Reachable = []string{"ep-0", "ep-1"}
		case 5:
			n.PublicAddress, n.PublicPort = "", 0
		}
		for _, s := range servers {
			s.nodes[n.ID] = &nodeState{node: n, acked: map[string]string{}}
		}
	}
	view := modelgen.Model(20, 2, 3)
	onNodes(view, nodes-2)
	// Each step is one or more changes, each with what it touched (none
	// listed: the whole state), set one after the other and published
	// once: the server with its cache on gets each change's IR lowered
	// from the last where the change touched (ir.LowerDelta) and carrying
	// it, the one off the IR lowered whole.
	type change struct {
		apply               func(m *meshspec.Model)
		backends, endpoints []string
	}
	trafficSet := change{func(m *meshspec.Model) {
		keys := meshspec.SortedKeys(m.Endpoints[1].Traffic)
		m.Endpoints[1].Traffic = map[string]float64{keys[0]: 1}
	}, nil, []string{"ep-1"}}
	steps := []struct {
		what    string
		changes []change
	}{
		{"the first publish", []change{{apply: func(*meshspec.Model) {}}}},
		{"a traffic set", []change{trafficSet}},
		{"a replica's health", []change{{func(m *meshspec.Model) { m.Backends[2].Replicas[0].Health = meshspec.HealthUnhealthy }, []string{view.Backends[2].Name}, nil}}},
		{"a backend's configuration, then a replica's health, published once", []change{
			{func(m *meshspec.Model) { m.Backends[3].Config.MaxConcurrentQueries = 2 }, []string{view.Backends[3].Name}, nil},
			{func(m *meshspec.Model) { m.Backends[2].Replicas[0].Health = meshspec.HealthHealthy }, []string{view.Backends[2].Name}, nil},
		}},
		{"every backend's replicas", []change{{apply: func(m *meshspec.Model) {
			next := modelgen.Model(20, 2, 4)
			onNodes(next, nodes-2)
			*m = *next
		}}}},
		{"an endpoint removed", []change{{func(m *meshspec.Model) { m.Endpoints = slices.Delete(m.Endpoints, 0, 1) }, nil, []string{"ep-0"}}}},
	}
	var last *ir.DataPlane
	seq := uint64(0)
	for _, step := range steps {
		for _, c := range step.changes {
			next := meshspec.Clone(view)
			c.apply(next)
			if err := next.Validate(); err != nil {
				t.Fatalf("%s: %v", step.what, err)
			}
			view, seq = next, seq+1
			dp := lowered(t, view)
			if last != nil && (c.backends != nil || c.endpoints != nil) {
				d := &ir.Delta{Since: last.Seq}
				d.AddBackends(c.backends...)
				d.AddEndpoints(c.endpoints...)
				var err error
				if dp, err = ir.LowerDelta(last, view, nil, d, ir.Options{}); err != nil {
					t.Fatalf("%s: %v", step.what, err)
				}
			}
			dp.Seq, last = seq, dp
			if err := servers[0].SetDataPlane(dp); err != nil {
				t.Fatalf("%s: cache on: %v", step.what, err)
			}
			if err := servers[1].SetDataPlane(lowered(t, view)); err != nil {
				t.Fatalf("%s: cache off: %v", step.what, err)
			}
		}
		for _, s := range servers {
			s.publish(context.Background())
		}
		checkCacheViews(t, step.what, servers[0].CacheView(), servers[1].CacheView())
		for id := range servers[0].nodes {
			on, off := servers[0].nodes[id].set, servers[1].nodes[id].set
			if on == nil || off == nil {
				t.Fatalf("%s: node %s has no snapshot (on %v, off %v)", step.what, id, on != nil, off != nil)
			}
			for _, typ := range []string{resource.ListenerType, resource.RouteType, resource.ScopedRouteType, resource.ClusterType} {
				sameKind(t, fmt.Sprintf("%s: %s's %s", step.what, id, shortType(typ)), on[typ], off[typ])
			}
		}
	}
}

// checkCacheViews holds the debug views of a server with its cache on
// and one with it off to what each does: both hold an entry of every kind
// (off, they are what a change is compared with), and the one with it off
// never hit one; after the first publish, the one with it on has.
func checkCacheViews(t *testing.T, what string, on, off CacheView) {
	t.Helper()
	if !on.On || off.On {
		t.Fatalf("%s: the views say on %t and %t; want true and false", what, on.On, off.On)
	}
	kinds := []string{translate.KindBackendParts, translate.KindEndpointParts, translate.KindRouteTable, translate.KindNodeParts, KindSnapshotKinds}
	hits := map[bool]uint64{}
	for _, v := range []CacheView{on, off} {
		held := map[string]int{}
		for _, k := range v.Keys {
			held[k.Kind]++
		}
		for _, kind := range kinds {
			if held[kind] == 0 {
				t.Fatalf("%s: the view with the cache on=%t lists no entry of %s: %v", what, v.On, kind, held)
			}
		}
		for _, k := range v.Kinds {
			hits[v.On] += k.Hits
			if k.Entries != held[k.Kind] {
				t.Fatalf("%s: kind %s counts %d entries and lists %d keys", what, k.Kind, k.Entries, held[k.Kind])
			}
		}
	}
	if hits[false] != 0 {
		t.Fatalf("%s: the cache that is off hit %d times", what, hits[false])
	}
	if what != "the first publish" && hits[true] == 0 {
		t.Fatalf("%s: the cache that is on never hit", what)
	}
}

// sameKind fails unless two kinds hold the same version and resources,
// at the same versions, encoded alike.
func sameKind(t *testing.T, what string, a, b *kind) {
	t.Helper()
	if a.version != b.version || !maps.Equal(a.allVersions(), b.allVersions()) {
		t.Fatalf("%s: version %s and %d resources with the cache on, %s and %d with it off", what, a.version, len(a.allVersions()), b.version, len(b.allVersions()))
	}
	twins := b.allTwins()
	for name, x := range a.allTwins() {
		bx, err1 := proto.Marshal(x)
		by, err2 := proto.Marshal(twins[name])
		if err1 != nil || err2 != nil || !bytes.Equal(bx, by) {
			t.Fatalf("%s: %s is sent differently with the cache on and off (%v, %v)", what, name, err1, err2)
		}
	}
}
