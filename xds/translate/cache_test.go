package translate

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestCacheOffSendsTheSame: a builder that reuses what it built and one
// that reuses nothing (Uncached, the off switch) send the same, byte for
// byte, version for version, change set for change set, for every golden
// input in turn (each a change from the last) and along a seeded series of
// random changes to a generated mesh, for the shared resources and each
// node's own.
func TestCacheOffSendsTheSame(t *testing.T) {
	for _, c := range []struct {
		name, golden string
		mtls         *MTLS
	}{{"plaintext", "testdata/in", nil}, {"mtls", "testdata/mtls/in", goldenMTLS}} {
		t.Run(c.name, func(t *testing.T) {
			on, off := NewBuilder(c.mtls), NewBuilder(c.mtls, Uncached())
			if !on.Cache().On() || off.Cache().On() {
				t.Fatalf("caches on: %v and %v, want true and false", on.Cache().On(), off.Cache().On())
			}
			nodes := cacheTestNodes(c.mtls)
			for i, m := range goldenInputs(t, c.golden) {
				sameOnAndOff(t, fmt.Sprintf("golden input %d", i), on, off, lowerFor(t, m, c.mtls != nil), nodes)
			}
			m := modelgen.Model(12, 6, 3)
			if c.mtls != nil {
				placeReplicas(m, func(i, j int) int { return (i + j) % 3 })
			}
			// The series carries each change's delta to the builder with
			// the cache on, which rebuilds only what it names, from an IR
			// lowered only where it names (ir.LowerDelta); the one off
			// compares the whole IR, lowered whole.
			rng := rand.New(rand.NewPCG(61, 7))
			dp := lowerFor(t, m, c.mtls != nil)
			dp.Seq = 1
			sameOnAndOff(t, "generated mesh", on, off, dp, nodes)
			applied := 0
			for step := range 60 {
				next := meshspec.Clone(m)
				what, touched := randomChange(rng, next)
				if err := next.Validate(); err != nil || what == "" {
					continue // a change the generator cannot make here; nothing applied
				}
				m, applied = next, applied+1
				what = fmt.Sprintf("step %d (%s)", step, what)
				dp = lowerDeltaLikeWhole(t, what, dp, m, touched, c.mtls != nil)
				sameOnAndOff(t, what, on, off, dp, nodes)
			}
			if applied < 40 {
				t.Fatalf("%d of 60 random changes applied; the series tests too little", applied)
			}
		})
	}
}

// cacheTestNodes are the nodes the golden and generated meshes place
// replicas on.
func cacheTestNodes(mtls *MTLS) []wire.ProxyNode {
	if mtls == nil {
		return []wire.ProxyNode{goldenNode}
	}
	var out []wire.ProxyNode
	for _, id := range []string{"node-1", "node-2", "n0", "n1", "n2"} {
		n := goldenMTLSNode
		n.ID = id
		out = append(out, n)
	}
	return out
}

// lowerDeltaLikeWhole is the IR of m after a change that touched what
// touched names, lowered from prev by ir.LowerDelta; the test fails
// unless it is the IR ir.Lower makes of m whole.
func lowerDeltaLikeWhole(t *testing.T, what string, prev *ir.DataPlane, m *meshspec.Model, touched *ir.Delta, mtls bool) *ir.DataPlane {
	t.Helper()
	touched.Since = prev.Seq
	state, replicas := split(m)
	got, err := ir.LowerDelta(prev, state, replicas, touched, ir.Options{MTLS: mtls})
	if err != nil {
		t.Fatalf("%s: lower the delta: %v", what, err)
	}
	got.Seq = prev.Seq + 1
	whole, want := *got, lowerFor(t, m, mtls)
	whole.Seq, whole.Changes = 0, nil
	if !reflect.DeepEqual(&whole, want) {
		t.Fatalf("%s: the IR lowered from the delta differs from the IR lowered whole:\n%s\nwant\n%s", what, marshalIR(t, &whole), marshalIR(t, want))
	}
	return got
}

// randomChange makes one change to m of the kinds users and health make,
// and names it and what it touched; "" if it made none.
func randomChange(rng *rand.Rand, m *meshspec.Model) (string, *ir.Delta) {
	what, backends, endpoints := randomChangeOf(rng, m)
	d := &ir.Delta{}
	d.AddBackends(backends...)
	d.AddEndpoints(endpoints...)
	return what, d
}

func randomChangeOf(rng *rand.Rand, m *meshspec.Model) (what string, backends, endpoints []string) {
	be := &m.Backends[rng.IntN(len(m.Backends))]
	switch rng.IntN(8) {
	case 0:
		e := &m.Endpoints[rng.IntN(len(m.Endpoints))]
		keys := meshspec.SortedKeys(e.Traffic)
		w := float64(rng.IntN(99)+1) / 100
		e.Traffic = map[string]float64{keys[0]: w}
		if len(keys) > 1 {
			e.Traffic[keys[1]] = 1 - w
		}
		return "traffic of " + e.Name, nil, []string{e.Name}
	case 1:
		if len(be.Replicas) == 0 {
			return "", nil, nil
		}
		r := &be.Replicas[rng.IntN(len(be.Replicas))]
		r.Health = []meshspec.Health{meshspec.HealthHealthy, meshspec.HealthUnhealthy}[rng.IntN(2)]
		return "health in " + be.Name, []string{be.Name}, nil
	case 2:
		be.Config.MaxConcurrentQueries = rng.IntN(8) + 1
		return "config of " + be.Name, []string{be.Name}, nil
	case 3:
		if len(be.Replicas) > 1 {
			be.Replicas = be.Replicas[:len(be.Replicas)-1]
			return "a replica less in " + be.Name, []string{be.Name}, nil
		}
		return "", nil, nil
	case 4:
		if len(be.Replicas) > 0 {
			r := be.Replicas[0]
			r.Address = fmt.Sprintf("127.0.0.9:%d", 20000+rng.IntN(1000))
			be.Replicas = append(be.Replicas, r)
			return "a replica more in " + be.Name, []string{be.Name}, nil
		}
		return "", nil, nil
	case 7:
		// The mesh routes' clusters change (the mirror's goes), the
		// routes stay where they are.
		e := &m.Endpoints[rng.IntN(len(m.Endpoints))]
		if len(e.Shadows) == 0 {
			return "", nil, nil
		}
		e.Shadows = nil
		return "shadows of " + e.Name, nil, []string{e.Name}
	case 5:
		name := fmt.Sprintf("added-%d", rng.IntN(1000))
		m.Backends = append(m.Backends, meshspec.Backend{Name: name, Replicas: slices.Clone(be.Replicas)})
		m.Endpoints = append(m.Endpoints, meshspec.Endpoint{Name: name, Route: "/" + name, Traffic: map[string]float64{name: 1}})
		return "added " + name, []string{name}, []string{name}
	default:
		for i, e := range m.Endpoints {
			if len(e.Traffic) == 1 && e.Traffic[e.Name] == 1 && slices.ContainsFunc(m.Backends, func(b meshspec.Backend) bool { return b.Name == e.Name }) {
				m.Endpoints = slices.Delete(m.Endpoints, i, i+1)
				m.Backends = slices.DeleteFunc(m.Backends, func(b meshspec.Backend) bool { return b.Name == e.Name })
				return "removed " + e.Name, []string{e.Name}, []string{e.Name}
			}
		}
		return "", nil, nil
	}
}

// sameOnAndOff builds m with both builders and fails unless what each
// would send is the same.
func sameOnAndOff(t *testing.T, what string, on, off *Builder, m *ir.DataPlane, nodes []wire.ProxyNode) {
	t.Helper()
	a, err := on.Build(m)
	if err != nil {
		t.Fatalf("%s: cache on: %v", what, err)
	}
	b, err := off.Build(m)
	if err != nil {
		t.Fatalf("%s: cache off: %v", what, err)
	}
	sameEncoded(t, what+": routes", a.Routes, b.Routes)
	sameEncoded(t, what+": clusters", a.EncodedClusters, b.EncodedClusters)
	equalLists(t, what+": scoped routes", a.ScopedRoutes, b.ScopedRoutes)
	sameEncoded(t, what+": assignments", sortedEncoded(a.Assignments), sortedEncoded(b.Assignments))
	for _, v := range [][3]string{
		{"routes", a.RoutesVersion, b.RoutesVersion},
		{"scoped routes", a.ScopesVersion, b.ScopesVersion},
		{"clusters", a.ClustersVersion, b.ClustersVersion},
	} {
		if v[1] != v[2] {
			t.Fatalf("%s: the %s' version is %s with the cache on, %s with it off", what, v[0], v[1], v[2])
		}
	}
	sameMap(t, what+": scope versions", a.ScopeVersions, b.ScopeVersions)
	if !maps.EqualFunc(a.RouteClusters, b.RouteClusters, slices.Equal) {
		t.Fatalf("%s: the mesh routes' clusters differ with the cache on and off", what)
	}
	sameMap(t, what+": cluster versions", a.ClusterVersions, b.ClusterVersions)
	for _, k := range []ResourceKind{KindCluster, KindAssignment, KindRoute, KindScopedRoute} {
		if x, y := a.Changed.Names(k), b.Changed.Names(k); !slices.Equal(x, y) {
			t.Fatalf("%s: the change set names %ss %v with the cache on, %v with it off", what, k, x, y)
		}
	}
	ownOn, errsOn := on.ForNodes(nodes)
	ownOff, errsOff := off.ForNodes(nodes)
	for i, n := range nodes {
		if (errsOn[i] == nil) != (errsOff[i] == nil) {
			t.Fatalf("%s: node %s: %v with the cache on, %v with it off", what, n.ID, errsOn[i], errsOff[i])
		}
		if errsOn[i] != nil {
			continue
		}
		x, y := ownOn[i], ownOff[i]
		sameEncoded(t, what+": "+n.ID+"'s listeners", x.EncodedListeners, y.EncodedListeners)
		sameEncoded(t, what+": "+n.ID+"'s clusters", x.EncodedClusters, y.EncodedClusters)
		if x.ListenersVersion != y.ListenersVersion || x.ClustersVersion != y.ClustersVersion {
			t.Fatalf("%s: %s's versions: %s, %s with the cache on, %s, %s with it off", what, n.ID,
				x.ListenersVersion, x.ClustersVersion, y.ListenersVersion, y.ClustersVersion)
		}
	}
}

func sortedEncoded(m map[string]Encoded) []Encoded {
	out := make([]Encoded, 0, len(m))
	for _, n := range sortedNames(m) {
		out = append(out, m[n])
	}
	return out
}

// sameEncoded fails unless two lists hold the same names, versions and
// bytes as sent, in the same order.
func sameEncoded(t *testing.T, what string, a, b []Encoded) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d with the cache on, %d with it off", what, len(a), len(b))
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Version != b[i].Version {
			t.Fatalf("%s[%d]: %s@%s with the cache on, %s@%s with it off", what, i, a[i].Name, a[i].Version, b[i].Name, b[i].Version)
		}
		x, err1 := proto.Marshal(a[i].Resource)
		y, err2 := proto.Marshal(b[i].Resource)
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
			t.Fatalf("%s[%d] %s: sent differently with the cache on and off (%v, %v)", what, i, a[i].Name, err1, err2)
		}
	}
}

func sameMap(t *testing.T, what string, a, b map[string]string) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d with the cache on, %d with it off", what, len(a), len(b))
	}
	for k, v := range a {
		if b[k] != v {
			t.Fatalf("%s: %s is %s with the cache on, %q with it off", what, k, v, b[k])
		}
	}
}
