//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestLocalRateLimitsHoldOnEachNode: on the default mesh (mTLS, two
// nodes, a replica on each), an endpoint limited to 5 requests a second
// per tenant (rate_limit.local, header x-tenant-id): a tenant's burst of
// 30 through one node gets 5 answers and 25 429s with Retry-After and
// the x-ratelimit-* headers, while another tenant on that node still gets
// its 5, and the first tenant on the other node its own 5 (each node
// keeps its buckets). Sustained at 20 a second for 3 seconds, a tenant
// gets about 5 a second through a node (the burst and a refill a second).
// Each node's Envoy counts the requests it refused.
func TestLocalRateLimitsHoldOnEachNode(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "rl")
	mesh.createBackends(t, meshspec.Backend{Name: "rl", Process: demoProcess("rl", false), Config: meshspec.BackendConfig{NumReplicas: 2}})
	// Through the CLI: a header clients cannot send is refused, naming
	// the field; then the limit is created.
	env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr}
	if code, _, errOut := cli(t, env, "endpoint", "create", "limited", "--route", "/limited", "--backend", "rl",
		"--rate-limit", "5", "--rate-limit-header", "x-servemesh-priority"); code == 0 || !strings.Contains(errOut, "rate_limit.local.header") {
		t.Fatalf("a reserved header: exit %d, %s", code, errOut)
	}
	if code, _, errOut := cli(t, env, "endpoint", "create", "limited", "--route", "/limited", "--backend", "rl",
		"--rate-limit", "5", "--rate-limit-header", "x-tenant-id"); code != 0 {
		t.Fatalf("endpoint create --rate-limit: exit %d, %s", code, errOut)
	}
	if e, err := mesh.c.GetEndpoint(context.Background(), "limited"); err != nil || e.RateLimit == nil || *e.RateLimit.Local != (meshspec.LocalRateLimit{RequestsPerSecond: 5, Header: "x-tenant-id"}) {
		t.Fatalf("the endpoint stored %+v (%v)", e.RateLimit, err)
	}
	client := httpClient()
	get := func(node *mtlsNode, tenant string) (int, http.Header) {
		t.Helper()
		return getAsTenant(t, client, node, "/limited", tenant)
	}
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		testutil.WaitFor(t, 60*time.Second, "the limited endpoint to answer on "+n.id, func() bool {
			status, _ := get(n, "warm-up-"+strconv.FormatInt(time.Now().UnixNano(), 10))
			return status == http.StatusOK
		})
	}
	time.Sleep(1100 * time.Millisecond) // a refill: every bucket full
	burst := func(node *mtlsNode, tenant string, n int) (ok, limited int, last http.Header) {
		for range n {
			status, h := get(node, tenant)
			switch status {
			case http.StatusOK:
				ok++
			case http.StatusTooManyRequests:
				limited, last = limited+1, h
			default:
				t.Fatalf("tenant %s through %s: status %d", tenant, node.id, status)
			}
		}
		return ok, limited, last
	}
	// Each tenant's bucket starts full: its first 5 are answered however
	// long the burst takes; beyond them, refills that land in the burst.
	start := time.Now()
	okA1, limitedA1, refused := burst(mesh.n1, "tenant-a", 30)
	tookA1 := time.Since(start)
	okB1, _, _ := burst(mesh.n1, "tenant-b", 10)
	okA2, _, _ := burst(mesh.n2, "tenant-a", 10)
	if most := answeredAtMost(5, tookA1); okA1 < 5 || okA1 > most || limitedA1 == 0 {
		t.Errorf("tenant a's 30 through %s in %s: %d answered, %d refused; want 5 answered (at most %d with the refills in that time), the rest refused",
			mesh.n1.id, tookA1.Round(time.Millisecond), okA1, limitedA1, most)
	}
	if okB1 < 5 || okA2 < 5 {
		t.Errorf("tenant b through %s got %d of 10, tenant a through %s %d of 10: want each its own 5", mesh.n1.id, okB1, mesh.n2.id, okA2)
	}
	if refused.Get("Retry-After") == "" || refused.Get("X-RateLimit-Limit") == "" {
		t.Fatalf("a refused request's headers %v: want Retry-After and X-RateLimit-Limit", refused)
	}
	// Sustained: 20 a second for 3 s through n1, tenant c: its burst of 5
	// and 5 a refill, 3 or 4 refills in the window.
	var okC atomic.Int32
	startC := time.Now()
	atRate(20, 3*time.Second, func(int) {
		if status, _ := get(mesh.n1, "tenant-c"); status == http.StatusOK {
			okC.Add(1)
		}
	})
	tookC := time.Since(startC)
	t.Logf("tenant a through %s: %d answered, %d refused in %s; tenant b %d of 10; tenant a through %s %d of 10; tenant c at 20/s for %s: %d answered",
		mesh.n1.id, okA1, limitedA1, tookA1.Round(time.Millisecond), okB1, mesh.n2.id, okA2, tookC.Round(time.Millisecond), okC.Load())
	// At least the burst and one refill (the requests span three fill
	// intervals); at most the burst and every refill in the time taken.
	if c, most := int(okC.Load()), answeredAtMost(5, tookC); c < 10 || c > most {
		t.Errorf("tenant c at 20 a second for %s: %d answered, want 10 to %d (a burst of 5, then 5 a second)", tookC.Round(time.Millisecond), c, most)
	}
	if n := envoyStat(t, mesh.n1.admin, "servemesh_rate_limit.limited.http_local_rate_limit.rate_limited"); n < float64(limitedA1) {
		t.Errorf("%s's Envoy counted %v requests refused, want at least tenant a's %d", mesh.n1.id, n, limitedA1)
	}
	if n := metricValue(t, mesh.n1.metr, "servemesh_rate_limited_total", "endpoint", "limited"); n < float64(limitedA1) {
		t.Errorf("%s's agent reports %v requests refused, want at least tenant a's %d", mesh.n1.id, n, limitedA1)
	}
}

// getAsTenant GETs path from node's public listener with x-tenant-id set to
// tenant (none if empty): its status and headers.
func getAsTenant(t *testing.T, client *http.Client, node *mtlsNode, path, tenant string) (int, http.Header) {
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

// answeredAtMost is the most requests a full token bucket of size tokens,
// refilled to size every second, answers over a window of took: its
// tokens, and a refill at each fill instant inside the window (the
// instants are Envoy's, not aligned with the window: up to one more than
// the whole seconds in it).
func answeredAtMost(size int, took time.Duration) int {
	return size * (2 + int(took/time.Second))
}
