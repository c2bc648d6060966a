//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	xdsserver "github.com/servemesh/servemesh/xds/server"
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
	if view := xdsCacheView(t, mesh.ctl.apiAddr); view.On {
		t.Fatalf("GET %s says the cache is on: %+v", api.XDSCachePath, view)
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
	view := xdsCacheView(t, mesh.ctl.apiAddr)
	for _, k := range view.Kinds {
		if k.Hits != 0 {
			t.Fatalf("the cache is off, yet its kind %s hit %d times: %+v", k.Kind, k.Hits, view.Kinds)
		}
	}
	if len(view.Keys) == 0 {
		t.Fatalf("the cache holds no entry after five changes (off, it keeps what each change is compared with): %+v", view)
	}
}

// xdsCacheView reads the controller's debug view of the xDS cache.
func xdsCacheView(t *testing.T, apiAddr string) xdsserver.CacheView {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+apiAddr+api.XDSCachePath, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var view xdsserver.CacheView
	if err := json.NewDecoder(resp.Body).Decode(&view); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: HTTP %d, %v", api.XDSCachePath, resp.StatusCode, err)
	}
	return view
}

// hitsOf is how many lookups of kind hit in view; it fails the caller's
// check (0) when the kind is not listed.
func hitsOf(view xdsserver.CacheView, kind string) uint64 {
	for _, k := range view.Kinds {
		if k.Kind == kind {
			return k.Hits
		}
	}
	return 0
}

// suiteCacheOff says the suite runs with the xDS cache off
// (SERVEMESH_XDS_CACHE=off in its environment, which every controller it
// starts inherits: make e2e-cache-off).
func suiteCacheOff() bool { return os.Getenv("SERVEMESH_XDS_CACHE") == "off" }
