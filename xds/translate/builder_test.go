package translate

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// sameAsShared fails unless b's Build of m is what Shared builds, resource
// for resource.
func sameAsShared(t *testing.T, b *Builder, view *meshspec.Model, mtls *MTLS) *Built {
	t.Helper()
	m := lowerFor(t, view, mtls != nil)
	got, err := b.Build(m)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Shared(m, mtls)
	if err != nil {
		t.Fatal(err)
	}
	equalLists(t, "routes", decoded[*route.RouteConfiguration](t, got.Routes), want.Routes)
	equalLists(t, "scoped routes", got.ScopedRoutes, want.ScopedRoutes)
	versioned(t, "routes", want.Routes, (*route.RouteConfiguration).GetName, routeVersions(got))
	for _, rc := range want.Routes {
		if name := rc.GetName(); !wire.IsPublicRouteName(name) && !slices.Equal(got.RouteClusters[name], RouteClusters(rc)) {
			t.Fatalf("%s sends to %v, Built says %v", name, RouteClusters(rc), got.RouteClusters[name])
		}
	}
	versioned(t, "scoped routes", got.ScopedRoutes, (*route.ScopedRouteConfiguration).GetName, got.ScopeVersions)
	versioned(t, "clusters", got.Clusters, (*cluster.Cluster).GetName, got.ClusterVersions)
	equalLists(t, "clusters", got.Clusters, want.Clusters)
	// Shared lists assignments sorted by name; a Build holds them by name.
	byName := slices.SortedFunc(maps.Values(got.Assignments), func(a, b Encoded) int { return strings.Compare(a.Name, b.Name) })
	equalLists(t, "assignments", decoded[*endpoint.ClusterLoadAssignment](t, byName), want.Assignments)
	for name, a := range got.Assignments {
		if a.Name != name {
			t.Fatalf("Assignments holds %q as %q", a.Name, name)
		}
	}
	for _, id := range []string{"node-1", "node-2", "n0", "n1", "n2"} {
		node := goldenMTLSNode
		node.ID = id
		if mtls == nil {
			node = goldenNode
		}
		own, err := b.ForNode(node)
		if err != nil {
			t.Fatal(err)
		}
		wantOwn, err := ForNode(m, node, mtls, ClustersByName(want.Clusters))
		if err != nil {
			t.Fatal(err)
		}
		equalLists(t, node.ID+"'s listeners", own.Listeners, wantOwn.Listeners)
		// As sent.
		equalLists(t, node.ID+"'s listeners as encoded", decoded[*listener.Listener](t, own.EncodedListeners), wantOwn.Listeners)
		equalLists(t, node.ID+"'s clusters", own.Clusters, wantOwn.Clusters)
		equalLists(t, node.ID+"'s clusters as encoded", decoded[*cluster.Cluster](t, own.EncodedClusters), wantOwn.Clusters)
		versioned(t, node.ID+"'s clusters", own.Clusters, (*cluster.Cluster).GetName, own.ClusterVersions())
	}
	return got
}

// decoded are the resources of encoded, each checked to be encoded
// under its own name.
func decoded[T proto.Message](t *testing.T, encoded []Encoded) []T {
	t.Helper()
	out := make([]T, len(encoded))
	for i, e := range encoded {
		var zero T
		m := zero.ProtoReflect().Type().New().Interface()
		if err := Decode(e, m); err != nil {
			t.Fatal(err)
		}
		out[i] = m.(T)
		if name := resourceName(out[i]); name != e.Name {
			t.Fatalf("%s %q is encoded under the name %q", proto.MessageName(m), name, e.Name)
		}
	}
	return out
}

func resourceName(m proto.Message) string {
	switch r := m.(type) {
	case *route.RouteConfiguration:
		return r.GetName()
	case *endpoint.ClusterLoadAssignment:
		return r.GetClusterName()
	case *cluster.Cluster:
		return r.GetName()
	case *listener.Listener:
		return r.GetName()
	}
	return ""
}

// routeVersions are the versions of b's route configurations, by name.
func routeVersions(b *Built) map[string]string {
	out := make(map[string]string, len(b.Routes))
	for _, e := range b.Routes {
		out[e.Name] = e.Version
	}
	return out
}

// versioned fails unless versions holds a version for every item, and no
// other.
func versioned[T any](t *testing.T, kind string, items []T, name func(T) string, versions map[string]string) {
	t.Helper()
	if len(versions) != len(items) {
		t.Fatalf("%s: %d versions for %d resources", kind, len(versions), len(items))
	}
	for _, x := range items {
		if versions[name(x)] == "" {
			t.Fatalf("%s: %s has no version", kind, name(x))
		}
	}
}

// changedVersions names the resources whose versions differ between two
// builds (added, removed or changed).
func changedVersions(before, after map[string]string) []string {
	var out []string
	for n, v := range after {
		if before[n] != v {
			out = append(out, n)
		}
	}
	for n := range before {
		if _, ok := after[n]; !ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func equalLists[T proto.Message](t *testing.T, kind string, got, want []T) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d, want %d", kind, len(got), len(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("%s[%d] differs:\n got %v\nwant %v", kind, i, got[i], want[i])
		}
	}
}

// goldenInputs are the golden models in dir.
func goldenInputs(t *testing.T, dir string) []*meshspec.Model {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	var out []*meshspec.Model
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m, err := parseView(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, m)
	}
	return out
}

// TestBuilderBuildsWhatSharedBuilds: for every golden model, and along a
// series of changes to a generated one (weights, replicas, health, a
// backend and an endpoint added and removed), the incremental builder's
// output is Shared's; what did not change keeps its pointer and its
// kind's version, what changed gets a new version.
func TestBuilderBuildsWhatSharedBuilds(t *testing.T) {
	for _, dir := range []struct {
		path string
		mtls *MTLS
	}{{"testdata/in", nil}, {"testdata/mtls/in", goldenMTLS}} {
		for _, m := range goldenInputs(t, dir.path) {
			sameAsShared(t, NewBuilder(dir.mtls), m, dir.mtls)
		}
	}
	for _, mtls := range []*MTLS{nil, goldenMTLS} {
		t.Run(fmt.Sprintf("mtls=%v", mtls != nil), func(t *testing.T) {
			m := modelgen.Model(20, 3, 4)
			if mtls != nil {
				placeReplicas(m, func(i, j int) int { return (i + j) % 3 })
			}
			b := NewBuilder(mtls)
			first := sameAsShared(t, b, m, mtls)
			last, lastAssignments := first, assignmentVersions(first)
			step := func(what string, change func(m *meshspec.Model)) *Built {
				next := meshspec.Clone(m)
				change(next)
				if err := next.Validate(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				m = next
				got := sameAsShared(t, b, m, mtls)
				declaredIsActual(t, what, last, lastAssignments, got)
				last, lastAssignments = got, assignmentVersions(got)
				return got
			}
			shift := step("a traffic set", func(m *meshspec.Model) {
				e := &m.Endpoints[3]
				keys := meshspec.SortedKeys(e.Traffic)
				e.Traffic = map[string]float64{keys[0]: 0.25, keys[1]: 0.75}
			})
			if shift.ClustersVersion != first.ClustersVersion || shift.RoutesVersion == first.RoutesVersion || &shift.Clusters[0] != &first.Clusters[0] {
				t.Fatalf("a traffic set: clusters %s -> %s (want the same list), routes %s -> %s (want a new version)",
					first.ClustersVersion, shift.ClustersVersion, first.RoutesVersion, shift.RoutesVersion)
			}
			// Delta xDS sends what changed version: the endpoint's mesh
			// routes and the public route configuration of its first
			// segment, not the other endpoints'; no scope (its key and
			// route configuration's name are the same), no cluster.
			mesh := wire.MeshRouteName(m.Endpoints[3].Name)
			public := wire.PublicRouteName(wire.PublicRouteKey(m.Endpoints[3].Route))
			if got := changedVersions(routeVersions(first), routeVersions(shift)); !slices.Equal(got, []string{mesh, public}) {
				t.Errorf("a traffic set changed the versions of routes %v; want %s and %s", got, mesh, public)
			}
			if got := changedVersions(first.ScopeVersions, shift.ScopeVersions); len(got) != 0 || shift.ScopesVersion != first.ScopesVersion {
				t.Errorf("a traffic set changed the versions of scopes %v (of the kind: %s -> %s); want none", got, first.ScopesVersion, shift.ScopesVersion)
			}
			scopeOf := func(b *Built) *route.ScopedRouteConfiguration {
				i := slices.IndexFunc(b.ScopedRoutes, func(sc *route.ScopedRouteConfiguration) bool { return sc.GetName() == mesh })
				return b.ScopedRoutes[i]
			}
			if scopeOf(shift) != scopeOf(first) {
				t.Error("a traffic set rebuilt the endpoint's scope: its encoding is not reused")
			}
			if got := changedVersions(first.ClusterVersions, shift.ClusterVersions); len(got) != 0 {
				t.Errorf("a traffic set changed the versions of clusters %v", got)
			}
			health := step("a replica's health", func(m *meshspec.Model) { m.Backends[5].Replicas[1].Health = meshspec.HealthUnhealthy })
			if health.RoutesVersion != shift.RoutesVersion || !health.ChangedBackends[m.Backends[5].Name] || len(health.ChangedBackends) != 1 {
				t.Fatalf("a health change: routes %s -> %s, changed %v", shift.RoutesVersion, health.RoutesVersion, health.ChangedBackends)
			}
			if health.Clusters[0] != shift.Clusters[0] {
				t.Fatal("an unchanged backend's cluster was rebuilt")
			}
			config := step("a backend's config", func(m *meshspec.Model) { m.Backends[7].Config.MaxConcurrentQueries = 3 })
			if got := changedVersions(health.ClusterVersions, config.ClusterVersions); !slices.Equal(got, []string{m.Backends[7].Name}) {
				t.Errorf("a backend's config changed the versions of clusters %v; want %s's alone", got, m.Backends[7].Name)
			}
			// A rebuilt backend's cluster reuses its last TLS socket
			// (reusedSockets) while its protocol holds, and only then.
			h2 := step("a backend speaks HTTP/2", func(m *meshspec.Model) { m.Backends[7].Protocol = meshspec.ProtocolHTTP2 })
			if mtls != nil {
				name := wire.ClusterName(m.Backends[7].Name)
				socketOf := func(b *Built) *core.TransportSocket {
					return b.Clusters[slices.IndexFunc(b.Clusters, func(c *cluster.Cluster) bool { return c.GetName() == name })].GetTransportSocket()
				}
				if socketOf(h2) == socketOf(config) {
					t.Error("a backend that now speaks HTTP/2 kept its HTTP/1 cluster's TLS socket")
				}
				again := step("the HTTP/2 backend's replica is unhealthy", func(m *meshspec.Model) { m.Backends[7].Replicas[0].Health = meshspec.HealthUnhealthy })
				if socketOf(again) != socketOf(h2) {
					t.Error("a rebuilt backend of the same protocol built its TLS socket again")
				}
			}
			step("a replica moves to another node", func(m *meshspec.Model) {
				r := &m.Backends[2].Replicas[0]
				for _, other := range m.Backends[2].Replicas[1:] {
					if other.Node != r.Node {
						r.Node, r.Inbound = other.Node, other.Inbound
						break
					}
				}
			})
			step("a new backend and endpoint", func(m *meshspec.Model) {
				m.Backends = append(m.Backends, meshspec.Backend{Name: "zz-new", Replicas: m.Backends[0].Replicas})
				m.Endpoints = append(m.Endpoints, meshspec.Endpoint{Name: "zz-new", Route: "/zz", Traffic: map[string]float64{"zz-new": 1}})
			})
			step("an endpoint and its backend removed", func(m *meshspec.Model) {
				m.Endpoints = m.Endpoints[:len(m.Endpoints)-1]
				m.Backends = m.Backends[:len(m.Backends)-1]
			})
		})
	}
}

// assignmentVersions are b's assignments' versions, by name, as they are
// now: b.Assignments is the builder's, which its next Build changes.
func assignmentVersions(b *Built) map[string]string {
	out := make(map[string]string, len(b.Assignments))
	for name, a := range b.Assignments {
		out[name] = a.Version
	}
	return out
}

// declaredIsActual fails unless the change set after declares is exactly
// what changed since before: every resource of each kind whose version
// changed, appeared or went, and nothing else.
func declaredIsActual(t *testing.T, what string, before *Built, beforeAssignments map[string]string, after *Built) {
	t.Helper()
	encoded := func(list []Encoded) map[string]string {
		out := map[string]string{}
		for _, e := range list {
			out[e.Name] = e.Version
		}
		return out
	}
	for _, k := range []struct {
		kind          ResourceKind
		before, after map[string]string
	}{
		{KindCluster, before.ClusterVersions, after.ClusterVersions},
		{KindAssignment, beforeAssignments, assignmentVersions(after)},
		{KindRoute, encoded(before.Routes), encoded(after.Routes)},
		{KindScopedRoute, before.ScopeVersions, after.ScopeVersions},
	} {
		if got, want := after.Changed.Names(k.kind), changedVersions(k.before, k.after); !slices.Equal(got, want) {
			t.Errorf("%s: the change set names %ss %v; what changed is %v", what, k.kind, got, want)
		}
	}
}
