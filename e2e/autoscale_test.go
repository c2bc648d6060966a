//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// stepLoad runs workers that each send one 50 ms request after another.
type stepLoad struct {
	url          string
	sent, failed atomic.Int64
	mu           sync.Mutex
	stops        []chan struct{}
	wg           sync.WaitGroup
	firstFailure atomic.Value
}

func (l *stepLoad) add(n int) {
	for range n {
		stop := make(chan struct{})
		l.mu.Lock()
		l.stops = append(l.stops, stop)
		l.mu.Unlock()
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			client := &http.Client{Timeout: 10 * time.Second}
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := do(client, http.MethodGet, l.url, "")
				l.sent.Add(1)
				if r.err != nil || r.status != 200 {
					l.failed.Add(1)
					l.firstFailure.CompareAndSwap(nil, r)
				}
			}
		}()
	}
}

func (l *stepLoad) stopAll() {
	l.mu.Lock()
	for _, s := range l.stops {
		close(s)
	}
	l.stops = nil
	l.mu.Unlock()
	l.wg.Wait()
}

func TestAutoscaling(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "ctl", []string{"--drain-grace", "1s"})
	ctl.waitLeading(20 * time.Second)
	n1 := startAgent(t, consul, "n1", "127.0.0.2", ctl.xdsAddr, 4)
	n2 := startAgent(t, consul, "n2", "127.0.0.3", ctl.xdsAddr, 4)
	c := ctl.client("")
	ctx := context.Background()
	as := &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 6, TargetInFlight: 2,
		MetricsIntervalS: 0.25, LookBackPeriodS: 2, UpscaleDelayS: 1, DownscaleDelayS: 4}
	backend := meshspec.Backend{Name: "slow", Config: meshspec.BackendConfig{CPUs: 1, MaxConcurrentQueries: 4, Autoscaling: as},
		Process: &meshspec.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--backend", "slow", "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
	testutil.WaitFor(t, 15*time.Second, "two live nodes", func() bool {
		_, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(backend))
		return err == nil
	})
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "slow", Route: "/slow", Traffic: map[string]float64{"slow": 1}}); err != nil {
		t.Fatal(err)
	}
	replicas := func() int {
		b, err := c.GetBackend(ctx, "slow")
		if err != nil {
			return -1
		}
		return b.Config.NumReplicas
	}
	if got := replicas(); got != 1 {
		t.Fatalf("an autoscaled backend starts at min_replicas: %d", got)
	}
	six := 6
	var apiErr *api.Error
	if _, err := c.UpdateBackend(ctx, "slow", meshspec.BackendConfigPatch{NumReplicas: &six}); err == nil || !errors.As(err, &apiErr) || apiErr.Status != 409 || !strings.Contains(err.Error(), "the autoscaler sets num_replicas") {
		t.Fatalf("an explicit num_replicas on an autoscaled backend: %v", err)
	}
	testutil.WaitFor(t, 20*time.Second, "the first replica to serve", func() bool {
		return do(httpClient(), http.MethodGet, "http://"+n1.public+"/slow", "").status == 200
	})

	l := &stepLoad{url: "http://" + n1.public + "/slow?sleep_ms=50"}
	l.add(1)
	time.Sleep(3 * time.Second)
	if got := replicas(); got != 1 {
		t.Fatalf("one request in flight, target 2: %d replicas, want 1", got)
	}
	stepped := time.Now()
	l.add(9) // 10 in flight: ceil(10 / 2) = 5 replicas
	testutil.WaitFor(t, 30*time.Second, "replicas to rise to meet the load", func() bool { return replicas() >= 5 })
	decided := time.Since(stepped)
	// servemesh status shows the live rate next to the weight, and the nodes.
	testutil.WaitFor(t, 20*time.Second, "servemesh status to show the load", func() bool {
		code, out, _ := cli(t, []string{"SERVEMESH_SERVER=" + ctl.apiAddr}, "status", "-o", "json")
		var r api.StatusReport
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
			return false
		}
		for _, e := range r.Endpoints {
			if e.Name == "slow" && len(e.Backends) == 1 && e.Backends[0].Backend == "slow" {
				return e.RequestRate > 50 && e.Backends[0].RequestRate > 50 && len(r.Nodes) == 2
			}
		}
		return false
	})
	consulClient, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "5 replicas to serve", func() bool {
		e, _, _ := consulClient.Health().Service(wire.BackendService("slow"), "", true, nil)
		return len(e) >= 5
	})
	serving := time.Since(stepped)
	peak := replicas()
	time.Sleep(2 * time.Second)
	if got := replicas(); got != peak {
		t.Fatalf("replicas moved from %d to %d under a steady load", peak, got)
	}
	l.stopAll()
	stopped := time.Now()
	testutil.WaitFor(t, 40*time.Second, "replicas to fall back to 1", func() bool { return replicas() == 1 })
	down := time.Since(stopped)
	t.Logf("load 1 -> 10 in flight: %d replicas decided after %s, serving after %s; load stopped: back to 1 after %s (downscale delay 4s)",
		peak, decided.Round(time.Millisecond), serving.Round(time.Millisecond), down.Round(time.Millisecond))
	if down < 4*time.Second {
		t.Fatalf("scaled down after %s, before the 4s downscale delay", down)
	}
	if l.failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed, first %+v", l.failed.Load(), l.sent.Load(), l.firstFailure.Load())
	}

	// The metrics show what the load generator sent, as Envoy counted it.
	sent := float64(l.sent.Load())
	gotBackend := metricValue(t, n1.metr, "servemesh_backend_requests_total", "backend", "slow") + metricValue(t, n2.metr, "servemesh_backend_requests_total", "backend", "slow")
	gotRoute := metricValue(t, n1.metr, "servemesh_http_requests_total", "endpoint", "slow", "listener", "public")
	t.Logf("load generator sent %.0f requests (plus the warm-up); Envoy counted %.0f to backend slow, %.0f on route slow", sent, gotBackend, gotRoute)
	if gotRoute < sent || gotRoute > sent+50 || gotBackend < sent || gotBackend > sent+50 {
		t.Fatalf("metrics disagree with the load generator: sent %.0f, backend %.0f, route %.0f", sent, gotBackend, gotRoute)
	}
	if up, dn := metricValue(t, ctl.apiAddr, "servemesh_autoscale_decisions_total", "direction", "up"), metricValue(t, ctl.apiAddr, "servemesh_autoscale_decisions_total", "direction", "down"); up < 1 || dn < 1 {
		t.Fatalf("autoscale decisions up %v down %v", up, dn)
	}
	if got := metricValue(t, ctl.apiAddr, "servemesh_replicas", "backend", "slow", "state", "desired"); got != 1 {
		t.Fatalf("servemesh_replicas desired = %v, want 1 after the load", got)
	}
	report, err := c.Status(ctx)
	if err != nil || len(report.Backends) != 1 || !report.Backends[0].Autoscaled || len(report.Nodes) != 2 {
		t.Fatalf("status: %+v %v", report, err)
	}
}
