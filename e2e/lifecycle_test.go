//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/activator"
	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// slowStart is how long the demo replicas of these tests take to listen,
// as a model server loading its weights does.
const slowStart = 1500 * time.Millisecond

// slowDemoProcess runs demo replicas of backend that listen only after
// slowStart.
func slowDemoProcess(backend string) *meshspec.ProcessSpec {
	p := demoProcess(backend, false)
	p.Args = append(p.Args, "--start-delay", slowStart.String())
	return p
}

// TestHoldWhileNoReplicaIsReady runs the replica lifecycle in the default
// mode (mTLS, two nodes, load entering both): while a backend has no ready
// replica, its requests wait in the nodes' activators and are answered
// once one is ready, never with a 503.
func TestHoldWhileNoReplicaIsReady(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "hold")
	ctx := context.Background()
	mesh.createBackends(t,
		meshspec.Backend{Name: "stable", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1}, Process: demoProcess("stable", false)},
		meshspec.Backend{Name: "solo", Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}, Process: slowDemoProcess("solo")})
	nodes := []*mtlsNode{mesh.n1, mesh.n2}

	t.Run("killing the only replica of a backend under load fails no request", func(t *testing.T) {
		// The case: the backend with 10% of the traffic loses its
		// only replica (83 of 28,443 requests failed in 8 s before).
		if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "split", Route: "/split", Methods: []string{"GET", "POST"},
			Traffic: map[string]float64{"stable": 0.9, "solo": 0.1}}); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			waitReplicasAnswer(t, "the three replicas to answer through "+n.id, "http://"+n.public+"/split", 3, 60)
		}
		loads := []*load{startLoad("http://"+mesh.n1.public+"/split", 2), startLoad("http://"+mesh.n2.public+"/split", 2),
			startLoadMethod(http.MethodPost, "http://"+mesh.n1.public+"/split", 1)}
		time.Sleep(time.Second)
		pids := mesh.replicaPids("solo")
		if len(pids) != 1 {
			t.Fatalf("solo runs %d replica processes, want 1", len(pids))
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 20*time.Second, "solo's replica to be restarted and serve", func() bool {
			ps := mesh.replicaPids("solo")
			if len(ps) != 1 || ps[0] == pids[0] {
				return false
			}
			for range 40 {
				if r, err := replicaOf(httpClient(), "http://"+mesh.n1.public+"/split"); err == nil && strings.HasPrefix(r, "solo") {
					return true
				}
			}
			return false
		})
		time.Sleep(3 * time.Second) // the restarted replica serves its share
		for _, l := range loads[:2] {
			l.finish(t)
		}
		// A POST the replica was serving when it was killed cannot be sent
		// again; every other one is answered.
		loads[2].finishAllowingReached(t, true)
		released := heldOutcome(t, nodes, "solo", activator.HeldReleased)
		t.Logf("requests held while solo restarted, then answered: %v", released)
		if released == 0 {
			t.Error("no request was held for solo: the restart was not covered by the activator")
		}
		if timedOut := heldOutcome(t, nodes, "solo", activator.HeldTimeout); timedOut != 0 {
			t.Errorf("%v held requests timed out", timedOut)
		}
	})

	t.Run("a new backend's first requests wait for its first replica", func(t *testing.T) {
		// The endpoint exists before its backend has a replica: its
		// requests are sent at once, on both nodes.
		mesh.createBackends(t, meshspec.Backend{Name: "fresh", Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}, Process: slowDemoProcess("fresh")})
		if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "fresh", Route: "/fresh", Traffic: map[string]float64{"fresh": 1}}); err != nil {
			t.Fatal(err)
		}
		waitNodesServe(t, mesh.c) // the replica listens in about a second
		took := burst(t, nodes, "/fresh", 20)
		t.Logf("20 requests sent before fresh's replica was ready answered within %s", took)
		if held := heldOutcome(t, nodes, "fresh", activator.HeldReleased); held == 0 {
			t.Error("no request was held for fresh: they did not wait for its replica")
		}
	})

	t.Run("--wait returns when every replica is ready and every node serves the change, and fails on a crash loop with the end of its log", func(t *testing.T) {
		env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr}
		start := time.Now()
		code, stdout, stderr := cli(t, env, "backend", "create", "waited", "--command", servemeshBin, "--arg", "demo-replica", "--arg", "--backend",
			"--arg", "waited", "--arg", "--listen", "--arg", "${HOST}:${PORT}", "--arg", "--start-delay", "--arg", slowStart.String(),
			"--health-path", "/", "--num-replicas", "2", "--cpus", "0.5", "--wait", "--timeout", "60s")
		took := time.Since(start)
		if code != 0 || !strings.Contains(stdout, "waited: ready") {
			t.Fatalf("create --wait: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		if took < slowStart {
			t.Fatalf("create --wait returned after %s, before its replicas could listen (%s)", took, slowStart)
		}
		if !strings.Contains(stderr, "waited: 0/2 ready") {
			t.Errorf("no progress line on stderr: %q", stderr)
		}
		if !strings.Contains(stderr, "--timeout is deprecated: use --wait-timeout") || strings.Contains(stdout, "deprecated") {
			t.Errorf("--timeout, the wait's earlier name, was taken without saying its name now on stderr: stdout %q, stderr %q", stdout, stderr)
		}
		report, err := mesh.c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range report.Backends {
			if b.Name == "waited" && (b.Ready != 2 || b.Running != 2) {
				t.Fatalf("create --wait returned with %d of %d replicas ready", b.Ready, b.Running)
			}
		}
		t.Logf("create --wait of 2 replicas that listen after %s returned after %s", slowStart, took)
		// endpoint create and traffic set --wait return once every node
		// serves the change: the requests sent right after, through both
		// nodes, are all answered by the backend it names.
		answeredBy := func(want string) {
			t.Helper()
			for i := range 20 {
				tag, err := replicaOf(httpClient(), "http://"+nodes[i%2].public+"/waited")
				if err != nil || !strings.HasPrefix(tag, want+"#") {
					t.Fatalf("request %d right after the change, through %s: replica %q, %v; want one of %s", i, nodes[i%2].id, tag, err, want)
				}
			}
		}
		for _, args := range [][]string{{"endpoint", "create", "waited", "--route", "/waited", "--backend", "waited", "--wait"},
			{"traffic", "set", "waited", "stable=1", "--wait"}, {"traffic", "set", "waited", "waited=1", "--wait"}, {"traffic", "set", "waited", "stable=1", "--wait"}} {
			start := time.Now()
			code, stdout, stderr := cli(t, env, args...)
			if code != 0 || !strings.Contains(stdout, "served by every node") {
				t.Fatalf("%s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, stdout, stderr)
			}
			t.Logf("%s returned after %s", strings.Join(args, " "), time.Since(start))
			answeredBy(map[bool]string{true: "waited", false: "stable"}[strings.Contains(args[len(args)-2], "waited")])
		}
		if _, err := mesh.c.DeleteEndpoint(ctx, "waited"); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		code, _, stderr = cli(t, env, "backend", "create", "crashy", "--command", servemeshBin, "--arg", "demo-replica",
			"--num-replicas", "1", "--cpus", "0.5", "--wait", "--wait-timeout", "60s")
		if code == 0 || !strings.Contains(stderr, "crash-looping") || !strings.Contains(stderr, "--backend is required") {
			t.Fatalf("create --wait of a replica that exits at once: exit %d, stderr %q; want a crash loop with the end of its log", code, stderr)
		}
		t.Logf("create --wait of a replica that exits at once failed after %s: %s", time.Since(start), stderr)
		deleteBackends(t, mesh, "waited", "crashy") // room for the next
	})
	t.Run("user_config reaches every replica without a restart, before it is first routed to", func(t *testing.T) {
		tuned := demoProcess("tuned", false)
		tuned.ReconfigurePath = demoreplica.ReconfigurePath
		mesh.createBackends(t, meshspec.Backend{Name: "tuned", Process: tuned,
			Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1, UserConfig: meshspec.UserConfig(`{"temperature":0.5}`)}})
		if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "tuned", Route: "/tuned", Traffic: map[string]float64{"tuned": 1}}); err != nil {
			t.Fatal(err)
		}
		configs := func(n int) map[string]int {
			seen := map[string]int{}
			for i := range n {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+nodes[i%2].public+"/tuned", nil)
				var r demoreplica.Response
				if err := doJSON(req, &r); err == nil {
					seen[string(r.Config)]++
				}
			}
			return seen
		}
		testutil.WaitFor(t, 30*time.Second, "both replicas of tuned to answer", func() bool { return len(mesh.replicaPids("tuned")) == 2 && len(configs(10)) > 0 })
		if got := configs(40); len(got) != 1 || got[`{"temperature":0.5}`] != 40 {
			t.Fatalf("answers by the config their replica ran: %v; want every one with the config", got)
		}
		pids := mesh.replicaPids("tuned")
		slices.Sort(pids)
		if _, err := mesh.c.UpdateBackend(ctx, "tuned", meshspec.BackendConfigPatch{UserConfig: ptr(meshspec.UserConfig(`{"temperature":0.9}`))}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "every replica to take the new config", func() bool {
			got := configs(20)
			return len(got) == 1 && got[`{"temperature":0.9}`] == 20
		})
		after := mesh.replicaPids("tuned")
		slices.Sort(after)
		if !slices.Equal(pids, after) {
			t.Fatalf("replica processes %v became %v: the config change restarted them", pids, after)
		}
		testutil.WaitFor(t, 10*time.Second, "status to show each replica on the new config's version", func() bool {
			b, _, err := backendStatus(ctx, mesh.c, "tuned")
			if err != nil {
				return false
			}
			for _, r := range b.Replicas {
				if r.ConfigVersion != b.ConfigVersion || b.ConfigVersion == "" {
					return false
				}
			}
			return len(b.Replicas) == 2
		})
		if _, err := mesh.c.UpdateBackend(ctx, "tuned", meshspec.BackendConfigPatch{UserConfig: ptr(meshspec.UserConfig(`{"fail":true}`))}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "replicas refusing the config to be out of rotation, saying why", func() bool {
			b, _, err := backendStatus(ctx, mesh.c, "tuned")
			return err == nil && b.Ready == 0 && len(b.Replicas) > 0 && strings.Contains(b.Replicas[0].Note, "not taken")
		})
		if _, err := mesh.c.UpdateBackend(ctx, "tuned", meshspec.BackendConfigPatch{UserConfig: ptr(meshspec.UserConfig(`{"temperature":1}`))}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "the replicas back in rotation with a config they take", func() bool {
			got := configs(20)
			return len(got) == 1 && got[`{"temperature":1}`] == 20
		})
		if _, err := mesh.c.DeleteEndpoint(ctx, "tuned"); err != nil {
			t.Fatal(err)
		}
		deleteBackends(t, mesh, "tuned") // room for the next
	})
	t.Run("a backend scaled to zero wakes at its first requests and goes back to zero when idle", func(t *testing.T) {
		as := &meshspec.AutoscalingConfig{MinReplicas: 0, MaxReplicas: 2, TargetInFlight: 4,
			MetricsIntervalS: 0.5, LookBackPeriodS: 1, UpscaleDelayS: 1, DownscaleDelayS: 4}
		mesh.createBackends(t, meshspec.Backend{Name: "sleepy", Config: meshspec.BackendConfig{CPUs: 1, Autoscaling: as}, Process: slowDemoProcess("sleepy")})
		if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "sleepy", Route: "/sleepy", Traffic: map[string]float64{"sleepy": 1}}); err != nil {
			t.Fatal(err)
		}
		running := func() int {
			n := 0
			for _, p := range placements(t, mesh.c, "sleepy") {
				if p.State == meshspec.Running {
					n++
				}
			}
			return n
		}
		for round := range 2 {
			if n := running(); n != 0 {
				t.Fatalf("round %d: sleepy runs %d replicas before any request; want 0", round, n)
			}
			waitNodesServe(t, mesh.c)
			took := burst(t, nodes, "/sleepy", 10)
			t.Logf("round %d: 10 requests to sleepy at zero answered within %s (its replica takes %s to listen)", round, took, slowStart)
			if t.Failed() {
				if report, err := mesh.c.Status(ctx); err == nil {
					t.Fatalf("round %d: the mesh's problems: %q", round, report.Problems)
				}
				t.FailNow()
			}
			if n := running(); n == 0 {
				t.Fatalf("round %d: the requests were answered but sleepy runs no replica", round)
			}
			testutil.WaitFor(t, 30*time.Second, "sleepy to scale back to zero when idle", func() bool { return running() == 0 })
		}
	})
	t.Run("an autoscaled backend that outgrows the nodes gets what fits, and status says why it wants more", func(t *testing.T) {
		as := &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 12, TargetInFlight: 1,
			MetricsIntervalS: 0.5, LookBackPeriodS: 1, UpscaleDelayS: 0.5, DownscaleDelayS: 600}
		mesh.createBackends(t, meshspec.Backend{Name: "greedy", Config: meshspec.BackendConfig{CPUs: 1, NumReplicas: 1, Autoscaling: as}, Process: demoProcess("greedy", false)})
		if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "greedy", Route: "/greedy", Traffic: map[string]float64{"greedy": 1}}); err != nil {
			t.Fatal(err)
		}
		waitReplicasAnswer(t, "greedy's first replica to answer", "http://"+mesh.n1.public+"/greedy", 1, 5)
		busy := startLoad("http://"+mesh.n1.public+"/greedy?sleep_ms=100", 12) // 12 in flight: it wants 12 replicas
		var greedy api.BackendStatus
		var problems []string
		testutil.WaitFor(t, 30*time.Second, "greedy to want 12 replicas, run what fits, and status to say why", func() bool {
			var err error
			if greedy, problems, err = backendStatus(ctx, mesh.c, "greedy"); err != nil {
				return false
			}
			return greedy.Desired == 12 && greedy.Running > 1 && greedy.Running < 12 &&
				slices.ContainsFunc(problems, func(p string) bool { return strings.HasPrefix(p, api.PlacementProblemPrefix("greedy")) })
		})
		t.Logf("greedy: %d of %d wanted replicas run; status says: %q", greedy.Running, greedy.Desired, problems)
		busy.finish(t)
		// Room for the next: greedy, still scaling up, would take every
		// CPU the nodes have left (it once left patient none).
		if _, err := mesh.c.DeleteEndpoint(ctx, "greedy"); err != nil {
			t.Fatal(err)
		}
		deleteBackends(t, mesh, "greedy")
	})
	// Last: the restarted controller leads again only once the killed one's
	// session has expired, and until then nothing autoscales.
	t.Run("held requests survive a restart of the controller", func(t *testing.T) {
		mesh.createBackends(t, meshspec.Backend{Name: "patient", Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 0.5}, Process: slowDemoProcess("patient")})
		if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "patient", Route: "/patient", Traffic: map[string]float64{"patient": 1}}); err != nil {
			t.Fatal(err)
		}
		waitNodesServe(t, mesh.c) // the replica is starting
		mesh.ctl.kill()
		testutil.WaitFor(t, 10*time.Second, "the controller to exit", mesh.ctl.exited)
		answered := make(chan time.Duration)
		go func() { answered <- burst(t, nodes, "/patient", 10) }()
		time.Sleep(slowStart) // the requests wait with no controller at all
		mesh.ctl.start()
		took := <-answered
		t.Logf("10 requests held across a controller restart answered within %s", took)
		if held := heldOutcome(t, nodes, "patient", activator.HeldReleased); held == 0 {
			t.Error("no request was held for patient")
		}
	})
}

// backendStatus is backend name's row in the controller's status, and the
// mesh's problems; an error if the status cannot be read or lacks it.
func backendStatus(ctx context.Context, c *api.Client, name string) (api.BackendStatus, []string, error) {
	report, err := c.Status(ctx)
	if err != nil {
		return api.BackendStatus{}, nil, err
	}
	for _, b := range report.Backends {
		if b.Name == name {
			return b, report.Problems, nil
		}
	}
	return api.BackendStatus{}, report.Problems, fmt.Errorf("the status has no backend %q", name)
}

// deleteBackends deletes backends no endpoint uses, so that the subtests
// after have room on the nodes.
func deleteBackends(t *testing.T, mesh *twoNodeMesh, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := mesh.c.DeleteBackend(context.Background(), name); err != nil {
			t.Fatalf("delete backend %s: %v", name, err)
		}
	}
}

// burst sends n requests to path at once, through each node in turn, and
// wants them all answered; it returns when the last was.
func burst(t *testing.T, nodes []*mtlsNode, path string, n int) time.Duration {
	t.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 30 * time.Second}
			if _, err := replicaOf(client, "http://"+nodes[i%len(nodes)].public+path); err != nil {
				errs <- fmt.Errorf("request %d through %s: %w", i, nodes[i%len(nodes)].id, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return time.Since(start)
}

func ptr[T any](v T) *T { return &v }

// heldOutcome sums, over nodes, the requests held for backend that ended
// with outcome (0 when none did: the counter is born with its first).
func heldOutcome(t *testing.T, nodes []*mtlsNode, backend, outcome string) float64 {
	t.Helper()
	sum := 0.0
	for _, n := range nodes {
		v, _ := scrapeMetric(t, n.metr, "servemesh_held_requests_total", "backend", backend, "outcome", outcome)
		sum += v
	}
	return sum
}

// TestFileModeHoldsToo: a node's Envoy run by `servemesh envoy` for
// `servemesh serve` (no agent, no Consul) holds the requests of a backend
// none of whose listed replicas is ready, until the file says one is.
func TestFileModeHoldsToo(t *testing.T) {
	t.Parallel()
	replica := freeAddr(t)
	r, err := proc.Start(proc.Spec{Path: servemeshBin, Args: []string{"demo-replica", "--backend", "listed", "--listen", replica}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(5 * time.Second) })
	config := filepath.Join(t.TempDir(), "mesh.yaml")
	write := func(health string) {
		t.Helper()
		doc := fmt.Sprintf("backends:\n  - name: listed\n    replicas: [{address: %s, health: %s}]\n"+
			"endpoints:\n  - name: listed\n    route: /listed\n    traffic: {listed: 1}\n", replica, health)
		if err := os.WriteFile(config+".new", []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(config+".new", config); err != nil {
			t.Fatal(err)
		}
	}
	write("healthy")
	cp := startControlPlane(t, config)
	public := freeAddr(t)
	stderr := &testutil.SyncBuffer{}
	node, err := proc.Start(proc.Spec{Path: servemeshBin, Args: []string{"envoy", "--node-id", "file-node", "--xds", cp.xdsAddr,
		"--public", public, "--mesh", freeAddr(t), "--work-dir", t.TempDir(), "--concurrency", "1", "--stop-on-exit"},
		Env: append(os.Environ(), "SERVEMESH_ENVOY="+envoyBin), Stderr: stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = node.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("servemesh envoy log:\n%s", stderr.String())
		}
	})
	waitReplicasAnswer(t, "the node to serve /listed", "http://"+public+"/listed", 1, 3)
	write("unhealthy")
	testutil.WaitFor(t, 10*time.Second, "the node to hold /listed (its only replica unhealthy)", func() bool {
		_, err := replicaOf(&http.Client{Timeout: 300 * time.Millisecond}, "http://"+public+"/listed")
		return err != nil && strings.Contains(err.Error(), "Timeout")
	})
	answered := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := replicaOf(&http.Client{Timeout: 20 * time.Second}, "http://"+public+"/listed")
		answered <- err
	}()
	time.Sleep(time.Second)
	write("healthy")
	if err := <-answered; err != nil {
		t.Fatalf("a request sent while the only replica was unhealthy: %v; want it held and answered", err)
	}
	if took := time.Since(start); took < time.Second {
		t.Fatalf("answered after %s, before the replica was healthy again", took)
	}
}
