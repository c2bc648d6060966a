//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestCacheOffFollowsEveryChange: with translation's cache off
// ($SERVEMESH_XDS_CACHE=off, each change translated whole), two nodes
// follow a mesh through the changes users make: an endpoint created, its
// traffic shifted, its route moved in place, a backend scaled, the
// endpoint deleted; each through either node, with the replicas on both.
func TestCacheOffFollowsEveryChange(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMeshWith(t, "cacheoff", nil, nil, "SERVEMESH_XDS_CACHE=off")
	c, ctx := mesh.c, context.Background()
	if !strings.Contains(mesh.ctl.stderr.String(), "translation's cache is off") {
		t.Fatalf("the controller did not take SERVEMESH_XDS_CACHE=off; its log:\n%s", mesh.ctl.stderr.String())
	}
	for _, name := range []string{"stable", "candidate"} {
		mesh.createBackends(t, meshspec.Backend{Name: name, Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.5}, Process: demoProcess(name, false)})
	}
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "model", Route: "/model", Traffic: map[string]float64{"stable": 1}}); err != nil {
		t.Fatal(err)
	}
	urls := []string{"http://" + mesh.n1.public + "/model", "http://" + mesh.n2.public + "/model"}
	for _, url := range urls {
		waitReplicasAnswer(t, "stable's replicas to answer through "+url, url, 2, 20)
	}
	if _, err := c.SetTraffic(ctx, "model", map[string]float64{"candidate": 1}); err != nil {
		t.Fatal(err)
	}
	waitNodesServe(t, c)
	for _, url := range urls {
		if counts := sendMany(t, url, 40); counts["candidate"] != 40 {
			t.Fatalf("after the shift to the candidate, %s answered from %v", url, counts)
		}
	}
	// Moved to another route in place (endpoint update).
	env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr}
	if code, out, errOut := cli(t, env, "endpoint", "update", "model", "--route", "/model2", "--wait"); code != 0 || !strings.Contains(out, "updated") {
		t.Fatalf("endpoint update --route: exit %d %s%s", code, out, errOut)
	}
	for i, url := range urls {
		moved := strings.Replace(url, "/model", "/model2", 1)
		if counts := sendMany(t, moved, 20); counts["candidate"] != 20 {
			t.Fatalf("after the route's move, %s answered from %v", moved, counts)
		}
		if r := do(httpClient(), "GET", url, ""); r.status != 404 {
			t.Fatalf("node %d still serves the old route: %+v", i+1, r)
		}
		urls[i] = moved
	}
	three := 3
	if _, err := c.UpdateBackend(ctx, "candidate", meshspec.BackendConfigPatch{NumReplicas: &three}); err != nil {
		t.Fatal(err)
	}
	for _, url := range urls {
		waitReplicasAnswer(t, "the candidate's three replicas to answer through "+url, url, 3, 30)
	}
	if _, err := c.DeleteEndpoint(ctx, "model"); err != nil {
		t.Fatal(err)
	}
	for _, url := range urls {
		testutil.WaitFor(t, 30*time.Second, url+" to answer 404 once the endpoint is gone", func() bool {
			return do(httpClient(), "GET", url, "").status == 404
		})
	}
}
