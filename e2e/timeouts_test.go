//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/meshspec"
)

// TestEndpointTimeouts runs timeouts through the default data path, with a
// replica on each of two nodes so that requests cross the inbound hop: an
// endpoint without timeouts serves a request longer than Envoy's default of
// 15 s; one with timeout_s answers 504 when it runs out; a stalled stream
// ends at idle_timeout_s; and a try that runs out past per_try_timeout_s is
// retried for a GET and not for a POST.
func TestEndpointTimeouts(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "timeouts")
	n1, c, ctx := mesh.n1, mesh.c, context.Background()
	mesh.createBackends(t, meshspec.Backend{Name: "slow", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3}, // one per node: each offers 4 CPUs
		Process: demoProcess("slow", false)})
	for _, e := range []meshspec.Endpoint{
		{Name: "long", Route: "/long", Traffic: map[string]float64{"slow": 1}},
		{Name: "bounded", Route: "/bounded", Traffic: map[string]float64{"slow": 1}, TimeoutS: 1},
		{Name: "stalls", Route: "/stalls", Traffic: map[string]float64{"slow": 1}, IdleTimeoutS: 1},
		{Name: "tries", Route: "/tries", Methods: []string{"GET", "POST"}, Traffic: map[string]float64{"slow": 1}, TimeoutS: 10, PerTryTimeoutS: 0.5},
	} {
		if _, err := c.CreateEndpoint(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	base := "http://" + n1.public
	waitReplicasAnswer(t, "both replicas of slow to answer through n1", base+"/long", 2, 20)
	client := &http.Client{Timeout: 60 * time.Second}
	timed := func(method, path string) (int, time.Duration) {
		start := time.Now()
		r := do(client, method, base+path, "")
		if r.err != nil {
			t.Fatalf("%s %s: %v", method, path, r.err)
		}
		return r.status, time.Since(start)
	}

	t.Run("no timeout: 16 s answers, on either node", func(t *testing.T) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		replicas := map[string]bool{}
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := replicaOf(client, base+"/long?sleep_ms=16000")
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("a 16 s request failed: %v", err)
				}
				replicas[r] = true
			}()
		}
		wg.Wait()
		if len(replicas) != 2 {
			t.Errorf("the long requests reached %v; want both replicas, the other node's through its inbound listener", replicas)
		}
	})
	t.Run("timeout_s: 504 when it runs out", func(t *testing.T) {
		if status, took := timed("GET", "/bounded?sleep_ms=5000"); status != 504 || took > 3*time.Second {
			t.Errorf("GET /bounded sleeping 5 s with timeout_s 1: %d after %s; want 504 after about 1 s", status, took)
		}
		if status, _ := timed("GET", "/bounded?sleep_ms=100"); status != 200 {
			t.Errorf("GET /bounded within its timeout: %d", status)
		}
	})
	t.Run("idle_timeout_s: a stalled stream ends", func(t *testing.T) {
		if status, took := timed("GET", "/stalls?sleep_ms=5000"); status != 504 || took > 3*time.Second {
			t.Errorf("GET /stalls idle for 5 s with idle_timeout_s 1: %d after %s; want 504 after about 1 s", status, took)
		}
	})
	t.Run("per_try_timeout_s: a GET is tried again, a POST is not", func(t *testing.T) {
		stat := "cluster.slow.upstream_rq_per_try_timeout"
		admin := n1.admin
		before := envoyStat(t, admin, stat)
		if status, _ := timed("GET", "/tries?sleep_ms=3000"); status != 504 {
			t.Errorf("GET /tries: %d, want 504 once every try ran out", status)
		}
		afterGet := envoyStat(t, admin, stat)
		if status, _ := timed("POST", "/tries?sleep_ms=3000"); status != 504 {
			t.Errorf("POST /tries: %d, want 504", status)
		}
		afterPost := envoyStat(t, admin, stat)
		if tries := afterGet - before; tries < 2 {
			t.Errorf("the GET ran out %v times; want it tried again", tries)
		}
		if tries := afterPost - afterGet; tries != 1 {
			t.Errorf("the POST ran out %v times; want one try only (it reached the replica)", tries)
		}
	})
	if t.Failed() {
		out, _ := envoy.Admin{Socket: n1.admin}.Get(ctx, "/stats?filter="+strings.ReplaceAll("cluster.slow", ".", `\.`))
		t.Logf("n1's stats of slow:\n%s", out)
	}
}
