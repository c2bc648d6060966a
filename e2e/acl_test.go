package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/internal/devconsul"
)

// aclToken creates a policy from deploy/consul/<file> (NODE replaced by the
// dev agent's node) and a token with it.
func aclToken(t *testing.T, admin *api.Client, name, file string) string {
	t.Helper()
	rules, err := os.ReadFile("../deploy/consul/" + file)
	if err != nil {
		t.Fatal(err)
	}
	policy, _, err := admin.ACL().PolicyCreate(&api.ACLPolicy{Name: name, Rules: strings.ReplaceAll(string(rules), "NODE", devconsul.NodeName)}, nil)
	if err != nil {
		t.Fatalf("policy %s: %v", name, err)
	}
	token, _, err := admin.ACL().TokenCreate(&api.ACLToken{Description: name, Policies: []*api.ACLTokenPolicyLink{{ID: policy.ID}}}, nil)
	if err != nil {
		t.Fatalf("token %s: %v", name, err)
	}
	return token.SecretID
}

// TestConsulACLs runs the controller and an agent on a Consul with ACLs on
// and default deny, each with its own token of the policies in
// deploy/consul: the mesh works, an agent's token cannot change the
// controller's state in KV nor register a service on another node.
func TestConsulACLs(t *testing.T) {
	consul, err := devconsul.StartWith(t.TempDir(), devconsul.Options{ManagementToken: "root-token-for-tests"})
	if err != nil {
		t.Fatalf("the real Consul is required: %v", err)
	}
	t.Cleanup(consul.Stop)
	admin, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	controllerToken := aclToken(t, admin, "servemesh-controller", "controller-policy.hcl")
	agentToken := aclToken(t, admin, "servemesh-agent", "agent-policy.hcl")

	// With mTLS: the policies also let each get its Connect identities.
	ctl := startController(t, consul, "ctl", []string{"--plaintext=false"}, "CONSUL_HTTP_TOKEN="+controllerToken)
	ctl.waitLeading(20 * time.Second)
	a := startAgentArgs(t, consul, "acl-node", "127.0.0.2", ctl.xdsAddr, 4, []string{"--plaintext=false", "--inbound", freeAddrOn(t, "127.0.0.2")},
		"CONSUL_HTTP_TOKEN="+agentToken)
	c := ctl.client("")
	ctx := context.Background()
	b := model.Backend{Name: "acl", Config: model.BackendConfig{NumReplicas: 1, CPUs: 1},
		Process: &model.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--backend", "acl", "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
	waitUntil(t, 20*time.Second, "the node to register and the backend to be placed", func() bool {
		_, err := c.CreateBackend(ctx, b)
		return err == nil
	})
	if _, err := c.CreateEndpoint(ctx, model.Endpoint{Name: "acl", Route: "/acl", Traffic: map[string]float64{"acl": 1}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the replica to serve through the agent's Envoy", func() bool {
		return do(httpClient(), "GET", "http://"+a.public+"/acl", "").status == 200
	})

	agentClient, err := api.NewClient(&api.Config{Address: consul.HTTPAddr, Token: agentToken})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agentClient.KV().Put(&api.KVPair{Key: "servemesh/backends/acl", Value: []byte("{}")}, nil); err == nil {
		t.Fatal("an agent's token changed the controller's state in KV")
	}
	if _, err := agentClient.Catalog().Register(&api.CatalogRegistration{Node: "another-node", Address: "127.0.0.9",
		Service: &api.AgentService{Service: "acl", Port: 1}}, nil); err == nil {
		t.Fatal("an agent's token registered a service on another node")
	}
	if _, _, err := agentClient.KV().Get("servemesh/meta", nil); err != nil {
		t.Fatalf("an agent's token cannot read the state: %v", err)
	}
}
