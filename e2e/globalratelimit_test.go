//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/ratelimit"
	"github.com/servemesh/servemesh/internal/devredis"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestGlobalRateLimitsHoldAcrossNodes: on the default mesh (mTLS, two
// nodes, a replica on each), each node's agent runs the real rate limit
// service (Envoy's envoyproxy/ratelimit) over one real Redis. An endpoint
// limited to 20 requests a second globally, sent 80 a second through both
// nodes for 5 whole seconds, answers 20 a second across both (within
// 10%), not 20 on each; its refusals are 429s with Retry-After and the
// x-ratelimit-* headers, and each node's agent counts them. A limit per
// tenant header counts each tenant across both nodes. With Redis killed,
// an endpoint that fails open answers every request (each waiting for the service's error) and one that fails
// closed refuses them (503); with Redis back, the closed one answers
// again.
func TestGlobalRateLimitsHoldAcrossNodes(t *testing.T) {
	bin, err := ratelimit.Find("")
	if err != nil {
		t.Fatalf("the real rate limit service is required (`make tools` builds it): %v", err)
	}
	redisDir := t.TempDir()
	redis, err := devredis.Start(redisDir, 0, "e2e-redis-password")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { redis.Stop() }()
	passwordFile := filepath.Join(t.TempDir(), "redis-password")
	if err := os.WriteFile(passwordFile, []byte(redis.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mesh := startTwoNodeMeshWith(t, "grl", nil, []string{"--rate-limit-redis", redis.Addr,
		"--rate-limit-redis-password-file", passwordFile, "--rate-limit-service", bin})
	mesh.createBackends(t, meshspec.Backend{Name: "grl", Process: demoProcess("grl", false), Config: meshspec.BackendConfig{NumReplicas: 2}})
	env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr}
	for _, args := range [][]string{
		{"global", "--global-rate-limit", "20"},
		{"closed", "--global-rate-limit", "1000", "--global-rate-limit-failure-mode", "closed"},
		{"tenants", "--global-rate-limit", "6", "--global-rate-limit-unit", "hour", "--global-rate-limit-header", "x-tenant-id"},
	} {
		if code, _, errOut := cli(t, env, append([]string{"endpoint", "create", args[0], "--route", "/" + args[0], "--backend", "grl"}, args[1:]...)...); code != 0 {
			t.Fatalf("endpoint create %v: exit %d, %s", args, code, errOut)
		}
	}
	client := httpClient()
	get := func(node *mtlsNode, path, tenant string) (int, http.Header) {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+node.public+path, nil)
		if tenant != "" {
			req.Header.Set("x-tenant-id", tenant)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		testutil.WaitFor(t, 60*time.Second, "the limited endpoints to answer on "+n.id, func() bool {
			a, _ := get(n, "/global", "")
			b, _ := get(n, "/closed", "")
			return a == http.StatusOK && b == http.StatusOK
		})
	}

	// Each node's service reloads its configuration a moment after Envoy
	// has the routes: wait until both count.
	warmUp := 0
	testutil.WaitFor(t, 30*time.Second, "the nodes' rate limit services to count the limits", func() bool {
		counted := map[string]bool{}
		for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
			for range 25 {
				if status, _ := get(n, "/global", ""); status == http.StatusTooManyRequests {
					counted[n.id] = true
					break
				}
			}
			name := "warm-up-" + strconv.Itoa(warmUp)
			warmUp++
			for range 7 {
				if status, _ := get(n, "/tenants", name); status == http.StatusTooManyRequests {
					counted[n.id+"/tenants"] = true
					break
				}
			}
		}
		return len(counted) == 4
	})

	// 80 a second, alternating nodes, over 5 whole one-second windows
	// (the service counts in windows of the clock's seconds).
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 50*time.Millisecond)))
	var ok1, ok2, refused atomic.Int32
	var refusal atomic.Pointer[http.Header]
	atRate(80, 4900*time.Millisecond, func(i int) {
		node, ok := mesh.n1, &ok1
		if i%2 == 1 {
			node, ok = mesh.n2, &ok2
		}
		switch status, h := get(node, "/global", ""); status {
		case http.StatusOK:
			ok.Add(1)
		case http.StatusTooManyRequests:
			refused.Add(1)
			refusal.Store(&h)
		default:
			t.Errorf("through %s: status %d", node.id, status)
		}
	})
	answered := ok1.Load() + ok2.Load()
	t.Logf("20 a second globally, 80 a second through both nodes for 5 windows: %d answered (%d through %s, %d through %s), %d refused",
		answered, ok1.Load(), mesh.n1.id, ok2.Load(), mesh.n2.id, refused.Load())
	if answered < 90 || answered > 110 || ok1.Load() == 0 || ok2.Load() == 0 {
		t.Errorf("%d answered over 5 windows; want 100 (20 a second across both nodes) within 10%%, through both", answered)
	}
	if h := refusal.Load(); h == nil || h.Get("Retry-After") == "" || h.Get("X-RateLimit-Limit") == "" {
		t.Errorf("a refused request's headers %v: want Retry-After and X-RateLimit-Limit", h)
	}
	testutil.WaitFor(t, 20*time.Second, "each node's agent to count the global refusals", func() bool {
		v1, found1 := scrapeMetric(t, mesh.n1.metr, "servemesh_rate_limited_total", "endpoint", "global", "limit", "global")
		v2, found2 := scrapeMetric(t, mesh.n2.metr, "servemesh_rate_limited_total", "endpoint", "global", "limit", "global")
		return found1 && found2 && v1+v2 >= float64(refused.Load())*0.9 && v1 > 0 && v2 > 0
	})

	// A tenant's 6 an hour, across both nodes; another tenant its own.
	tenantA := 0
	for i := range 12 {
		if status, _ := get([]*mtlsNode{mesh.n1, mesh.n2}[i%2], "/tenants", "tenant-a"); status == http.StatusOK {
			tenantA++
		}
	}
	tenantB := 0
	for range 8 {
		if status, _ := get(mesh.n2, "/tenants", "tenant-b"); status == http.StatusOK {
			tenantB++
		}
	}
	if tenantA != 6 || tenantB != 6 {
		t.Errorf("tenant a's 12 through both nodes: %d answered; tenant b's 8 through one: %d; want 6 each (each tenant's count shared by the nodes)", tenantA, tenantB)
	}
	if code, out, _ := cli(t, env, "status"); code != 0 || !strings.Contains(out, "20/second") || !strings.Contains(out, "refuse (closed)") {
		t.Errorf("status: exit %d, want the global limits listed:\n%s", code, out)
	}

	// The limit's store down: each endpoint's failure mode holds.
	redis.Kill()
	testutil.WaitFor(t, 20*time.Second, "the closed endpoint to refuse while Redis is down", func() bool {
		status, _ := get(mesh.n1, "/closed", "")
		return status == http.StatusServiceUnavailable
	})
	openOK, closedRefused := 0, 0
	down := time.Now()
	for i := range 20 {
		node := []*mtlsNode{mesh.n1, mesh.n2}[i%2]
		if status, _ := get(node, "/global", ""); status == http.StatusOK {
			openOK++
		}
		if status, _ := get(node, "/closed", ""); status == http.StatusServiceUnavailable {
			closedRefused++
		}
	}
	t.Logf("Redis down: the open endpoint answered %d of 20, the closed one refused %d of 20; %v a request", openOK, closedRefused, time.Since(down)/40)
	if openOK != 20 || closedRefused != 20 {
		t.Errorf("Redis down: fail-open answered %d of 20 (want all, above its limit of 20 a second), fail-closed refused %d of 20 (want all)", openOK, closedRefused)
	}
	port := int(testutil.Port(redis.Addr))
	if redis, err = devredis.Start(redisDir, port, redis.Password); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the closed endpoint to answer with Redis back", func() bool {
		a, _ := get(mesh.n1, "/closed", "")
		b, _ := get(mesh.n2, "/closed", "")
		return a == http.StatusOK && b == http.StatusOK
	})
}
