//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	consulpolicy "github.com/servemesh/servemesh/deploy/consul"
	"github.com/servemesh/servemesh/dev/devconsul"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// aclToken mints a token with deploy/consul's policy name (NODE replaced
// by the dev agent's node) and the given identities.
func aclToken(t *testing.T, admin *api.Client, name string, r devconsul.TokenRequest) string {
	t.Helper()
	r.Description, r.Policy = name, name
	token, err := devconsul.MintToken(context.Background(), admin, r)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// controllerToken is the controller's token as deploy/consul/README.md
// makes it, for a controller whose Consul agent is consulNode.
func controllerToken(t *testing.T, admin *api.Client, consulNode string) string {
	t.Helper()
	return aclToken(t, admin, "servemesh-controller-"+consulNode, devconsul.TokenRequest{Rules: consulpolicy.ControllerPolicy(consulNode)})
}

// nodeToken is a node's token as deploy/consul/README.md makes it: the
// shared node policy, its Consul node's identity and its own service's.
func nodeToken(t *testing.T, admin *api.Client, id string) string {
	t.Helper()
	return nodeTokenOn(t, admin, devconsul.NodeName, id)
}

// nodeTokenOn is nodeToken for a node whose Consul agent is consulNode.
func nodeTokenOn(t *testing.T, admin *api.Client, consulNode, id string) string {
	t.Helper()
	return aclToken(t, admin, "servemesh-node", devconsul.TokenRequest{Rules: consulpolicy.NodePolicy(), ConsulNode: consulNode, Service: wire.NodeService(id)})
}

// TestConsulACLs runs the controller and two nodes on a Consul with ACLs
// on and default deny, each with its own token as deploy/consul says: the
// mesh works (the daemons check that Consul enforces ACLs), and one node's
// token can take neither the controller's identity nor another node's,
// claim another node, write the state or an external service; an instance
// it registers claiming another node's replica gets no traffic.
func TestConsulACLs(t *testing.T) {
	t.Parallel()
	consul, err := devconsul.StartWith(t.TempDir(), devconsul.Options{ManagementToken: "root-token-for-tests"})
	if err != nil {
		t.Fatalf("the real Consul is required: %v", err)
	}
	t.Cleanup(consul.Stop)
	admin, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctlToken := controllerToken(t, admin, devconsul.NodeName)
	tokens := map[string]string{"acl-1": nodeToken(t, admin, "acl-1"), "acl-2": nodeToken(t, admin, "acl-2")}

	// With mTLS, checking that Consul enforces ACLs: the policies also let
	// each get its Connect identities.
	ctl := startController(t, consul, "ctl", []string{"--insecure-consul=false"}, "CONSUL_HTTP_TOKEN="+ctlToken)
	ctl.waitLeading(20 * time.Second)
	var nodes []*agentProc
	var inbounds []string
	for i, id := range []string{"acl-1", "acl-2"} {
		addr := fmt.Sprintf("127.0.0.%d", i+2)
		inbounds = append(inbounds, freeAddrOn(t, addr))
		nodes = append(nodes, startAgentArgs(t, consul, id, addr, ctl.xdsAddr, 4,
			[]string{"--insecure-consul=false", "--inbound", inbounds[i]}, "CONSUL_HTTP_TOKEN="+tokens[id]))
	}
	c := ctl.client("")
	ctx := context.Background()
	b := meshspec.Backend{Name: "acl", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3},
		Process: &meshspec.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--backend", "acl", "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
	testutil.WaitFor(t, 20*time.Second, "both nodes to register and the backend to be placed", func() bool {
		_, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(b))
		return err == nil
	})
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "acl", Route: "/acl", Traffic: map[string]float64{"acl": 1}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the replicas to serve through the first node's Envoy", func() bool {
		return do(httpClient(), "GET", "http://"+nodes[0].public+"/acl", "").status == 200
	})

	one, err := api.NewClient(&api.Config{Address: consul.HTTPAddr, Token: tokens["acl-1"]})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("one node's token takes nothing of another's", func(t *testing.T) {
		if _, _, err := one.Agent().ConnectCALeaf(wire.NodeService("acl-1"), nil); err != nil {
			t.Fatalf("a node cannot get its own identity (the positive control): %v", err)
		}
		for _, service := range []string{wire.ControllerService, wire.NodeService("acl-2"), wire.NodeService("acl-3"), "legacy-api"} {
			if _, _, err := one.Agent().ConnectCALeaf(service, nil); err == nil {
				t.Errorf("node acl-1's token got the identity of %s", service)
			}
		}
		// Its agent's registration claims its own node only.
		fake := wire.NodeInfo{ID: "acl-2", Address: "127.0.0.2", CPUs: 64, MemoryMB: 1 << 20, Inbound: freeAddrOn(t, "127.0.0.2")}
		for _, name := range []string{wire.NodeService("acl-2"), wire.NodeService("acl-9"), wire.ControllerService, "legacy-api"} {
			if err := one.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "fake-" + name, Name: name, Tags: []string{wire.AgentTag},
				Address: fake.Address, Meta: fake.Meta()}); err == nil {
				t.Errorf("node acl-1's token registered service %s", name)
			}
		}
		if _, err := one.Catalog().Register(&api.CatalogRegistration{Node: "another-node", Address: "127.0.0.9",
			Service: &api.AgentService{Service: wire.BackendService("acl"), Port: 1}}, nil); err == nil {
			t.Error("node acl-1's token registered a service on another Consul node")
		}
		if _, err := one.KV().Put(&api.KVPair{Key: "servemesh/backends/acl", Value: []byte("{}")}, nil); err == nil {
			t.Error("node acl-1's token changed the controller's state in KV")
		}
		if _, _, err := one.KV().Get("servemesh/meta", nil); err != nil {
			t.Errorf("a node's token cannot read the state: %v", err)
		}
	})

	t.Run("an instance claiming another node's replica gets no traffic", func(t *testing.T) {
		// Node acl-1's token registers an instance of the backend's service
		// (which it may: it serves the backend too) claiming the replica
		// placed on acl-2, pointing at its own inbound listener and a
		// port of its choosing; its id sorts before the genuine one's, so
		// it is checked first.
		var onTwo meshspec.Placement
		for _, p := range placements(t, c, "acl") {
			if p.Node == "acl-2" {
				onTwo = p
			}
		}
		if onTwo.Tag == "" {
			t.Fatalf("no replica placed on acl-2: %+v", placements(t, c, "acl"))
		}
		trap := startReplicas(t, "trap", 1)
		host, port, _ := net.SplitHostPort(trap.addrs[0])
		p, _ := strconv.Atoi(port)
		if err := one.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "0-fake-replica", Name: wire.BackendService("acl"),
			Address: host, Port: p, Tags: []string{wire.ReplicaServiceTag, onTwo.Tag},
			Meta:  map[string]string{wire.MetaReplicaTag: onTwo.Tag, wire.MetaReplicaNode: "acl-2", wire.MetaReplicaInbound: inbounds[0]},
			Check: &api.AgentServiceCheck{CheckID: "0-fake-replica", TTL: "1h", Status: api.HealthPassing}}); err != nil {
			t.Fatalf("a node may register instances of a backend it serves: %v", err)
		}
		var lastStatus string
		defer func() {
			if t.Failed() {
				t.Logf("status:\n%s", lastStatus)
			}
		}()
		testutil.WaitFor(t, 15*time.Second, "status to report the fake instance", func() bool {
			_, out, errOut := cli(t, []string{"SERVEMESH_SERVER=" + ctl.apiAddr}, "status")
			lastStatus = out + errOut
			return strings.Contains(out, "0-fake-replica") && strings.Contains(out, "does not match")
		})
		counts := sendMany(t, "http://"+nodes[1].public+"/acl", 400)
		if counts["trap"] != 0 || trap.replicas[0].Served() != 0 {
			t.Fatalf("the fake instance got traffic: %v", counts)
		}
	})
}
