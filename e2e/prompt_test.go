//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestPromptsReachTheReplicaHoldingTheirPrefix: on the default mesh (mTLS,
// two nodes), a backend of stand-in model servers with prefix caches,
// two replicas on each node, with load_aware.prompt_affinity and a
// session header. Requests of
// four long system prompts, each sent eight times with another question,
// alternately through either node: each prompt's requests reach one
// replica (the calling node hashes the prefix to a node, that node's
// picker picks the replica holding it), so after its first request the
// prompt is found in that replica's cache. Without affinity the calling
// nodes would split each prompt over both nodes, and each node's picker
// over its replicas by load. Then conversations naming themselves in
// x-session-id, with turns too short to hash, each stay on one replica.
func TestPromptsReachTheReplicaHoldingTheirPrefix(t *testing.T) {
	mesh := startTwoNodeMesh(t, "pfx")
	mesh.createBackends(t, meshspec.Backend{Name: "pa",
		Process: modelServer("pa", "--slots", "4", "--service", "2ms", "--cache-blocks", "8192", "--prefill-per-block", "1ms"),
		Config:  meshspec.BackendConfig{NumReplicas: 4, CPUs: 0.25, LoadAware: &meshspec.LoadAware{PromptAffinity: true, SessionHeader: "x-session-id"}}})
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "chat", Route: "/v1/chat/completions", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"pa": 1}}); err != nil {
		t.Fatal(err)
	}
	consulClient, _ := mesh.consul.Client()
	testutil.WaitFor(t, 60*time.Second, "four passing replicas of pa, and the mesh serving it", func() bool {
		e, _, _ := consulClient.Health().Service(wire.BackendService("pa"), "", true, nil)
		_, err := replicaOf(httpClient(), "http://"+mesh.n1.public+"/v1/chat/completions")
		return len(e) == 4 && err == nil
	})
	if nodes := runningOn(placements(t, mesh.c, "pa")); len(distinct(nodes)) != 2 {
		t.Fatalf("pa runs on %v, want both nodes", nodes)
	}
	client := httpClient()
	ask := func(node *mtlsNode, system, question string, header ...string) demoreplica.ModelAnswer {
		t.Helper()
		body := fmt.Sprintf(`{"model":"pa","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, question)
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+node.public+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if len(header) == 2 {
			req.Header.Set(header[0], header[1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var a demoreplica.ModelAnswer
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&a) != nil {
			t.Fatalf("status %d from %s", resp.StatusCode, node.id)
		}
		return a
	}
	blocks, cached := 0, 0
	for p := range 4 {
		system := strings.Repeat(fmt.Sprintf("Tenant %d's assistant answers in its house style. ", p), 60) // ~3 KB, 47 blocks
		by := map[string]int{}
		for i := range 8 {
			a := ask([]*mtlsNode{mesh.n1, mesh.n2}[i%2], system, fmt.Sprintf("question %d of prompt %d?", i, p))
			by[a.Replica]++
			if i > 0 {
				blocks, cached = blocks+a.Blocks, cached+a.Cached
			}
		}
		most := 0
		for _, n := range by {
			most = max(most, n)
		}
		if most < 7 {
			t.Errorf("prompt %d's requests, through both nodes, went to %v: want at least 7 of 8 on the replica holding its prefix", p, by)
		}
	}
	// A conversation names itself: its short turns (no prefix to hash)
	// stay on one replica, through either node.
	for c := range 3 {
		by := map[string]int{}
		for i := range 6 {
			a := ask([]*mtlsNode{mesh.n1, mesh.n2}[i%2], "Be brief.", fmt.Sprintf("turn %d", i), "x-session-id", fmt.Sprintf("conversation-%d", c))
			by[a.Replica]++
		}
		if len(by) != 1 {
			t.Errorf("conversation %d's turns went to %v, want one replica", c, by)
		}
	}
	if hit := float64(cached) / float64(max(blocks, 1)); hit < 0.95 {
		t.Errorf("after each prompt's first request, %d of %d prompt blocks were found cached (%.0f%%), want at least 95%%", cached, blocks, 100*hit)
	} else {
		t.Logf("after each prompt's first request, %d of %d prompt blocks were found cached (%.0f%%)", cached, blocks, 100*hit)
	}
}

// distinct are the values of m, each once.
func distinct(m map[string]string) map[string]bool {
	out := map[string]bool{}
	for _, v := range m {
		out[v] = true
	}
	return out
}
