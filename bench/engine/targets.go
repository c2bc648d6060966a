package main

import (
	"context"
	_ "embed" // the baseline's Envoy config
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"text/template"
	"time"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/dev/devllama"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/internal/toolpath"
	"github.com/servemesh/servemesh/meshspec"
)

// engine is llama.cpp's server as `make tools` installs it
// (dev/devllama), each replica's prompt cache of cacheBytes.
type engine struct {
	*devllama.Engine
	cacheBytes int
}

func findEngine(cacheMB int) (*engine, error) {
	e, err := devllama.Find()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(e.Tokenizer(), "tokenizer_config.json")); err != nil {
		return nil, fmt.Errorf("the model's tokenizer for inference-perf (`make tools` writes it): %w", err)
	}
	return &engine{Engine: e, cacheBytes: cacheMB << 20}, nil
}

// findPerf finds inference-perf, which `make bench-tools` installs.
func findPerf() (string, error) {
	return toolpath.Under(filepath.Join("perf-venv", "bin", "inference-perf"))
}

// args are the engine's arguments, on host and port.
func (e *engine) args(host, port string) []string {
	return e.Args("tiny", host, port, e.cacheFlags()...)
}

// cacheFlags bound its prompt cache.
func (e *engine) cacheFlags() []string { return []string{"--cache_size", strconv.Itoa(e.cacheBytes)} }

// target is one configuration measured: start starts it afresh and
// returns its base URL, what reads its engines' logs, and what stops it.
type target struct {
	name  string
	start func(ctx context.Context, dir string) (url string, logs func() []string, stop func(), err error)
}

// meshTarget is a backend of perNode engine replicas on each of the two
// nodes, behind an endpoint at /v1, picked by picker (token-load: prompt
// affinity with load_aware.ttft_budget_ms budgetMs); the load enters at
// the first node.
func meshTarget(mesh *benchenv.Mesh, eng *engine, picker string, perNode, budgetMs int) target {
	n := 0
	return target{name: "servemesh " + picker, start: func(ctx context.Context, _ string) (string, func() []string, func(), error) {
		n++
		name := fmt.Sprintf("%s-%d", picker, n)
		b := meshspec.Backend{Name: name, Config: meshspec.BackendConfig{NumReplicas: 2 * perNode, CPUs: 3 / float64(perNode)},
			Process: eng.Process("tiny", eng.cacheFlags()...)}
		switch picker {
		case "prompt-affinity":
			b.Config.LoadAware = &meshspec.LoadAware{PromptAffinity: true}
		case "token-load":
			b.Config.LoadAware = &meshspec.LoadAware{PromptAffinity: true, TTFTBudgetMs: budgetMs}
		case "load-aware":
			b.Config.LoadAware = &meshspec.LoadAware{}
		}
		stop := func() {
			_, _ = mesh.Client.DeleteEndpoint(ctx, name)
			_, _ = mesh.Client.DeleteBackend(ctx, name)
		}
		// The controller and the nodes may be coming up: a backend is
		// placed once both nodes have registered.
		var err error
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if _, err = mesh.Client.CreateBackend(ctx, meshspec.BackendSpecOf(b)); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			return "", nil, nil, err
		}
		if _, err := mesh.Client.CreateEndpoint(ctx, meshspec.Endpoint{Name: name, Route: "/v1", Methods: []string{"GET", "POST"},
			Traffic: map[string]float64{name: 1}}); err != nil {
			stop()
			return "", nil, nil, err
		}
		wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := mesh.Client.WaitServed(wait, api.ServedQuery{Endpoints: []string{name}}, nil); err != nil {
			stop()
			return "", nil, nil, err
		}
		logs := func() []string {
			var out []string
			for _, dir := range mesh.WorkDirs {
				found, _ := filepath.Glob(filepath.Join(dir, "replicas", name+"-*.log*"))
				out = append(out, found...)
			}
			return out
		}
		return "http://" + mesh.Public[0], logs, stop, nil
	}}
}

// servers starts n engines on loopback, logging into dir.
func servers(eng *engine, dir string, n int) ([]*proc.Process, []string, []string, error) {
	var ps []*proc.Process
	var ports, logs []string
	for i := range n {
		addr := testutil.MustFreeAddr("127.0.0.1")
		port := addr[len("127.0.0.1:"):]
		path := filepath.Join(dir, fmt.Sprintf("engine-%d.log", i))
		f, err := os.Create(path)
		if err != nil {
			return ps, nil, nil, err
		}
		p, err := proc.Start(proc.Spec{Path: eng.Python, Args: eng.args("127.0.0.1", port), Stdout: f, Stderr: f})
		_ = f.Close()
		if err != nil {
			return ps, nil, nil, err
		}
		ps, ports, logs = append(ps, p), append(ports, port), append(logs, path)
	}
	for _, port := range ports {
		if err := ready("http://127.0.0.1:" + port); err != nil {
			return ps, nil, nil, err
		}
	}
	return ps, ports, logs, nil
}

// ready waits until url's server answers its health path.
func ready(url string) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if resp, err := client.Get(url + devllama.HealthPath); err == nil { //nolint:noctx // a readiness probe
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer within a minute", url)
}

// stopAll stops ps.
func stopAll(ps []*proc.Process) {
	for _, p := range ps {
		_ = p.Stop(5 * time.Second)
	}
}

//go:embed baseline.yaml
var baselineConfig string

// envoyTarget is as many engines as the mesh's (servers) behind a
// minimal hand-written Envoy doing round robin: the baseline without the
// mesh.
func envoyTarget(env *benchenv.Env, eng *engine, count int) target {
	tmpl := template.Must(template.New("baseline").Parse(baselineConfig))
	return target{name: "hand-written Envoy, round robin", start: func(_ context.Context, dir string) (string, func() []string, func(), error) {
		ps, ports, logs, err := servers(eng, dir, count)
		if err != nil {
			stopAll(ps)
			return "", nil, nil, err
		}
		addr := testutil.MustFreeAddr("127.0.0.1")
		config := filepath.Join(dir, "envoy.yaml")
		f, err := os.Create(config)
		if err == nil {
			err = tmpl.Execute(f, map[string]any{"Admin": filepath.Join(dir, "admin.sock"), "Port": addr[len("127.0.0.1:"):], "Servers": ports})
			_ = f.Close()
		}
		var envoy *proc.Process
		if err == nil {
			envoy, err = proc.Start(proc.Spec{Path: env.EnvoyBin, Args: []string{"-c", config, "--concurrency", "1", "--log-level", "warning"}})
		}
		if err == nil {
			ps = append(ps, envoy)
			err = ready("http://" + addr)
		}
		if err != nil {
			stopAll(ps)
			return "", nil, nil, err
		}
		return "http://" + addr, func() []string { return logs }, func() { stopAll(ps) }, nil
	}}
}

// directTarget is one engine, called straight.
func directTarget(_ *benchenv.Env, eng *engine) target {
	return target{name: "one server, direct", start: func(_ context.Context, dir string) (string, func() []string, func(), error) {
		ps, ports, logs, err := servers(eng, dir, 1)
		if err != nil {
			stopAll(ps)
			return "", nil, nil, err
		}
		return "http://127.0.0.1:" + ports[0], func() []string { return logs }, func() { stopAll(ps) }, nil
	}}
}
