package server

import (
	"maps"
	"slices"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/xds/translate"
)

// TestKindsSendTheResourcesAndEncodeOnce: what go-control-plane marshals
// from a kind is each resource (clusters byte for byte; route
// configurations, which the translation encodes, as themselves), and a
// kind built after a change holds new encodings only for the resources
// the builder rebuilt.
func TestKindsSendTheResourcesAndEncodeOnce(t *testing.T) {
	view := modelgen.Model(5, 3, 2)
	m := lowered(t, view)
	b := translate.NewBuilder(nil)
	first, err := b.Build(m)
	if err != nil {
		t.Fatal(err)
	}
	want, err := translate.Shared(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	routes1 := encodedKind(first.RoutesVersion, first.Routes)
	for _, r := range want.Routes {
		sent, err := proto.Marshal(routes1.twin(r.GetName()))
		var back route.RouteConfiguration
		if err != nil || proto.Unmarshal(sent, &back) != nil || !proto.Equal(&back, r) {
			t.Fatalf("route configuration %s is not sent as itself (%v)", r.GetName(), err)
		}
	}
	clusters1 := clustersKind(first)
	scopes1 := builtKind(first.ScopesVersion, first.ScopedRoutes, first.EncodedScopes)
	for _, sc := range want.ScopedRoutes {
		sent, err := proto.Marshal(scopes1.twin(sc.GetName()))
		var back route.ScopedRouteConfiguration
		if err != nil || proto.Unmarshal(sent, &back) != nil || !proto.Equal(&back, sc) {
			t.Fatalf("scope %s is not sent as itself (%v)", sc.GetName(), err)
		}
	}
	for _, c := range first.Clusters {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := proto.MarshalOptions{Deterministic: true}.Marshal(clusters1.twin(c.GetName()))
		var back cluster.Cluster
		if err != nil || string(got) != string(want) || proto.Unmarshal(got, &back) != nil || !proto.Equal(&back, c) {
			t.Fatalf("cluster %s is not sent as itself", c.GetName())
		}
	}

	changed := meshspec.Clone(view)
	changed.Endpoints[2].Traffic = map[string]float64{changed.Endpoints[2].Name + "-v0": 1}
	changed.Backends[4].Config.MaxConcurrentQueries = 3
	next := lowered(t, changed)
	second, err := b.Build(next)
	if err != nil {
		t.Fatal(err)
	}
	routes2 := encodedKind(second.RoutesVersion, second.Routes)
	clusters2 := clustersKind(second)
	scopes2 := builtKind(second.ScopesVersion, second.ScopedRoutes, second.EncodedScopes)
	if got := newlyEncoded(scopes1, scopes2); len(got) != 0 {
		t.Errorf("a traffic change re-encoded scopes %v; want none", got)
	}
	if got := newlyEncoded(routes1, routes2); len(got) != 2 { // the endpoint's mesh routes and the public table
		t.Errorf("a traffic change re-encoded route configurations %v; want the endpoint's mesh routes and the public table", got)
	}
	if got := newlyEncoded(clusters1, clusters2); len(got) != 1 || got[0] != changed.Backends[4].Name {
		t.Errorf("a backend's change re-encoded clusters %v; want %s's alone", got, changed.Backends[4].Name)
	}
}

// newlyEncoded names the resources of next whose encoding is not last's.
func newlyEncoded(last, next *kind) []string {
	var out []string
	for name, twin := range next.allTwins() {
		if last.twin(name) != twin {
			out = append(out, name)
		}
	}
	return out
}

// TestMergedClustersLieOverTheShared: a node's clusters with mTLS are the
// shared ones with its own in place of those of the same name, through
// every way a kind is read (delta's twin and versions, state of the
// world's resources, the translated clusters), and the shared kind is
// left as it was.
func TestMergedClustersLieOverTheShared(t *testing.T) {
	encoded := func(name, version string) (*cluster.Cluster, translate.Encoded) {
		c := &cluster.Cluster{Name: name, AltStatName: version}
		twin, err := translate.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		return c, translate.Encoded{Name: name, Version: version, Resource: twin}
	}
	shared := &kind{version: "s", twins: map[string]types.Resource{}, versions: map[string]string{}, sources: map[string]types.Resource{}}
	for _, name := range []string{"a", "b"} {
		c, e := encoded(name, "shared")
		shared.twins[name], shared.versions[name], shared.sources[name] = e.Resource, e.Version, c
	}
	own := &translate.NodeBuilt{ClustersVersion: "own"}
	for _, name := range []string{"b", "c"} {
		c, e := encoded(name, "own")
		own.Clusters, own.EncodedClusters = append(own.Clusters, c), append(own.EncodedClusters, e)
	}
	k := mergedClusters(shared, own)
	want := map[string]string{"a": "shared", "b": "own", "c": "own"}
	if !maps.Equal(k.allVersions(), want) || k.size() != 3 || len(k.versions) != 2 {
		t.Fatalf("versions %v (size %d, %d its own), want %v", k.allVersions(), k.size(), len(k.versions), want)
	}
	for name, version := range want {
		if v, ok := k.versionOf(name); !ok || v != version {
			t.Errorf("version of %s: %q; want %q", name, v, version)
		}
	}
	if v, ok := k.versionOf("d"); ok {
		t.Errorf("a cluster neither kind has has version %q", v)
	}
	if got := (snapshot{resource.ClusterType: k}).GetVersionMap(resource.ClusterType); !maps.Equal(got, want) {
		t.Errorf("the snapshot's version map: %v; want %v", got, want)
	}
	ttl, all := snapshot{resource.ClusterType: k}.GetResourcesAndTTL(resource.ClusterType), snapshot{resource.ClusterType: k}.GetResources(resource.ClusterType)
	if len(ttl) != 3 || len(all) != 3 {
		t.Fatalf("state of the world lists %d and %d resources, want 3", len(ttl), len(all))
	}
	for name, version := range want {
		src, ok := k.source(name)
		var c cluster.Cluster
		if err := proto.Unmarshal(encodingOf(k.twin(name)), &c); err != nil || !ok {
			t.Fatalf("%s: %v (source found: %v)", name, err, ok)
		}
		if c.GetAltStatName() != version || src.(*cluster.Cluster).GetAltStatName() != version ||
			all[name] != k.twin(name) || ttl[name].Resource != k.twin(name) {
			t.Errorf("%s: sent as %q's, translated as %q's; want %q's everywhere", name, c.GetAltStatName(), src.(*cluster.Cluster).GetAltStatName(), version)
		}
	}
	if _, ok := k.source("d"); ok || k.twin("d") != nil {
		t.Error("a cluster neither kind has is found")
	}
	if len(shared.versions) != 2 || shared.versions["b"] != "shared" || shared.size() != 2 {
		t.Errorf("the shared kind changed: %v", shared.versions)
	}
}

// TestKindsOverTheSameDiffByTheirOwn: the change between two kinds over
// the same shared one, found from their own resources alone (diffOwn), is
// the change between all their resources (diffVersions): an own resource
// added, changed or dropped, hiding a shared one or not.
func TestKindsOverTheSameDiffByTheirOwn(t *testing.T) {
	shared := &kind{versions: map[string]string{"a": "s", "b": "s", "c": "s"}}
	over := func(own map[string]string) *kind {
		k := &kind{under: shared, versions: own}
		for name := range own {
			if _, ok := shared.versions[name]; ok {
				k.hidden++
			}
		}
		return k
	}
	cases := []map[string]string{
		{}, {"b": "o1"}, {"b": "o2"}, {"b": "s"}, {"d": "o1"}, {"d": "o2", "b": "o1"}, {"c": "o1", "e": "o1"},
	}
	for _, from := range cases {
		for _, to := range cases {
			old, k := over(from), over(to)
			got, want := diffOwn(k, old), diffVersions(k.allVersions(), old.allVersions())
			for _, l := range [][]string{got.changed, got.removed, want.changed, want.removed} {
				slices.Sort(l)
			}
			if !slices.Equal(got.changed, want.changed) || !slices.Equal(got.removed, want.removed) {
				t.Errorf("%v -> %v: own diff %+v, whole diff %+v", from, to, got, want)
			}
			if d := k.diffFrom(old); d != k.diffFrom(old) {
				t.Error("a diff is not kept")
			}
			if k.size() != len(k.allVersions()) {
				t.Errorf("%v: size %d, %d versions", to, k.size(), len(k.allVersions()))
			}
		}
	}
}
