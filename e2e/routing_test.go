//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/translate"
)

// TestRequestRouting runs match rules and the sticky split through the
// default data path, with each backend's replicas on two nodes: requests
// with x-canary: true, or a beta=on cookie, go to the candidate; a user
// (x-user) stays on one backend, the same through either node, while users
// split by the weights; a weight change moves only the users whose share
// moved; requests without a key split at random.
func TestRequestRouting(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "routing")
	n1, n2, c, ctx := mesh.n1, mesh.n2, mesh.c, context.Background()
	for _, name := range []string{"stable", "candidate"} {
		mesh.createBackends(t, meshspec.Backend{Name: name, Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1}, Process: demoProcess(name, false)})
	}
	e := meshspec.Endpoint{Name: "model", Route: "/model", Traffic: map[string]float64{"stable": 0.8, "candidate": 0.2},
		Sticky: &meshspec.StickyKey{Header: "x-user"},
		Match:  []meshspec.RequestMatch{{Header: "x-canary", Exact: "true", Backend: "candidate"}, {Cookie: "beta", Exact: "on", Backend: "candidate"}}}
	if _, err := c.CreateEndpoint(ctx, e); err != nil {
		t.Fatal(err)
	}
	nodes := []string{"http://" + n1.public + "/model", "http://" + n2.public + "/model"}
	for _, url := range nodes {
		waitReplicasAnswer(t, "every replica to answer through "+url, url, 4, 40)
	}
	backendOf := func(url string, header ...string) string {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := httpClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s %v: %d", url, header, resp.StatusCode)
		}
		return resp.Header.Get(demoreplica.BackendHeader)
	}

	t.Run("match rules come before the split", func(t *testing.T) {
		for _, url := range nodes {
			for _, h := range [][]string{{"x-canary", "true"}, {"cookie", "a=1; beta=on; z=2"}, {"cookie", "beta=on"}} {
				for range 30 {
					if got := backendOf(url, h...); got != "candidate" {
						t.Fatalf("%s with %v went to %s, want the candidate", url, h, got)
					}
				}
			}
		}
		stable := 0
		for range 60 {
			if backendOf(nodes[0], "cookie", "beta=off; x=on") == "stable" {
				stable++
			}
		}
		if stable == 0 {
			t.Errorf("a cookie beta=off matched the rule beta=on: every request went to the candidate")
		}
	})

	const users = 200
	assign := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		for i := range users {
			user := fmt.Sprintf("user-%d", i)
			for j := range 4 { // twice through each node
				got := backendOf(nodes[j%2], "x-user", user)
				if prev, ok := out[user]; ok && prev != got {
					t.Fatalf("%s went to %s, then to %s (through %s)", user, prev, got, nodes[j%2])
				}
				out[user] = got
			}
		}
		return out
	}
	var before map[string]string
	t.Run("a user stays on one backend, through every node; users split by the weights", func(t *testing.T) {
		before = assign()
		candidates := 0
		for _, b := range before {
			if b == "candidate" {
				candidates++
			}
		}
		checkShare(t, "users on the candidate (weight 0.2)", candidates, users, 0.2)
	})
	t.Run("a weight change moves only the users whose share moved", func(t *testing.T) {
		if before == nil {
			t.Fatal("the sticky split failed: nothing to compare with")
		}
		if _, err := c.SetTraffic(ctx, "model", map[string]float64{"stable": 0.7, "candidate": 0.3}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 20*time.Second, "the new split to be served", func() bool {
			for i := range users {
				user := fmt.Sprintf("user-%d", i)
				if before[user] != backendOf(nodes[0], "x-user", user) {
					return true
				}
			}
			return false
		})
		waitInSync(t, mesh, n1.id) // both nodes follow
		waitInSync(t, mesh, n2.id)
		// The change translated the endpoint alone: the backends' parts
		// came from the one cache, on unless the suite runs with it off
		// (make e2e-cache-off).
		if view := xdsCacheView(t, mesh.ctl.apiAddr); view.On != !suiteCacheOff() || view.On && hitsOf(view, translate.KindBackendParts) == 0 {
			t.Fatalf("GET %s after a weight change: on %t, %+v; want on %t, and when on, hits of the backends' parts", api.XDSCachePath, view.On, view.Kinds, !suiteCacheOff())
		}
		after := assign()
		moved, back := 0, 0
		for user, b := range after {
			switch {
			case before[user] == "stable" && b == "candidate":
				moved++
			case before[user] == "candidate" && b == "stable":
				back++
			}
		}
		t.Logf("weights 0.8/0.2 to 0.7/0.3: %d of %d users moved to the candidate, %d moved back", moved, users, back)
		if back != 0 {
			t.Errorf("%d users moved from the candidate back to stable; only users whose share moved should move", back)
		}
		checkShare(t, "users moved to the candidate (the 0.1 that changed hands)", moved, users, 0.1)
	})
	t.Run("requests without a key split at random", func(t *testing.T) {
		candidates := 0
		const n = 400
		for i := range n {
			if backendOf(nodes[i%2]) == "candidate" {
				candidates++
			}
		}
		checkShare(t, "requests without a key on the candidate (weight 0.3)", candidates, n, 0.3)
	})
	t.Run("every request is in the access logs: the calling node's and the replica's node's", func(t *testing.T) {
		count := func(es []map[string]any, want map[string]string) int {
			n := 0
			for _, e := range es {
				match := true
				for k, v := range want {
					if fmt.Sprint(e[k]) != v {
						match = false
					}
				}
				if match && e["replica"] != nil && e["duration_ms"] != nil {
					n++
				}
			}
			return n
		}
		testutil.WaitFor(t, 10*time.Second, "the access logs to hold the requests", func() bool {
			onN1 := count(accessLog(t, n1), map[string]string{"listener": "public", "route": "model/match-0", "backend": "candidate", "status": "200"})
			onN2 := count(accessLog(t, n2), map[string]string{"listener": "inbound", "backend": "_inbound_candidate", "status": "200"})
			if onN1 < 30 || onN2 == 0 {
				es1, es2 := accessLog(t, n1), accessLog(t, n2)
				t.Logf("public model/match-0 candidate 200: %d; inbound: %d; a line of each: %v / %v", onN1, onN2, es1[len(es1)-1], es2[len(es2)-1])
			}
			return onN1 >= 30 && onN2 > 0
		})
	})
	t.Run("a mesh-only node reaching one endpoint holds its routes and clusters alone and follows changes", func(t *testing.T) {
		meshOnly(t, mesh)
	})
	t.Run("a node with clusters on demand fetches an endpoint's clusters on its first request", func(t *testing.T) {
		onDemand(t, mesh)
	})
	t.Run("a mesh-only node with clusters on demand fetches an endpoint's routes and clusters on its first request", func(t *testing.T) {
		meshOnlyOnDemand(t, mesh)
	})
}

// meshOnlyOnDemand starts a fifth node with --public none and --clusters
// on-demand: its Envoy starts with the mesh's scopes but none of their
// route configurations and none of the backends' clusters; the first
// request to model through its mesh listener waits while Envoy fetches
// model's routes, then its cluster, and answers; the node then holds
// model's routes and clusters and not unreached's, follows a change to
// model's traffic, and keeps what it fetched across a restart of the
// controller. An unknown host answers 404 at once.
func meshOnlyOnDemand(t *testing.T, mesh *twoNodeMesh) {
	n5 := startAgentArgs(t, mesh.consul, "routing-n5", "127.0.0.6", mesh.ctl.xdsAddr, 1, []string{"--public", "none", "--clusters", "on-demand"})
	holds := func(resource string, want map[string]bool) { t.Helper(); envoyHolds(t, n5, resource, want) }
	waitInSync(t, mesh, n5.id)
	model, unreached := wire.MeshRouteName("model"), wire.MeshRouteName("unreached")
	holds("dynamic_route_configs", map[string]bool{model: false, unreached: false})
	holds("dynamic_active_clusters", map[string]bool{"stable": false, "elsewhere": false})
	firstRequests(t, "http://"+n5.mesh+"/", "model", "the mesh-only on-demand node (its routes and cluster fetched on demand)")
	holds("dynamic_route_configs", map[string]bool{model: true, unreached: false})
	holds("dynamic_active_clusters", map[string]bool{"stable": true, "candidate": true, "elsewhere": false})
	quick := &http.Client{Timeout: 3 * time.Second}
	if r := do(quick, http.MethodGet, "http://"+n5.mesh+"/", "no-such-endpoint"); r.status != 404 {
		t.Errorf("a host no endpoint has, through the mesh-only on-demand node: %v, want 404 at once", r)
	}
	waitInSync(t, mesh, n5.id) // after its fetches
	// The routes it fetched follow a change, as any node's do.
	if _, err := mesh.c.SetTraffic(context.Background(), "model", map[string]float64{"candidate": 1}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "the mesh-only on-demand node to send model's requests to candidate", func() bool {
		return do(httpClient(), http.MethodGet, "http://"+n5.mesh+"/", "model").backend == "candidate"
	})
	if _, err := mesh.c.SetTraffic(context.Background(), "model", map[string]float64{"stable": 1}); err != nil {
		t.Fatal(err)
	}
	// A restarted controller learns what the node fetched from its Envoy,
	// which names it again on its new stream: the node keeps model's
	// routes and clusters, and serves it throughout.
	mesh.ctl.kill()
	time.Sleep(500 * time.Millisecond)
	mesh.ctl.start()
	mesh.ctl.waitLeading(20 * time.Second)
	waitInSync(t, mesh, n5.id)
	holds("dynamic_route_configs", map[string]bool{model: true})
	holds("dynamic_active_clusters", map[string]bool{"stable": true})
	testutil.WaitFor(t, 20*time.Second, "model to answer from stable through the node after the controller's restart", func() bool {
		return do(httpClient(), http.MethodGet, "http://"+n5.mesh+"/", "model").backend == "stable"
	})
}

// firstRequests sends model's first request through a node (url, with
// host), which must answer 200 from stable, logs how long it took, and
// then 20 more, which must answer 200.
func firstRequests(t *testing.T, url, host, through string) {
	t.Helper()
	start := time.Now()
	if r := do(httpClient(), http.MethodGet, url, host); r.status != 200 || r.backend != "stable" {
		t.Fatalf("the first request through %s: %v, want 200 from stable", through, r)
	}
	t.Logf("the first request to model through %s took %v", through, time.Since(start))
	for range 20 {
		if r := do(httpClient(), http.MethodGet, url, host); r.status != 200 {
			t.Fatalf("through %s, once it holds what it fetched: %v, want 200", through, r)
		}
	}
}

// envoyHolds checks, for each name in want, whether node's Envoy holds a
// resource of that name among its config dump's resource (such as
// dynamic_active_clusters).
func envoyHolds(t *testing.T, node *agentProc, resource string, want map[string]bool) {
	t.Helper()
	dump, err := envoy.Admin{Socket: node.admin}.Get(context.Background(), "/config_dump?resource="+resource)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range want {
		if strings.Contains(string(dump), `"name": "`+name+`"`) != want {
			t.Errorf("node %s's %s holds %s: %t, want %t", node.id, resource, name, !want, want)
		}
	}
}

// waitInSync waits until the controller reports node connected and in
// sync.
func waitInSync(t *testing.T, mesh *twoNodeMesh, node string) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "node "+node+" to be in sync", func() bool {
		for _, n := range nodesOf(mesh.ctl.apiAddr) {
			if n.ID == node {
				return n.Connected && n.InSync
			}
		}
		return false
	})
}

// onDemand starts a fourth node with --clusters on-demand: its Envoy
// starts with every route but none of the backends' clusters; the first
// request through its public listener to model waits while Envoy fetches
// the cluster its route chose, and then the node holds model's clusters
// (stable and candidate), not unreached's, until a request through its
// mesh listener fetches elsewhere too. Requests without a route answer
// 404 at once, as on any node.
func onDemand(t *testing.T, mesh *twoNodeMesh) {
	n4 := startAgentArgs(t, mesh.consul, "routing-n4", "127.0.0.5", mesh.ctl.xdsAddr, 1, []string{"--clusters", "on-demand"})
	holds := func(want map[string]bool) { t.Helper(); envoyHolds(t, n4, "dynamic_active_clusters", want) }
	waitInSync(t, mesh, n4.id)
	holds(map[string]bool{"stable": false, "candidate": false, "elsewhere": false})
	firstRequests(t, "http://"+n4.public+"/model", "", "the on-demand node (its cluster fetched on demand)")
	holds(map[string]bool{"stable": true, "candidate": true, "elsewhere": false})
	// A first request with a body (as a model server's are) waits, body
	// and all, for the cluster, then reaches the replica.
	post, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+n4.mesh+"/", strings.NewReader(`{"prompt": "hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	post.Host = "unreached"
	if r := doRequest(httpClient(), post); r.status != 200 || r.backend != "elsewhere" {
		t.Fatalf("the first request to unreached (a POST with a body) through the on-demand node's mesh listener: %v, want 200 from elsewhere", r)
	}
	holds(map[string]bool{"elsewhere": true})
	quick := &http.Client{Timeout: 3 * time.Second}
	if r := do(quick, http.MethodGet, "http://"+n4.mesh+"/", "no-such-endpoint"); r.status != 404 {
		t.Errorf("a host no endpoint has, through the on-demand node's mesh listener: %v, want 404 at once", r)
	}
	if r := do(quick, http.MethodGet, "http://"+n4.public+"/no-such-route", ""); r.status != 404 {
		t.Errorf("a path no endpoint routes, through the on-demand node's public listener: %v, want 404 at once", r)
	}
}

// meshOnly starts a third node with --public none and
// --reachable-endpoints model: its Envoy has no public listener and never
// holds the public route table, nor the routes or clusters of the endpoint
// it does not reach (which its mesh listener answers 404, while another
// node's serves it), yet its mesh listener reaches model's replicas on the
// other nodes (through their inbound listeners), and it is reported in sync
// after a traffic change, which re-sends the public table to the other
// nodes only.
func meshOnly(t *testing.T, mesh *twoNodeMesh) {
	ctx := context.Background()
	mesh.createBackends(t, meshspec.Backend{Name: "elsewhere", Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}, Process: demoProcess("elsewhere", false)})
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "unreached", Methods: []string{"GET", "POST"}, Traffic: map[string]float64{"elsewhere": 1}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "endpoint unreached to answer through n1's mesh listener", func() bool {
		return do(httpClient(), http.MethodGet, "http://"+mesh.n1.mesh+"/", "unreached").status == 200
	})
	n3 := startAgentArgs(t, mesh.consul, "routing-n3", "127.0.0.4", mesh.ctl.xdsAddr, 1, []string{"--public", "none", "--reachable-endpoints", "model"})
	// Its Envoy holds no public listener. (Dialling n3.public would not
	// show it: tests run side by side, and another's process may hold
	// that address and port by now.)
	testutil.WaitFor(t, 20*time.Second, "the mesh-only node's mesh listener", func() bool {
		return do(httpClient(), http.MethodGet, "http://"+n3.mesh+"/", "model").status == 200
	})
	envoyHolds(t, n3, "dynamic_listeners", map[string]bool{"mesh": true, "public": false})
	if _, err := mesh.c.SetTraffic(ctx, "model", map[string]float64{"stable": 1}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "every node, the mesh-only one included, to be in sync", func() bool {
		nodes := nodesOf(mesh.ctl.apiAddr)
		synced := 0
		for _, n := range nodes {
			if n.Connected && n.InSync {
				synced++
			}
		}
		return len(nodes) == 3 && synced == 3
	})
	for range 50 {
		r := do(httpClient(), http.MethodGet, "http://"+n3.mesh+"/", "model")
		if r.status != 200 || r.backend != "stable" {
			t.Fatalf("through the mesh-only node's mesh listener: %v, want 200 from stable", r)
		}
	}
	if r := do(httpClient(), http.MethodGet, "http://"+n3.mesh+"/", "unreached"); r.status != 404 {
		t.Fatalf("an endpoint the node does not reach, through its mesh listener: %v, want 404", r)
	}
	routes, err := envoy.Admin{Socket: n3.admin}.Get(ctx, "/config_dump?resource=dynamic_route_configs")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"mesh/model": true, "mesh/unreached": false} {
		if strings.Contains(string(routes), `"name": "`+name+`"`) != want {
			t.Errorf("the mesh-only node holds route configuration %s: %t, want %t", name, !want, want)
		}
	}
	if strings.Contains(string(routes), `"name": "`+wire.PublicRoutes+`/`) {
		t.Errorf("the mesh-only node holds a public route configuration (%s/...): %s", wire.PublicRoutes, routes)
	}
	clusters, err := envoy.Admin{Socket: n3.admin}.Get(ctx, "/config_dump?resource=dynamic_active_clusters")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"stable": true, "candidate": true, "elsewhere": false} {
		if strings.Contains(string(clusters), `"name": "`+name+`"`) != want {
			t.Errorf("the mesh-only node holds cluster %s: %t, want %t", name, !want, want)
		}
	}
	if t.Failed() {
		t.Logf("route configurations:\n%s", routes)
	}
}
