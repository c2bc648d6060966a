package catalog

import (
	"context"
	"sync"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// TestNodesAreTheirOwnServices: a node is listed from its agent's
// registration under the node's own service, which only that node's token
// may write; a registration that claims another node (any agent could
// register one under a shared service name before), or whose check fails,
// is left out, and so is a node whose id no agent may take: the second
// name every Consul service identity grants (issue 58, M7: a node's token
// registered servemesh-node-<id>-sidecar-proxy, a twin node that was
// given replicas).
func TestNodesAreTheirOwnServices(t *testing.T) {
	consul := testutil.MustStartConsul(t)
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	register := func(service, claimed, status string) {
		t.Helper()
		n := wire.NodeInfo{ID: claimed, Address: "127.0.0.2", CPUs: 4, MemoryMB: 1024, Inbound: "127.0.0.2:21000"}
		if err := client.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "servemesh-agent-" + service, Name: service,
			Tags: []string{wire.AgentTag}, Address: n.Address, Meta: n.Meta(),
			Check: &api.AgentServiceCheck{CheckID: "check-" + service, TTL: "1h", Status: status}}); err != nil {
			t.Fatal(err)
		}
	}
	register(wire.NodeService("n1"), "n1", api.HealthPassing)
	register(wire.NodeService("n2"), "n3", api.HealthPassing) // claims another node
	register(wire.NodeService("n4"), "n4", api.HealthCritical)
	register(wire.NodeService("n1-sidecar-proxy"), "n1-sidecar-proxy", api.HealthPassing) // n1's token may write it
	if err := client.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "other", Name: "other", Port: 1}); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		logged []string
	)
	nodes, err := Nodes(client, func(msg string, _ ...any) { // called by the node readers at once
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, msg)
	})(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].ID != "n1" || nodes[0].Inbound != "127.0.0.2:21000" || nodes[0].CPUs != 4 {
		t.Fatalf("nodes %+v, want n1 alone", nodes)
	}
	if len(logged) != 2 {
		t.Fatalf("logged %q, want the registrations that claim another node and a node id no agent may take", logged)
	}
}
