//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestRetriesAndOutliers runs retry settings and outlier detection through
// the default data path, with three replicas per backend over two nodes:
// one replica answers 503 to every request; an endpoint that retries 503s
// fails none, one that does not fails some; and a replica that answers 500
// is ejected, after which no request fails.
func TestRetriesAndOutliers(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "resilience")
	n1, c, ctx := mesh.n1, mesh.c, context.Background()
	mesh.createBackends(t,
		meshspec.Backend{Name: "plain", Config: meshspec.BackendConfig{NumReplicas: 3, CPUs: 1}, Process: demoProcess("plain", false)},
		meshspec.Backend{Name: "pool", Config: meshspec.BackendConfig{NumReplicas: 3, CPUs: 1,
			Outlier: &meshspec.OutlierDetection{Consecutive5xx: 3, IntervalS: 0.5, BaseEjectionS: 60, MaxEjectionPercent: 50}}, Process: demoProcess("pool", false)})
	for _, e := range []meshspec.Endpoint{
		{Name: "retried", Route: "/retried", Traffic: map[string]float64{"plain": 1}, Retry: &meshspec.RetryPolicy{On: []string{"503"}}},
		{Name: "bare", Route: "/bare", Traffic: map[string]float64{"plain": 1}},
		{Name: "pool", Route: "/pool", Traffic: map[string]float64{"pool": 1}},
	} {
		if _, err := c.CreateEndpoint(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	replicas := func(path string) []string {
		return waitReplicasAnswer(t, "the three replicas behind "+path+" to answer through n1", "http://"+n1.public+path, 3, 40)
	}
	failures := func(url string, n int) int {
		failed := 0
		for range n {
			if r := do(httpClient(), http.MethodGet, url, ""); r.err != nil || r.status != 200 {
				failed++
			}
		}
		return failed
	}

	t.Run("an endpoint that retries 503s fails none", func(t *testing.T) {
		bad := replicas("/retried")[0]
		query := "?fail_status=503&fail_replica=" + url.QueryEscape(bad)
		if f := failures("http://"+n1.public+"/retried"+query, 300); f != 0 {
			t.Errorf("%d of 300 requests failed, though the endpoint retries 503s on the two good replicas", f)
		}
		if f := failures("http://"+n1.public+"/bare"+query, 300); f == 0 {
			t.Errorf("no request failed without the retry setting: the faulty replica was never reached, so the first check shows nothing")
		}
	})
	t.Run("a replica that keeps failing is ejected", func(t *testing.T) {
		bad := replicas("/pool")[0]
		target := fmt.Sprintf("http://%s/pool?fail_status=500&fail_replica=%s", n1.public, url.QueryEscape(bad))
		total := 0
		testutil.WaitFor(t, 20*time.Second, "200 requests in a row to succeed once the faulty replica is ejected", func() bool {
			f := failures(target, 200)
			total += f
			return f == 0
		})
		if total == 0 {
			t.Errorf("no request ever failed: the faulty replica was never reached before its ejection")
		}
		t.Logf("%d requests failed before the faulty replica was ejected", total)
	})
}
