//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/servemesh/servemesh/deploy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// prometheusBins are Debian's prometheus and promtool, which `make tools`
// installs.
func prometheusBins(t *testing.T) (server, tool string) {
	t.Helper()
	for _, name := range []string{"prometheus", "promtool"} {
		path, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("the real Prometheus is required (`make tools` installs Debian's prometheus): %v", err)
		}
		if name == "prometheus" {
			server = path
		} else {
			tool = path
		}
	}
	return server, tool
}

// TestPrometheus runs a real Prometheus with the scrape configuration and
// alerting rules of deploy/prometheus (promtool checks both) against the
// default mesh under load, with what makes every panel of the Grafana
// dashboard speak (an autoscaled backend that scales, a replica killed and
// restarted, a rollout judged, a load-aware backend picked, its answers streamed): it finds the
// controller and both agents (the agents through the controller's HTTP
// service discovery), every
// query of deploy/grafana/servemesh.json returns data through
// Prometheus's HTTP API, and the four alerting rules are loaded and healthy.
func TestPrometheus(t *testing.T) {
	t.Parallel()
	promBin, promtool := prometheusBins(t)
	mesh := startTwoNodeMesh(t, "prom")
	ctx := context.Background()
	// An autoscaled backend whose replicas take 40 ms, under more load than
	// one takes: it scales up.
	stable := demoVersion("pstable", 1, `{"delay_ms": 40}`)
	stable.Config.Autoscaling = &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 2, TargetInFlight: 1,
		MetricsIntervalS: 0.5, LookBackPeriodS: 2, UpscaleDelayS: 1, DownscaleDelayS: 600}
	mesh.createBackends(t, stable, demoVersion("pcand", 1, `{}`))
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "prom", Route: "/prom", Traffic: map[string]float64{"pstable": 1}}); err != nil {
		t.Fatal(err)
	}
	// Answered through each node, by however many replicas: the backend is
	// autoscaled, and the waiting's own requests may scale it to two (make
	// flake saw it: a wait for exactly one replica never ended).
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		testutil.WaitFor(t, 30*time.Second, "the endpoint to answer through "+n.id, func() bool {
			return do(httpClient(), http.MethodGet, "http://"+n.public+"/prom", "").status == http.StatusOK
		})
	}
	// A load-aware backend, for the model-traffic panel (its nodes' pickers).
	picked := demoVersion("ppicked", 1, `{}`)
	picked.Config.LoadAware = &meshspec.LoadAware{}
	mesh.createBackends(t, picked)
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "picked", Route: "/picked", Traffic: map[string]float64{"ppicked": 1}}); err != nil {
		t.Fatal(err)
	}
	waitReplicasAnswer(t, "the load-aware endpoint to answer", "http://"+mesh.n1.public+"/picked", 1, 40)
	loads := []*load{startLoad("http://"+mesh.n1.public+"/prom", 6), startLoad("http://"+mesh.n2.public+"/prom", 6),
		startLoad("http://"+mesh.n2.public+"/picked", 1)}
	defer func() {
		for _, l := range loads {
			close(l.stop)
			l.wg.Wait()
		}
	}()
	// Streamed answers of the load-aware endpoint (model traffic), for the
	// GenAI panels: events 10 ms apart.
	streams := make(chan struct{})
	var streaming sync.WaitGroup
	defer func() { close(streams); streaming.Wait() }()
	streaming.Go(func() {
		client := &http.Client{Timeout: 10 * time.Second}
		for {
			select {
			case <-streams:
				return
			default:
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+mesh.n1.public+"/picked?tokens=5&every_ms=10", nil)
			req.Header.Set("Accept", "text/event-stream")
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}
	})

	prom := startPrometheus(t, promBin, promtool, mesh.ctl.apiAddr)

	// What the rollout and restart panels need: a rollout judged stage by
	// stage, and a replica's process killed and restarted.
	step := func(w float64) meshspec.RolloutStep {
		return meshspec.RolloutStep{Weight: w, DurationS: 3, MinRequests: 20}
	}
	if _, err := mesh.c.StartRollout(ctx, "prom", meshspec.Rollout{Candidate: "pcand", Steps: []meshspec.RolloutStep{step(0.2), step(0.5), step(1)}, Checks: meshspec.RolloutChecks{LatencyToleranceMs: 1000}}); err != nil {
		t.Fatal(err)
	}
	pids := mesh.replicaPids("pcand")
	if len(pids) == 0 {
		t.Fatal("no process of pcand's replica")
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	queries, err := deploy.DashboardQueries("../deploy/grafana/servemesh.json")
	if err != nil || len(queries) < 10 {
		t.Fatalf("the dashboard's queries: %d, %v", len(queries), err)
	}
	for _, q := range queries {
		testutil.WaitFor(t, 90*time.Second, fmt.Sprintf("the panel %q's query %s to return data", q.Panel, q.Expr), func() bool {
			return prom.series(t, q.Expr) > 0
		})
	}
	rules := prom.rules(t)
	if len(rules) != 4 {
		t.Fatalf("Prometheus loaded %d alerting rules, want 4: %v", len(rules), rules)
	}
	for name, health := range rules {
		if health != "ok" {
			t.Errorf("alerting rule %s: health %q", name, health)
		}
	}
}

// prometheus is a running Prometheus server.
type prometheus struct{ addr string }

// startPrometheus renders deploy/prometheus for this mesh (the
// controller's address, token files of its own, a scrape every second),
// checks it with promtool, and runs Prometheus on it.
func startPrometheus(t *testing.T, bin, promtool, controller string) *prometheus {
	t.Helper()
	dir := t.TempDir()
	config, err := os.ReadFile("../deploy/prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	rendered := strings.NewReplacer("10.0.0.1:18001", controller, "10.0.0.2:18001", controller,
		"/etc/prometheus/servemesh/", dir+"/", "15s", "1s").Replace(string(config))
	writeFile(t, filepath.Join(dir, "prometheus.yml"), []byte(rendered))
	alerts, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "alerts.yml"), alerts)
	for _, token := range []string{"read-token", "agent-token"} {
		writeFile(t, filepath.Join(dir, token), []byte("unused: the mesh runs without tokens on loopback\n"))
	}
	for _, args := range [][]string{{"check", "config", filepath.Join(dir, "prometheus.yml")}, {"check", "rules", filepath.Join(dir, "alerts.yml")}} {
		if out, err := exec.CommandContext(context.Background(), promtool, args...).CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	p := &prometheus{addr: freeAddr(t)}
	var logs testutil.SyncBuffer
	child, err := proc.Start(proc.Spec{Path: bin, Stderr: &logs, Args: []string{"--config.file", filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path", filepath.Join(dir, "data"), "--web.listen-address", p.addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = child.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	testutil.WaitFor(t, 30*time.Second, "Prometheus to be ready", func() bool {
		return do(httpClient(), http.MethodGet, "http://"+p.addr+"/-/ready", "").status == 200
	})
	testutil.WaitFor(t, 30*time.Second, "Prometheus to scrape the controller and both agents", func() bool {
		return p.series(t, `up{job="servemesh-controller"} == 1`) == 1 && p.series(t, `up{job="servemesh-agents", servemesh_node=~".+"} == 1`) == 2
	})
	return p
}

// series is how many series a query returns now.
func (p *prometheus) series(t *testing.T, expr string) int {
	t.Helper()
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
		Error string `json:"error"`
	}
	p.get(t, "/api/v1/query?query="+url.QueryEscape(expr), &body)
	if body.Status != "success" {
		t.Fatalf("query %s: %s", expr, body.Error)
	}
	return len(body.Data.Result)
}

// rules are the alerting rules loaded, with their health.
func (p *prometheus) rules(t *testing.T) map[string]string {
	t.Helper()
	var body struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name   string `json:"name"`
					Health string `json:"health"`
					Type   string `json:"type"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	p.get(t, "/api/v1/rules", &body)
	out := map[string]string{}
	for _, g := range body.Data.Groups {
		for _, r := range g.Rules {
			if r.Type == "alerting" {
				out[r.Name] = r.Health
			}
		}
	}
	return out
}

func (p *prometheus) get(t *testing.T, path string, into any) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+p.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := doJSON(req, into); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}
