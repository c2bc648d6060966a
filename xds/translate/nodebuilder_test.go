package translate

import (
	"fmt"
	"slices"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestNodeRebuildsWhatAChangeTouches: a node's own parts follow what they
// depend on (nodebuilder.go). A replica more of a backend the node runs
// changes that backend's clusters there (their circuit breakers count
// replicas) and nothing else: the listeners keep their version and their
// pointers, the other clusters their versions. A backend's configuration
// rebuilds its inbound chain alone (the listener's version changes only
// if the chain does).
func TestNodeRebuildsWhatAChangeTouches(t *testing.T) {
	m := modelgen.Model(20, 3, 4)
	for i := range m.Backends {
		for j := range m.Backends[i].Replicas {
			r := &m.Backends[i].Replicas[j]
			r.Node, r.Inbound = fmt.Sprintf("n%d", (i+j)%3), fmt.Sprintf("10.255.0.%d:21000", (i+j)%3+1)
		}
	}
	b := NewBuilder(goldenMTLS)
	node := goldenMTLSNode
	node.ID = "n0"
	build := func(m *meshspec.Model) *NodeBuilt {
		t.Helper()
		if _, err := b.Build(lowerFor(t, m, true)); err != nil {
			t.Fatal(err)
		}
		own, err := b.ForNode(node)
		if err != nil {
			t.Fatal(err)
		}
		versioned(t, "n0's clusters", own.Clusters, (*cluster.Cluster).GetName, own.ClusterVersions)
		return own
	}
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
	if got, want := changedVersions(first.ClusterVersions, next.ClusterVersions), []string{wire.InboundClusterName(backend), backend}; !slices.Equal(got, want) {
		t.Errorf("a replica more of %s changed the versions of n0's clusters %v; want %v", backend, got, want)
	}

	config := meshspec.Clone(more)
	config.Backends[0].Config.MaxConcurrentQueries = 3
	last := build(config)
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
