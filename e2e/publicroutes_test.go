//go:build e2e

package e2e

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestPublicRoutesByFirstSegment: the public listener matches each
// request in the scope of its first path segment, falling back to the
// root's routes, and answers as one table did (longest route first, sub-
// paths and queries, 405 with Allow, 404 once nothing matches, a client's
// own route key ignored), through real Envoys in the default mode with
// replicas on both nodes; a traffic set then changes, on a public node,
// the endpoint's mesh routes and the public ones of its first segment,
// and no other endpoint's.
func TestPublicRoutesByFirstSegment(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "publicroutes")
	n1, c, ctx := mesh.n1, mesh.c, context.Background()
	for _, name := range []string{"a", "b", "v2"} {
		mesh.createBackends(t, meshspec.Backend{Name: name, Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1}, Process: demoProcess(name, false)})
	}
	for _, e := range []meshspec.Endpoint{
		{Name: "root", Route: "/", Traffic: map[string]float64{"a": 1}},
		{Name: "api", Route: "/api", Methods: []string{"GET"}, Traffic: map[string]float64{"b": 1}},
		{Name: "api-v2", Route: "/api/v2", Traffic: map[string]float64{"v2": 1}},
		{Name: "other", Route: "/other", Methods: []string{"POST"}, Traffic: map[string]float64{"b": 1}},
	} {
		if _, err := c.CreateEndpoint(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	base := "http://" + n1.public
	waitReplicasAnswer(t, "api's replicas on both nodes through n1", base+"/api", 2, 40)

	type want struct {
		status        int
		backend, with string // with: the Allow header of a 405
	}
	check := func(t *testing.T, method, path string, w want, header ...string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		r := doRequest(httpClient(), req)
		if r.err != nil || r.status != w.status || r.backend != w.backend || r.allow != w.with {
			t.Errorf("%s %s %v: %v (allow %q); want %d from %q (allow %q)", method, path, header, r, r.allow, w.status, w.backend, w.with)
		}
	}
	t.Run("every request goes where one table sent it", func(t *testing.T) {
		for path, w := range map[string]want{
			"/api":           {200, "b", ""},
			"/api/":          {200, "b", ""},
			"/api/x?q=/y":    {200, "b", ""},
			"/api?q=1":       {200, "b", ""},
			"/api/v2":        {200, "v2", ""},
			"/api/v2/chat":   {200, "v2", ""},
			"/api/v20":       {200, "b", ""}, // "/api/v2" matches its own sub-paths alone
			"/apix":          {200, "a", ""}, // no scope of its own: the root's routes
			"/unknown/x?a=b": {200, "a", ""},
			"/":              {200, "a", ""},
			"/?x=1":          {200, "a", ""},
		} {
			check(t, http.MethodGet, path, w)
		}
		check(t, http.MethodPost, "/api/x", want{405, "", "GET"})
		check(t, http.MethodGet, "/other", want{405, "", "POST"})
		check(t, http.MethodPost, "/other/1", want{200, "b", ""})
		// A client cannot pick the scope its request is matched in.
		check(t, http.MethodGet, "/api", want{200, "b", ""}, wire.PublicRouteKeyHeader, "/other")
		check(t, http.MethodGet, "/nothing", want{200, "a", ""}, wire.PublicRouteKeyHeader, "/api")
	})

	t.Run("a traffic set changes its endpoint's routes alone", func(t *testing.T) {
		admin := envoy.Admin{Socket: n1.admin}
		before, err := admin.Versions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{wire.PublicRootKey, "api", "other"} {
			if before.Routes[wire.PublicRouteName(name)] == "" {
				t.Fatalf("n1 holds no public route configuration %s: %v", wire.PublicRouteName(name), before.Routes)
			}
		}
		if _, err := c.SetTraffic(ctx, "other", map[string]float64{"a": 1}); err != nil {
			t.Fatal(err)
		}
		var after envoy.ConfigVersions
		testutil.WaitFor(t, 20*time.Second, "n1 to get the change", func() bool {
			after, err = admin.Versions(ctx)
			return err == nil && after.Routes[wire.PublicRouteName("other")] != before.Routes[wire.PublicRouteName("other")]
		})
		for name, v := range before.Routes {
			changed := after.Routes[name] != v
			if want := name == wire.PublicRouteName("other") || name == wire.MeshRouteName("other"); changed != want {
				t.Errorf("route configuration %s changed: %t, want %t (versions %s -> %s)", name, changed, want, v, after.Routes[name])
			}
		}
		testutil.WaitFor(t, 20*time.Second, "POST /other to reach a", func() bool {
			return do(httpClient(), http.MethodPost, base+"/other", "").backend == "a"
		})
	})

	// Envoy makes a request's filters on the route it first matched: one
	// that falls back to the root's routes still meets the filters the
	// root's route turns on (here its rate limit), whatever it names.
	t.Run("a request that falls back meets the root's filters", func(t *testing.T) {
		if _, err := c.DeleteEndpoint(ctx, "root"); err != nil {
			t.Fatal(err)
		}
		limited := meshspec.Endpoint{Name: "root", Route: "/", Traffic: map[string]float64{"a": 1},
			RateLimit: &meshspec.RateLimit{Local: &meshspec.LocalRateLimit{RequestsPerSecond: 2}}}
		testutil.WaitFor(t, 20*time.Second, "the limited root endpoint to be created", func() bool {
			_, err := c.CreateEndpoint(ctx, limited)
			return err == nil
		})
		for _, path := range []string{"/unknown", "/apix?q", "/api-other/x"} {
			testutil.WaitFor(t, 20*time.Second, "GET "+path+" to be refused by the root's limit", func() bool {
				refused := 0
				for range 10 {
					if do(httpClient(), http.MethodGet, base+path, "").status == http.StatusTooManyRequests {
						refused++
					}
				}
				return refused >= 5 // 2 a second, sent within one: most are refused
			})
		}
		check(t, http.MethodGet, "/api/x", want{200, "b", ""}) // the limit is the root's alone
	})

	t.Run("without a root endpoint, what nothing matches gets 404", func(t *testing.T) {
		if _, err := c.DeleteEndpoint(ctx, "root"); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 20*time.Second, "the root endpoint to go", func() bool {
			return do(httpClient(), http.MethodGet, base+"/", "").status == 404
		})
		for _, path := range []string{"/apix", "/unknown", "/?x"} {
			check(t, http.MethodGet, path, want{404, "", ""})
		}
		check(t, http.MethodGet, "/api/v2/x", want{200, "v2", ""})
		// The 404 says what matched nothing (issue 40: its body was empty),
		// and nothing of the routes there are.
		if status, body := getBody(t, base+"/unknown/x?secret=1", ""); status != 404 || body != "servemesh: no endpoint serves GET "+n1.public+"/unknown/x\n" {
			t.Errorf("GET /unknown/x through the public listener: %d %q", status, body)
		}
		if status, body := getBody(t, "http://"+n1.mesh+"/x", "nosuch"); status != 404 ||
			body != "servemesh: no endpoint serves GET nosuch/x in the mesh (a request names its endpoint in its Host header)\n" {
			t.Errorf("GET nosuch/x through the mesh listener: %d %q", status, body)
		}
	})
}

// getBody GETs url (with host as its Host header, if given) and returns
// the status and the body.
func getBody(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
