//go:build e2e

package e2e

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestNodeDrainUnderLoad: on the default mesh (mTLS, two nodes) under
// steady load, `servemesh node drain` moves a node's replicas to the other
// node, each replacement ready before the replica it replaces drains, with
// no request failed; status and node list show the node drained; a scale
// up then places nothing on it; uncordon lets it take replicas again.
func TestNodeDrainUnderLoad(t *testing.T) {
	t.Parallel()
	m := startTwoNodeMesh(t, "maint")
	ctx := context.Background()
	m.createBackends(t, meshspec.Backend{Name: "dr", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1}, Process: demoProcess("dr", false)})
	if _, err := m.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "dr", Route: "/dr", Traffic: map[string]float64{"dr": 1}}); err != nil {
		t.Fatal(err)
	}
	if on := runningOn(placements(t, m.c, "dr")); len(on) != 2 {
		t.Fatalf("placements %v", on)
	}
	waitReplicasAnswer(t, "both replicas to answer", "http://"+m.n1.public+"/dr", 2, 40)
	env := []string{"SERVEMESH_SERVER=" + m.ctl.apiAddr}
	l := startLoad("http://"+m.n1.public+"/dr", 4)
	if code, out, errOut := cli(t, env, "node", "drain", m.n2.id); code != 0 || !strings.Contains(out, "draining") {
		t.Fatalf("servemesh node drain %s: exit %d\n%s%s", m.n2.id, code, out, errOut)
	}
	testutil.WaitFor(t, 30*time.Second, "n2's replica to be replaced on n1 and gone", func() bool {
		ps := placements(t, m.c, "dr")
		on := runningOn(ps)
		return len(ps) == 2 && len(on) == 2 && !strings.Contains(strings.Join(meshspec.SortedKeys(invert(on)), ","), m.n2.id)
	})
	waitReplicasAnswer(t, "two replicas to answer after the drain", "http://"+m.n1.public+"/dr", 2, 40)
	time.Sleep(time.Second)
	l.finish(t)

	if _, out, _ := cli(t, env, "node", "list"); !strings.Contains(out, m.n2.id+"  drained") {
		t.Errorf("node list does not show %s drained:\n%s", m.n2.id, out)
	}
	if _, out, _ := cli(t, env, "status"); !strings.Contains(out, "drained") {
		t.Errorf("status does not show the drained node:\n%s", out)
	}
	// node describe: the drained node in full, and the replicas now on n1.
	if code, out, errOut := cli(t, env, "node", "describe", m.n2.id); code != 0 || !regexp.MustCompile(`Maintenance:\s+drained`).MatchString(out) ||
		!regexp.MustCompile(`Envoy:\s+connected true`).MatchString(out) || !strings.Contains(out, "no replica") {
		t.Errorf("node describe %s: exit %d\n%s%s", m.n2.id, code, out, errOut)
	}
	if code, out, errOut := cli(t, env, "node", "describe", m.n1.id); code != 0 || len(regexp.MustCompile(`(?m)^  dr\s+dr#`).FindAllString(out, -1)) != 2 {
		t.Errorf("node describe %s: exit %d\n%s%s; want dr's two replicas", m.n1.id, code, out, errOut)
	}
	if code, _, _ := cli(t, env, "backend", "update", "dr", "--num-replicas", "3"); code != 0 {
		t.Fatal("scale to 3")
	}
	for tag, node := range runningOn(placements(t, m.c, "dr")) {
		if node == m.n2.id {
			t.Fatalf("replica %s placed on the drained node", tag)
		}
	}
	if code, out, errOut := cli(t, env, "node", "uncordon", m.n2.id); code != 0 {
		t.Fatalf("uncordon: %d %s%s", code, out, errOut)
	}
	if code, _, _ := cli(t, env, "backend", "update", "dr", "--num-replicas", "4"); code != 0 {
		t.Fatal("scale to 4")
	}
	if got := invert(runningOn(placements(t, m.c, "dr"))); got[m.n2.id] == "" {
		t.Fatalf("after uncordon the new replica was not placed on %s: %v", m.n2.id, got)
	}
	if code, _, errOut := cli(t, env, "node", "drain", "no-such-node"); code == 0 || !strings.Contains(errOut, `no node "no-such-node" is registered`) {
		t.Fatalf("drain of an unknown node: exit %d: %s", code, errOut)
	}
}

// invert maps each node to one of its replicas.
func invert(on map[string]string) map[string]string {
	out := map[string]string{}
	for tag, node := range on {
		out[node] = tag
	}
	return out
}
