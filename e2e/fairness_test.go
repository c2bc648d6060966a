//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestFairnessUnderBurst: on the default mesh (two nodes, mTLS), a tenant
// sending at a steady rate while another bursts at ten times it, both
// past what the replicas serve. With the backend's tenant_header set,
// requests waiting on each node take turns by tenant, so the steady
// tenant waits about one answer; without, first come first served, it
// waits behind the burst as long as the bursting tenant does. A request
// of a higher priority waits less than both. bench/inference -workload
// fairness reports the figures as medians.
func TestFairnessUnderBurst(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "fair")
	for _, name := range []string{"fair", "fifo"} {
		la := &meshspec.LoadAware{}
		if name == "fair" {
			la.TenantHeader = "x-tenant"
		}
		mesh.createBackends(t, meshspec.Backend{Name: name, Process: modelServer(name, "--slots", "1", "--service", "20ms"),
			Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.25, MaxConcurrentQueries: 1, LoadAware: la}})
		if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: name, Route: "/" + name, Methods: []string{"GET", "POST"},
			Traffic: map[string]float64{name: 1}, Priority: 1}); err != nil {
			t.Fatal(err)
		}
	}
	mesh.waitPassing(t, "fair", 2, "http://"+mesh.n1.public+"/fair")
	mesh.waitPassing(t, "fifo", 2, "http://"+mesh.n1.public+"/fifo")
	d := fairnessLoad(t)
	results := map[string]*burstRun{}
	for _, name := range []string{"fair", "fifo"} {
		r := &burstRun{urls: []string{"http://" + mesh.n1.public + "/" + name, "http://" + mesh.n2.public + "/" + name}}
		r.run(fairnessRate, d)
		results[name] = r
		t.Logf("BENCH fairness mode=%s seconds=%.0f steady_rate=%d burst_rate=%d steady_p50_ms=%.1f steady_p99_ms=%.1f burst_p50_ms=%.1f burst_p99_ms=%.1f urgent_p50_ms=%.1f steady=%d burst=%d urgent=%d failed=%d",
			name, d.Seconds(), fairnessRate, 10*fairnessRate, ms(r.p("steady", 0.5)), ms(r.p("steady", 0.99)), ms(r.p("burst", 0.5)), ms(r.p("burst", 0.99)),
			ms(r.p("urgent", 0.5)), len(r.times["steady"]), len(r.times["burst"]), len(r.times["urgent"]), r.failed)
		if r.failed > 0 || len(r.times["steady"]) == 0 || len(r.times["burst"]) == 0 || len(r.times["urgent"]) == 0 {
			t.Fatalf("%s: %d requests failed (first: %s); answered steady %d, burst %d, urgent %d", name, r.failed, r.firstFailure,
				len(r.times["steady"]), len(r.times["burst"]), len(r.times["urgent"]))
		}
	}
	fair, fifo := results["fair"], results["fifo"]
	if fifo.p("burst", 0.5) < 200*time.Millisecond {
		t.Fatalf("the burst did not saturate the replicas (its median %v): the comparison shows nothing", fifo.p("burst", 0.5))
	}
	if got, burst := fair.p("steady", 0.9), fair.p("burst", 0.5); got*2 > burst {
		t.Errorf("with tenants taking turns, the steady tenant's p90 is %v, want under half the bursting tenant's median %v", got, burst)
	}
	if got, burst := fifo.p("steady", 0.5), fifo.p("burst", 0.5); got*2 < burst {
		t.Errorf("first come first served, the steady tenant's median is %v, want about the bursting tenant's %v (else the test cannot tell fairness)", got, burst)
	}
	for name, r := range results {
		if got, burst := r.p("urgent", 0.9), r.p("burst", 0.5); got*2 > burst {
			t.Errorf("%s: requests asking for priority 1 wait %v (p90), want under half the bursting tenant's median %v (priority 0)", name, got, burst)
		}
	}
}

// fairnessRate is the steady tenant's requests a second; the bursting one
// sends ten times as many.
const fairnessRate = 8

// fairnessLoad is how long each run sends requests: FAIRNESS_LOAD_S
// seconds (bench/inference sets it), 3 by default.
func fairnessLoad(t *testing.T) time.Duration { return loadSeconds(t, "FAIRNESS_LOAD_S", 3) }

// burstRun sends, open loop, a steady tenant's requests at rate and a
// bursting tenant's at ten times it, all of priority 0 (the endpoint
// allows 1), and every fifth steady one as a third tenant asking for
// priority 1 ("urgent"); it records each one's time to first byte by
// tenant.
type burstRun struct {
	urls []string

	mu           sync.Mutex
	times        map[string][]time.Duration
	failed       int
	firstFailure string
}

func (r *burstRun) run(rate int, d time.Duration) {
	r.times = map[string][]time.Duration{}
	client := loadClient()
	body := `{"model":"m","prompt":"hello"}`
	var wg sync.WaitGroup
	wg.Go(func() {
		atRate(rate, d, func(i int) {
			tenant, priority := "steady", "0"
			if i%5 == 4 {
				tenant, priority = "urgent", "1"
			}
			r.one(client, r.urls[i%len(r.urls)], body, tenant, priority)
		})
	})
	atRate(10*rate, d, func(i int) { r.one(client, r.urls[i%len(r.urls)], body, "burst", "0") })
	wg.Wait()
}

func (r *burstRun) one(client *http.Client, url, body, tenant, priority string) {
	ttfb, _, _, err := timedPost(client, url, body, "x-tenant", tenant, meshspec.PriorityHeader, priority)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.failed++; r.firstFailure == "" {
			r.firstFailure = tenant + ": " + err.Error()
		}
		return
	}
	r.times[tenant] = append(r.times[tenant], ttfb)
}

// p is tenant's p-th (0 to 1) time to first byte.
func (r *burstRun) p(tenant string, p float64) time.Duration { return percentile(r.times[tenant], p) }

// TestScalesOnQueueDepth: a load-aware backend autoscaled on its queue
// depth (target_queued_requests) scales up while requests wait, in its
// nodes' pickers and in its servers' own queues (vllm:num_requests_waiting,
// which the pickers read), though its requests in flight are far below
// target_in_flight_requests: the waiting count comes from the agents'
// load reports, through the controller's autoscaler.
func TestScalesOnQueueDepth(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "queue")
	as := &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 2, TargetInFlight: 100, TargetQueued: 2,
		MetricsIntervalS: 0.25, LookBackPeriodS: 2, UpscaleDelayS: 1, DownscaleDelayS: 600}
	la := &meshspec.LoadAware{MetricsPath: "/metrics", QueueMetric: "vllm:num_requests_waiting", RunningMetric: "vllm:num_requests_running"}
	mesh.createBackends(t, meshspec.Backend{Name: "qd", Process: modelServer("qd", "--slots", "1", "--service", "30ms"),
		Config: meshspec.BackendConfig{CPUs: 0.25, MaxConcurrentQueries: 6, LoadAware: la, Autoscaling: as}})
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "qd", Route: "/qd", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"qd": 1}}); err != nil {
		t.Fatal(err)
	}
	mesh.waitPassing(t, "qd", 1, "http://"+mesh.n1.public+"/qd")
	replicas := func() int {
		b, err := mesh.c.GetBackend(context.Background(), "qd")
		if err != nil {
			return -1
		}
		return b.Config.NumReplicas
	}
	l := &stepLoad{url: "http://" + mesh.n1.public + "/qd"}
	l.add(10) // 10 in flight at most (target 100: one replica), most of them waiting
	defer l.stopAll()
	testutil.WaitFor(t, 30*time.Second, "the waiting requests to scale qd to 2 replicas", func() bool { return replicas() == 2 })
}
