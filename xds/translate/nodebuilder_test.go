package translate

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// buildNode builds m with b, then node's own resources, checked versioned.
func buildNode(t *testing.T, b *Builder, m *meshspec.Model, node wire.ProxyNode) *NodeBuilt {
	t.Helper()
	if _, err := b.Build(lowerFor(t, m, true)); err != nil {
		t.Fatal(err)
	}
	own, err := b.ForNode(node)
	if err != nil {
		t.Fatal(err)
	}
	versioned(t, node.ID+"'s clusters", own.Clusters, (*cluster.Cluster).GetName, own.ClusterVersions())
	versioned(t, node.ID+"'s listeners", own.Listeners, (*listener.Listener).GetName, versionsOf(own.EncodedListeners))
	return own
}

// placeReplicas puts each replica j of each backend i of m on node
// n<node(i, j)>, its inbound listener 10.255.0.<node+1>:21000, as agents
// with mesh mTLS register them.
func placeReplicas(m *meshspec.Model, node func(i, j int) int) {
	for i := range m.Backends {
		for j := range m.Backends[i].Replicas {
			n := node(i, j)
			r := &m.Backends[i].Replicas[j]
			r.Node, r.Inbound = fmt.Sprintf("n%d", n), fmt.Sprintf("10.255.0.%d:21000", n+1)
		}
	}
}

// versionsOf are encoded's versions, by name.
func versionsOf(encoded []Encoded) map[string]string {
	out := make(map[string]string, len(encoded))
	for _, e := range encoded {
		out[e.Name] = e.Version
	}
	return out
}

// TestNodeRebuildsWhatAChangeTouches: a node's own parts follow what they
// depend on (nodebuilder.go). A replica more of a backend the node runs
// changes that backend's clusters there (their circuit breakers count
// replicas) and nothing else: the listeners keep their version and their
// pointers, the other clusters their versions. A backend's configuration
// rebuilds its inbound chain alone (the listener's version changes only
// if the chain does).
func TestNodeRebuildsWhatAChangeTouches(t *testing.T) {
	m := modelgen.Model(20, 3, 4)
	placeReplicas(m, func(i, j int) int { return (i + j) % 3 })
	b := NewBuilder(goldenMTLS)
	node := goldenMTLSNode
	node.ID = "n0"
	build := func(m *meshspec.Model) *NodeBuilt { return buildNode(t, b, m, node) }
	first := build(m)
	backend := m.Backends[0].Name // its first replica is on n0
	more := meshspec.Clone(m)
	extra := more.Backends[0].Replicas[0]
	extra.Address = "10.1.0.99:9000"
	more.Backends[0].Replicas = append(more.Backends[0].Replicas, extra)
	next := build(more)
	if next.ListenersVersion != first.ListenersVersion || !slices.Equal(next.Listeners, first.Listeners) {
		t.Errorf("a replica more rebuilt n0's listeners (version %s -> %s)", first.ListenersVersion, next.ListenersVersion)
	}
	if got, want := changedVersions(first.ClusterVersions(), next.ClusterVersions()), []string{wire.InboundClusterName(backend), backend}; !slices.Equal(got, want) {
		t.Errorf("a replica more of %s changed the versions of n0's clusters %v; want %v", backend, got, want)
	}

	config := meshspec.Clone(more)
	config.Backends[0].Config.MaxConcurrentQueries = 3
	last := build(config)
	picked := meshspec.Clone(config)
	picked.Backends[0].Config.LoadAware = &meshspec.LoadAware{}
	if got := changedVersions(versionsOf(last.EncodedListeners), versionsOf(build(picked).EncodedListeners)); !slices.Equal(got, []string{wire.InboundListener}) {
		t.Errorf("%s made load-aware (its inbound chain gets the picker) changed the versions of n0's listeners %v; want its inbound listener's alone", backend, got)
	}
	build(config)
	inbound := func(own *NodeBuilt) map[string]any {
		out := map[string]any{}
		for _, l := range own.Listeners {
			if l.GetName() == wire.InboundListener {
				for _, c := range l.GetFilterChains() {
					out[c.GetName()] = c
				}
			}
		}
		return out
	}
	// Each listener is versioned on its own: the public and mesh
	// listeners keep theirs (the inbound one changes if the chain's
	// content does; this configuration is not in it).
	if got := changedVersions(versionsOf(next.EncodedListeners), versionsOf(last.EncodedListeners)); slices.ContainsFunc(got, func(name string) bool { return name != wire.InboundListener }) {
		t.Errorf("%s's configuration changed the versions of n0's listeners %v; want its inbound listener's at most", backend, got)
	}
	before, after := inbound(next), inbound(last)
	if len(before) == 0 || len(before) != len(after) {
		t.Fatalf("n0's inbound chains: %d, then %d", len(before), len(after))
	}
	for name, c := range after {
		if rebuilt := c != before[name]; rebuilt != (name == wire.BackendSecret(backend)) {
			t.Errorf("after %s's configuration changed, n0's inbound chain %s rebuilt: %t", backend, name, rebuilt)
		}
	}
}

// TestNodeKeepsItsInboundClusterWhileItsReplicasHold: a replica more of a
// backend on another node changes the backend's shared cluster (its
// circuit breakers count replicas), so this node's view of it, but not
// this node's inbound cluster, whose breakers count its own replicas.
func TestNodeKeepsItsInboundClusterWhileItsReplicasHold(t *testing.T) {
	m := modelgen.Model(5, 3, 4)
	placeReplicas(m, func(_, j int) int { return j % 2 })
	b := NewBuilder(goldenMTLS)
	node := goldenMTLSNode
	node.ID = "n0"
	build := func(m *meshspec.Model) *NodeBuilt { return buildNode(t, b, m, node) }
	first := build(m)
	more := meshspec.Clone(m)
	extra := more.Backends[0].Replicas[1] // on n1
	extra.Address = "10.1.0.99:9000"
	more.Backends[0].Replicas = append(more.Backends[0].Replicas, extra)
	backend := m.Backends[0].Name
	next := build(more)
	if got, want := changedVersions(first.ClusterVersions(), next.ClusterVersions()), []string{backend}; !slices.Equal(got, want) {
		t.Errorf("a replica more of %s on n1 changed the versions of n0's clusters %v; want %v (its view alone)", backend, got, want)
	}
	named := func(own *NodeBuilt, name string) *cluster.Cluster {
		for _, c := range own.Clusters {
			if c.GetName() == name {
				return c
			}
		}
		t.Fatalf("n0 has no cluster %s", name)
		return nil
	}
	if inbound := wire.InboundClusterName(backend); named(first, inbound) != named(next, inbound) {
		t.Errorf("a replica more of %s on n1 rebuilt n0's inbound cluster of it", backend)
	}
}

// TestForNodesIsForNodeForEach: the nodes built at once, in parallel, get
// what each gets alone.
func TestForNodesIsForNodeForEach(t *testing.T) {
	m := modelgen.Model(30, 3, 7)
	var nodes []wire.ProxyNode
	for i := range 6 {
		n := goldenMTLSNode
		n.ID = fmt.Sprintf("n%d", i)
		nodes = append(nodes, n)
	}
	placeReplicas(m, func(i, j int) int { return (i + j) % 6 })
	dp := lowerFor(t, m, true)
	together, alone := NewBuilder(goldenMTLS), NewBuilder(goldenMTLS)
	for _, b := range []*Builder{together, alone} {
		if _, err := b.Build(dp); err != nil {
			t.Fatal(err)
		}
	}
	built, errs := together.ForNodes(nodes)
	for i, n := range nodes {
		want, err := alone.ForNode(n)
		if err != nil || errs[i] != nil {
			t.Fatalf("%s: %v, %v", n.ID, errs[i], err)
		}
		if built[i].ListenersVersion != want.ListenersVersion || built[i].ClustersVersion != want.ClustersVersion || len(built[i].Clusters) != len(want.Clusters) {
			t.Errorf("%s: built with the others: listeners %s, clusters %s (%d); alone: %s, %s (%d)", n.ID, built[i].ListenersVersion,
				built[i].ClustersVersion, len(built[i].Clusters), want.ListenersVersion, want.ClustersVersion, len(want.Clusters))
		}
	}
}

// TestNodesShareTheirInboundChains: nodes built at once share a backend's
// inbound chain where it is the same (sharedChains): not when one node
// keeps no access log, nor, when the mesh traces, between nodes, whose
// spans carry their names.
func TestNodesShareTheirInboundChains(t *testing.T) {
	m := modelgen.Model(4, 2, 3)
	placeReplicas(m, func(_, j int) int { return j })
	var nodes []wire.ProxyNode
	for i := range 3 {
		n := goldenMTLSNode
		n.ID, n.InboundAddress = fmt.Sprintf("n%d", i), fmt.Sprintf("10.255.0.%d", i+1)
		nodes = append(nodes, n)
	}
	nodes[2].NoAccessLog = true
	chainsOf := func(own *NodeBuilt) []*listener.FilterChain {
		i := slices.IndexFunc(own.Listeners, func(l *listener.Listener) bool { return l.GetName() == wire.InboundListener })
		if i < 0 {
			t.Fatal("no inbound listener")
		}
		return own.Listeners[i].GetFilterChains()
	}
	for _, traced := range []bool{false, true} {
		view := meshspec.Clone(m)
		if traced {
			view.Mesh = &meshspec.Mesh{Tracing: &meshspec.Tracing{Collector: "127.0.0.1:4317"}}
		}
		b := NewBuilder(goldenMTLS)
		if _, err := b.Build(lowerFor(t, view, true)); err != nil {
			t.Fatal(err)
		}
		built, errs := b.ForNodes(nodes)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s: %v", nodes[i].ID, err)
			}
		}
		n0, n1, n2 := chainsOf(built[0]), chainsOf(built[1]), chainsOf(built[2])
		if len(n0) == 0 || len(n0) != len(n1) || len(n0) != len(n2) {
			t.Fatalf("chains: %d, %d, %d", len(n0), len(n1), len(n2))
		}
		for k := range n0 {
			if shared := n0[k] == n1[k]; shared == traced {
				t.Errorf("traced %t: n0 and n1 share chain %s: %t", traced, n0[k].GetName(), shared)
			}
			if n0[k] == n2[k] {
				t.Errorf("traced %t: n2, without an access log, shares n0's chain %s", traced, n0[k].GetName())
			}
		}
	}
}

// TestNodeClustersAskOnlyForBuiltAssignments: a node whose clusters ask
// for an assignment the build does not have is refused, naming the
// cluster and the assignment, as the snapshot cache's Consistent would.
func TestNodeClustersAskOnlyForBuiltAssignments(t *testing.T) {
	m := modelgen.Model(2, 1, 2)
	placeReplicas(m, func(int, int) int { return 0 })
	node := goldenMTLSNode
	node.ID, node.InboundAddress = "n0", "10.255.0.1"
	b := NewBuilder(goldenMTLS)
	buildNode(t, b, m, node)
	view := wire.NodeViewAssignmentName(m.Backends[0].Name, "n0")
	if _, ok := b.assignments[view]; !ok {
		t.Fatalf("the build has no assignment %s", view)
	}
	delete(b.assignments, view)
	b.Cache().Clear(KindNodeParts) // built again, and checked
	if _, err := b.ForNode(node); err == nil || !strings.Contains(err.Error(), view) || !strings.Contains(err.Error(), "inconsistent") {
		t.Fatalf("a node asking for an assignment not built: %v", err)
	}
}

// TestAnEndpointsFeaturesLeaveTheListeners: a node's listeners do not
// change when an endpoint comes with a feature no endpoint used (a token
// quota, here): Envoy drains a changed listener, and its open connections
// kept the old filters until it closed them at the drain's end (the e2e
// engine test's quota counted nothing through a kept-alive connection,
// with --wait returned), long answers cut with them. The listener holds
// the filters every feature needs from the start.
func TestAnEndpointsFeaturesLeaveTheListeners(t *testing.T) {
	m := modelgen.Model(4, 2, 2)
	placeReplicas(m, func(i, j int) int { return j % 2 })
	for i := range m.Endpoints {
		m.Endpoints[i].RateLimit = nil
	}
	b := NewBuilder(goldenMTLS)
	node := goldenMTLSNode
	node.ID = "n0"
	before := buildNode(t, b, m, node)
	metered := meshspec.Clone(m)
	e := metered.Endpoints[0]
	e.Name, e.Route = "metered", e.Route+"/metered"
	e.RateLimit = &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: 60, Unit: "hour", Header: "x-tenant-id"}}
	metered.Endpoints = append(metered.Endpoints, e)
	after := buildNode(t, b, metered, node)
	if got := changedVersions(versionsOf(before.EncodedListeners), versionsOf(after.EncodedListeners)); len(got) != 0 {
		t.Fatalf("an endpoint with a token quota changed n0's listeners %v; want none", got)
	}
	var filters []string
	for _, l := range after.Listeners {
		if l.GetName() != wire.PublicListener {
			continue
		}
		for _, c := range l.GetFilterChains() {
			for _, f := range c.GetFilters() {
				var manager hcm.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&manager); err != nil {
					t.Fatal(err)
				}
				for _, h := range manager.GetHttpFilters() {
					filters = append(filters, h.GetName())
				}
			}
		}
	}
	if !slices.Contains(filters, usageReaderFilter) || !slices.Contains(filters, globalRateLimitOpenFilter) {
		t.Fatalf("n0's public listener: filters %v; want the usage reader and the global rate limit for the quota", filters)
	}
}
