package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/internal/devconsul"
)

// runDemoStack runs the whole of servemesh on this machine, as it runs in
// production: a Consul dev agent, the controller, and one node agent with
// its Envoy running the demo's replicas as processes. It is what `make run`
// starts.
func runDemoStack(ctx context.Context, log *slog.Logger, args []string, stdout io.Writer) error {
	fs := newFlags("demo-stack", "[flags]")
	workDir := fs.String("work-dir", ".run/demo-stack", "folder for logs, replica output and the applied mesh.yaml")
	consulPort := fs.Int("consul-http-port", 18500, "port of the Consul dev agent's HTTP API and UI")
	apiAddr := fs.String("api", "127.0.0.1:18001", "the controller's API address")
	xdsAddr := fs.String("xds", "127.0.0.1:18000", "the controller's xDS address")
	public := fs.String("public", "127.0.0.1:8080", "the node's public listener")
	mesh := fs.String("mesh", "127.0.0.1:15001", "the node's mesh listener")
	admin := fs.String("admin", "127.0.0.1:19000", "the node's Envoy admin address")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*workDir, 0o755); err != nil {
		return err
	}
	consul, err := devconsul.Start(*workDir, *consulPort)
	if err != nil {
		return fmt.Errorf("consul: %w", err)
	}
	defer consul.Stop()
	env := []string{"CONSUL_HTTP_ADDR=" + consul.HTTPAddr}
	var children []*exec.Cmd
	defer func() {
		for _, c := range children {
			stopChild(c)
		}
	}()
	for _, child := range []struct {
		name string
		args []string
	}{
		{"controller", []string{"controller", "--api-listen", *apiAddr, "--xds-listen", *xdsAddr, "--replace-after", "10s", "--drain-grace", "2s"}},
		{"agent", []string{"agent", "--node-id", "demo-node", "--address", "127.0.0.1", "--cpus", "8", "--memory-mb", "8192",
			"--xds", *xdsAddr, "--public", *public, "--mesh", *mesh, "--admin", *admin,
			"--work-dir", filepath.Join(*workDir, "agent"), "--drain-grace", "2s"}},
	} {
		c, err := startChild(self, child.args, env, filepath.Join(*workDir, child.name+".log"))
		if err != nil {
			return fmt.Errorf("start %s: %w", child.name, err)
		}
		children = append(children, c)
	}
	client := api.NewClient(*apiAddr, "")
	m := demoStackModel(self)
	// Process backends need a live node: retry until the agent has registered.
	if err := untilCtx(ctx, 60*time.Second, func() bool { _, err := client.Apply(ctx, m, false); return err == nil }); err != nil {
		return fmt.Errorf("the controller and agent did not come up (see %s/*.log): %w", *workDir, err)
	}
	out, err := model.Marshal(m)
	if err != nil {
		return err
	}
	meshFile := filepath.Join(*workDir, "mesh.yaml")
	if err := os.WriteFile(meshFile, out, 0o644); err != nil {
		return err
	}
	httpc := &http.Client{Timeout: 2 * time.Second}
	if err := untilCtx(ctx, 60*time.Second, func() bool {
		resp, err := httpc.Get("http://" + *public + "/model") //nolint:noctx // bounded by the client timeout
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); err != nil {
		return fmt.Errorf("envoy did not serve /model (see %s/*.log): %w", *workDir, err)
	}
	bin := self
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, self); err == nil {
			bin = rel
		}
	}
	fmt.Fprintf(stdout, `
servemesh is running on this machine, as in production: Consul (UI http://%[1]s/ui), the
controller (API %[2]s), and one node agent running its Envoy (public %[3]s) and 6 demo
replicas as processes. The applied state is in %[4]s.

Try:
  curl -s http://%[3]s/model                       # 90%% model-v1, 10%% model-v2; 20%% mirrored to model-v3-candidate
  for i in $(seq 200); do curl -s http://%[3]s/model -o /dev/null -w '%%{header_json}\n' | grep -o 'model-v[0-9a-z-]*'; done | sort | uniq -c
  curl -si -X DELETE http://%[3]s/model            # 405, with an Allow header
  curl -s -H 'Host: embeddings' http://%[5]s/      # a headless endpoint, on the mesh listener

  export SERVEMESH_SERVER=%[2]s
  %[6]s status                           # live request rates next to the weights, replicas, nodes
  %[6]s traffic set model model-v1=0.5 model-v2=0.5
  %[6]s backend update model-v2 --num-replicas 3
  for i in $(seq 8); do (for j in $(seq 60); do curl -s -o /dev/null -H 'Host: embeddings' 'http://%[5]s/?sleep_ms=200'; done &); done
                                                   # load on embedder: it autoscales from 1 up to 4, then back
  %[6]s apply -f %[4]s --dry-run   # edit the file, then apply it without --dry-run
  CONSUL_HTTP_ADDR=%[1]s %[7]s catalog services -tags

Logs: %[8]s/*.log. Press Ctrl-C to stop everything.
`, consul.HTTPAddr, *apiAddr, *public, meshFile, *mesh, bin, consulBinary(), *workDir)
	<-ctx.Done()
	log.Info("stopping the demo")
	return nil
}

// demoStackModel is the demo's mesh: replicas are `servemesh demo-replica`
// processes the agent runs.
func demoStackModel(self string) *model.Model {
	backend := func(name string, replicas int) model.Backend {
		return model.Backend{Name: name, Config: model.BackendConfig{NumReplicas: replicas, CPUs: 1, MaxConcurrentQueries: 16},
			Process: &model.ProcessSpec{Command: self, Args: []string{"demo-replica", "--backend", name, "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
	}
	embedder := backend("embedder", 0)
	embedder.Config.MaxConcurrentQueries = 2
	embedder.Config.Autoscaling = &model.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 4, TargetInFlight: 2,
		MetricsIntervalS: 0.5, LookBackPeriodS: 5, UpscaleDelayS: 2, DownscaleDelayS: 20}
	embedder.Config.NumReplicas = 1
	return &model.Model{
		Backends: []model.Backend{backend("model-v1", 2), backend("model-v2", 1), backend("model-v3-candidate", 1), embedder},
		Endpoints: []model.Endpoint{
			{Name: "model", Route: "/model", Methods: []string{"GET", "POST"},
				Traffic: map[string]float64{"model-v1": 0.9, "model-v2": 0.1}, Shadows: map[string]float64{"model-v3-candidate": 0.2}},
			{Name: "embeddings", Traffic: map[string]float64{"embedder": 1}},
		},
	}
}

func startChild(bin string, args, env []string, logPath string) (*exec.Cmd, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	c := exec.Command(bin, args...) //nolint:noctx // stopped by stopChild, gracefully
	c.Env = append(os.Environ(), env...)
	c.Stdout, c.Stderr = logFile, logFile
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return c, c.Start()
}

// stopChild asks a child to stop, and kills it if it has not within 15s.
func stopChild(c *exec.Cmd) {
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	_ = c.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = c.Process.Kill()
		<-done
	}
}

func untilCtx(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

func consulBinary() string {
	if p, err := devconsul.Find(); err == nil {
		return p
	}
	return "consul"
}
