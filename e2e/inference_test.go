//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestInferenceServing serves model traffic on the default mesh (mTLS, two
// nodes, so requests cross the inbound hop), with stand-in model servers
// (servemesh demo-model-server: a batch of 4 that slows as it grows, vLLM's
// load gauges at /metrics). One mesh for the four parts.
func TestInferenceServing(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "inf")
	locks := t.TempDir()
	if err := os.Chmod(locks, 0o777); err != nil { // replicas may run as another user
		t.Fatal(err)
	}
	t.Run("load-aware picking sends a slow replica less than least requests does", func(t *testing.T) { loadAwarePicking(t, mesh, locks) })
	t.Run("a replica whose server reports a long queue gets few requests", func(t *testing.T) { serverGauges(t, mesh, locks) })
	t.Run("a replica's forged load reports steer nothing", func(t *testing.T) { forgedReports(t, mesh, locks) })
	t.Run("OpenAI-style requests are split and mirrored per model", func(t *testing.T) { modelRouting(t, mesh) })
	t.Run("a model's requests are rewritten to two adapters by weight", func(t *testing.T) { modelRewrite(t, mesh) })
	t.Run("under overload critical requests succeed while sheddable ones get 429", func(t *testing.T) { shedding(t, mesh) })
}

// modelServer runs stand-in model servers of backend, with args.
func modelServer(backend string, args ...string) *meshspec.ProcessSpec {
	return &meshspec.ProcessSpec{Command: servemeshBin, HealthPath: "/health",
		Args: append([]string{"demo-model-server", "--backend", backend, "--listen", "${HOST}:${PORT}"}, args...)}
}

// vllmGauges are the stand-in's gauges, by vLLM's names.
var vllmGauges = &meshspec.LoadAware{MetricsPath: "/metrics", QueueMetric: "vllm:num_requests_waiting",
	RunningMetric: "vllm:num_requests_running", KVCacheMetric: "vllm:kv_cache_usage_perc"}

// inferenceLoad is how long each run of loadAwarePicking sends requests:
// INFERENCE_LOAD_S seconds (bench/inference sets it), 12 by default.
func inferenceLoad(t *testing.T) time.Duration { return loadSeconds(t, "INFERENCE_LOAD_S", 12) }

// loadSeconds is how long a load run lasts: env's whole seconds
// (bench/inference sets them), else def.
func loadSeconds(t *testing.T, env string, def int) time.Duration {
	if s := os.Getenv(env); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want whole seconds", env, s)
		}
		return time.Duration(n) * time.Second
	}
	return time.Duration(def) * time.Second
}

// loadAwarePicking: two backends of three replicas each, one replica of
// each three times slower (the first to take its lock), one picked by load
// and one by least requests, get the same fixed rate of requests at once,
// entering at both nodes; and so do three more behind a minimal
// hand-written Envoy picking by least requests, the baseline without the
// mesh. The load-aware one sends its slow replica a share well under a
// third, and the figures of all three go to the log (bench/inference
// collects them for BENCHMARKS.md).
func loadAwarePicking(t *testing.T, mesh *twoNodeMesh, locks string) {
	server := func(b string) *meshspec.ProcessSpec {
		return modelServer(b, "--slots", "4", "--service", "20ms", "--slow-lock", filepath.Join(locks, b), "--slow-factor", "3")
	}
	la := vllmGauges
	mesh.createBackends(t,
		meshspec.Backend{Name: "la", Process: server("la"), Config: meshspec.BackendConfig{NumReplicas: 3, CPUs: 0.5, LoadAware: la}},
		meshspec.Backend{Name: "lr", Process: server("lr"), Config: meshspec.BackendConfig{NumReplicas: 3, CPUs: 0.5}})
	for _, name := range []string{"la", "lr"} {
		if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: name + "-ep", Route: "/" + name, Methods: []string{"GET", "POST"},
			Traffic: map[string]float64{name: 1}}); err != nil {
			t.Fatal(err)
		}
		waitReplicasAnswer(t, "the replicas of "+name, "http://"+mesh.n1.public+"/"+name, 3, 60)
	}
	baseline := startBaselineEnvoy(t, locks)
	const rate = 70 // requests a second to each backend
	d := inferenceLoad(t)
	var wg sync.WaitGroup
	runs := map[string]*openLoop{}
	urls := map[string][]string{"baseline": {"http://" + baseline}}
	for _, name := range []string{"la", "lr"} {
		urls[name] = []string{"http://" + mesh.n1.public + "/" + name, "http://" + mesh.n2.public + "/" + name}
	}
	for name, u := range urls {
		l := &openLoop{urls: u, body: `{"model": "m", "prompt": "hi"}`}
		runs[name] = l
		wg.Add(1)
		go func() { defer wg.Done(); l.run(rate, d) }()
	}
	wg.Wait()
	alone := map[string]bool{"la": slowAlone(t, mesh, locks, "la"), "lr": slowAlone(t, mesh, locks, "lr")}
	for _, name := range []string{"la", "lr", "baseline"} {
		l := runs[name]
		if l.failed > 0 || l.leaked > 0 {
			t.Errorf("%s: %d of %d requests failed (first: %s), %d answers showed a load report", name, l.failed, len(l.ttfb)+l.failed, l.firstFailure, l.leaked)
		}
		p50, p99 := l.percentile(0.5), l.percentile(0.99)
		t.Logf("BENCH inference picker=%s rate=%d/s seconds=%.0f requests=%d slow_share=%.3f ttfb_p50_ms=%.1f ttfb_p99_ms=%.1f slow_alone_on_its_node=%v",
			map[string]string{"la": "load-aware", "lr": "least-request", "baseline": "envoy-least-request"}[name], rate, d.Seconds(), len(l.ttfb), l.oddShare(), ms(p50), ms(p99), alone[name])
	}
	if share := runs["la"].oddShare(); share >= 0.25 {
		t.Errorf("the load-aware picker sent the replica three times slower %.3f of the requests, want well under a third (its capacity's share is a seventh)", share)
	}
}

// slowAlone reports whether backend's slow replica (the one that took its
// lock in locks) is the only replica of backend on its node: then its node's
// picker has no other to send to, and the calling nodes' weights alone
// send it less.
func slowAlone(t *testing.T, mesh *twoNodeMesh, locks, backend string) bool {
	t.Helper()
	tag, err := os.ReadFile(filepath.Join(locks, backend))
	if err != nil {
		t.Fatalf("the slow replica of %s: %v", backend, err)
	}
	status, err := mesh.c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]int{}
	slowNode := ""
	for _, b := range status.Backends {
		for _, r := range b.Replicas {
			if b.Name == backend {
				nodes[r.Node]++
				if r.Tag == strings.TrimSpace(string(tag)) {
					slowNode = r.Node
				}
			}
		}
	}
	if slowNode == "" {
		t.Fatalf("the slow replica %q of %s is not in the status", tag, backend)
	}
	return nodes[slowNode] == 1
}

// startBaselineEnvoy runs three stand-in model servers like the mesh's,
// one three times slower (it takes the lock "baseline" in locks), behind
// a minimal hand-written Envoy that picks them by least requests
// (testdata/inference-baseline.yaml), and returns its address.
func startBaselineEnvoy(t *testing.T, locks string) string {
	t.Helper()
	return startBaselineEnvoyOf(t, 3, "--slots", "4", "--service", "20ms", "--slow-lock", filepath.Join(locks, "baseline"), "--slow-factor", "3")
}

// startBaselineEnvoyOf runs n stand-in model servers with args behind the
// minimal hand-written Envoy (least requests) and returns its address.
func startBaselineEnvoyOf(t *testing.T, n int, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	var ports []uint32
	for i := range n {
		addr := freeAddr(t)
		out, err := os.Create(filepath.Join(dir, fmt.Sprintf("server-%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		p, err := proc.Start(proc.Spec{Path: servemeshBin, Stdout: out, Stderr: out, Env: append(os.Environ(), "SERVEMESH_REPLICA_TAG="+fmt.Sprintf("baseline#%06d", i)),
			Args: append([]string{"demo-model-server", "--backend", "baseline", "--listen", addr}, args...)})
		_ = out.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Stop(time.Second) })
		ports = append(ports, testutil.Port(addr))
		testutil.WaitFor(t, 10*time.Second, "stand-in server "+addr, func() bool {
			resp, err := httpClient().Get("http://" + addr + "/health") //nolint:noctx // test helper
			if err == nil {
				_ = resp.Body.Close()
			}
			return err == nil
		})
	}
	listen := freeAddr(t)
	tmpl := template.Must(template.ParseFiles("testdata/inference-baseline.yaml"))
	config := filepath.Join(dir, "envoy.yaml")
	f, err := os.Create(config)
	if err != nil {
		t.Fatal(err)
	}
	admin := filepath.Join(dir, "admin.sock")
	err = tmpl.Execute(f, map[string]any{"Admin": admin, "Port": testutil.Port(listen), "Servers": ports})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	p, err := envoy.Start(envoy.Config{Binary: envoyBin, ConfigPath: config, Dir: dir, AdminSocket: admin, LogPath: filepath.Join(dir, "envoy.log"),
		Concurrency: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background(), 0) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return listen
}

// serverGauges: two replicas, equally fast, one of whose metrics say 5
// requests wait (queue_limit 3: saturated): the nodes' pickers read it and
// send that replica few requests (its own node's picker none while the
// other is beside it; the callers weigh its node at a tenth otherwise).
func serverGauges(t *testing.T, mesh *twoNodeMesh, locks string) {
	mesh.createBackends(t, meshspec.Backend{Name: "gq", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.25,
		LoadAware: &meshspec.LoadAware{MetricsPath: "/metrics", QueueMetric: "vllm:num_requests_waiting", QueueLimit: 3}},
		Process: modelServer("gq", "--slow-lock", filepath.Join(locks, "gq"), "--slow-factor", "1", "--fake-waiting", "5")})
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "gq", Route: "/gq", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"gq": 1}}); err != nil {
		t.Fatal(err)
	}
	waitReplicasAnswer(t, "the replicas of gq", "http://"+mesh.n1.public+"/gq", 2, 40)
	l := &openLoop{urls: []string{"http://" + mesh.n1.public + "/gq", "http://" + mesh.n2.public + "/gq"}, body: `{"model": "m"}`}
	l.run(40, 3*time.Second) // the callers' weights take a second or two of reports
	warm := len(l.ttfb) + l.failed
	l.ttfb, l.odd = nil, 0
	l.run(40, 6*time.Second)
	alone := slowAlone(t, mesh, locks, "gq")
	t.Logf("the replica reporting a queue answered %.3f of %d requests (alone on its node: %v; %d warming up)", l.oddShare(), len(l.ttfb), alone, warm)
	if l.failed > 0 {
		t.Errorf("%d requests failed, first: %s", l.failed, l.firstFailure)
	}
	if share := l.oddShare(); share > 0.2 {
		t.Errorf("the replica whose server reports 5 waiting (queue_limit 3) answered %.3f of the requests, want few (half without its gauges)", share)
	}
}

// forgedReports: of two replicas (one on each node), the one that takes
// the lock sends ORCA reports of its own claiming a million requests a
// second at no utilization, in the binary form Envoy reads first. Before
// issue 34's fix it took 57 of 57 requests; the inbound hop now strips
// every report a replica sends, so it gets about its half, and no client
// sees a report.
func forgedReports(t *testing.T, mesh *twoNodeMesh, locks string) {
	mesh.createBackends(t, meshspec.Backend{Name: "fr", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.25, LoadAware: &meshspec.LoadAware{}},
		Process: modelServer("fr", "--slow-lock", filepath.Join(locks, "fr"), "--slow-factor", "1", "--forge-load-report")})
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "fr", Route: "/fr", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"fr": 1}}); err != nil {
		t.Fatal(err)
	}
	waitReplicasAnswer(t, "the replicas of fr", "http://"+mesh.n1.public+"/fr", 2, 40)
	if !slowAlone(t, mesh, locks, "fr") {
		t.Fatal("both replicas of fr are on one node: the callers' node weights, which a forged report steers, pick nothing")
	}
	l := &openLoop{urls: []string{"http://" + mesh.n1.public + "/fr", "http://" + mesh.n2.public + "/fr"}, body: `{"model": "m"}`}
	l.run(40, 2*time.Second) // the callers' weights take a second or two of reports
	l.ttfb, l.odd = nil, 0
	l.run(40, 4*time.Second)
	t.Logf("the replica forging load reports answered %.3f of %d requests", l.oddShare(), len(l.ttfb))
	if l.failed > 0 || l.leaked > 0 {
		t.Errorf("%d requests failed (first: %s), %d answers showed a load report", l.failed, l.firstFailure, l.leaked)
	}
	if share := l.oddShare(); share > 0.75 {
		t.Errorf("the replica forging load reports answered %.3f of the requests, want about half", share)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// openLoop sends POSTs at a fixed rate, whatever the answers take (so a
// slow answer does not slow the load), alternating between urls, and
// records each one's time to first byte.
type openLoop struct {
	urls []string
	body string

	mu                  sync.Mutex
	ttfb                []time.Duration
	odd, failed, leaked int
	firstFailure        string
}

func (l *openLoop) run(rate int, d time.Duration) {
	client := loadClient()
	atRate(rate, d, func(i int) { l.one(client, l.urls[i%len(l.urls)]) })
}

func (l *openLoop) one(client *http.Client, url string) {
	ttfb, answer, header, err := timedPost(client, url, l.body)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if l.failed++; l.firstFailure == "" {
			l.firstFailure = err.Error()
		}
		return
	}
	if header.Get(wire.LoadReportHeader) != "" || header.Get(wire.LoadReportBinHeader) != "" {
		l.leaked++
	}
	l.ttfb = append(l.ttfb, ttfb)
	if answer.Odd { // the replica that took its backend's lock: slower, or faking its queue
		l.odd++
	}
}

// loadClient is the HTTP client of an open loop.
func loadClient() *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
}

// atRate calls send(i), each in a goroutine of its own, rate times a
// second for d whatever the calls take (open loop), and waits for them.
func atRate(rate int, d time.Duration, send func(i int)) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	for i, end := 0, time.Now().Add(d); time.Now().Before(end); i++ {
		<-tick.C
		wg.Go(func() { send(i) })
	}
	wg.Wait()
}

// timedPost POSTs a JSON body to url, with headers given as name, value:
// the time to the answer's first byte, the stand-in model server's answer
// and the answer's headers, or why it failed (a status other than 200
// included).
func timedPost(client *http.Client, url, body string, header ...string) (time.Duration, demoreplica.ModelAnswer, http.Header, error) {
	var first time.Time
	trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	start := time.Now()
	var answer demoreplica.ModelAnswer
	resp, err := client.Do(req)
	if err != nil {
		return 0, answer, nil, err
	}
	err = json.NewDecoder(resp.Body).Decode(&answer)
	_ = resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return first.Sub(start), answer, resp.Header, err
}

// oddShare is the share of the answers from the replica that took its
// backend's lock.
func (l *openLoop) oddShare() float64 {
	if len(l.ttfb) == 0 {
		return math.NaN()
	}
	return float64(l.odd) / float64(len(l.ttfb))
}

func (l *openLoop) percentile(p float64) time.Duration { return percentile(l.ttfb, p) }

// percentile is the p-th (0 to 1) of durations d, 0 for none.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(int(p*float64(len(s))), len(s)-1)]
}

// postModel sends a POST of body to url: its status, the answering
// backend and model (of a 200), and the start of an error's body.
func postModel(client *http.Client, url, body string, header ...string) (status int, backend, modelName, text string, h http.Header) {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", "", err.Error(), nil
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1000))
	var answer struct {
		Backend string `json:"backend"`
		Model   string `json:"model"`
	}
	if resp.StatusCode == http.StatusOK && json.Unmarshal(raw, &answer) == nil {
		return resp.StatusCode, answer.Backend, answer.Model, "", resp.Header
	}
	return resp.StatusCode, "", "", string(raw), resp.Header
}

// modelRewrite: two adapters tried side by side under one public model
// name (model_routing.models.assistant.rewrite: assistant-v1 0.8,
// assistant-v2 0.2) on one load-aware pool with a replica on each node:
// requests for "assistant", through either node, reach the pool rewritten
// (the calling node's picker rewrites the body), their models fitting
// those shares (chi-square); each node's picker counts what it rewrote;
// requests for "base" go on as they are.
func modelRewrite(t *testing.T, mesh *twoNodeMesh) {
	mesh.createBackends(t, meshspec.Backend{Name: "mrw", Process: modelServer("mrw"), Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.25, LoadAware: &meshspec.LoadAware{}}})
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "rewrite", Route: "/v1/rewrite", Methods: []string{"POST"},
		ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{
			"assistant": {Traffic: map[string]float64{"mrw": 1}, Rewrite: map[string]float64{"assistant-v1": 0.8, "assistant-v2": 0.2}},
			"base":      {Traffic: map[string]float64{"mrw": 1}},
		}}}); err != nil {
		t.Fatal(err)
	}
	if nodes := runningOn(placements(t, mesh.c, "mrw")); len(distinct(nodes)) != 2 {
		t.Fatalf("mrw runs on %v, want both nodes", nodes)
	}
	client := httpClient()
	urls := []string{"http://" + mesh.n1.public + "/v1/rewrite", "http://" + mesh.n2.public + "/v1/rewrite"}
	testutil.WaitFor(t, 60*time.Second, "the rewrite to reach both nodes' routes", func() bool {
		for _, u := range urls {
			if status, _, got, _, _ := postModel(client, u, `{"model": "assistant"}`); status != http.StatusOK || !strings.HasPrefix(got, "assistant-v") {
				return false
			}
		}
		return true
	})
	before := 0.0
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		before += metricValue(t, n.metr, "servemesh_picker_model_rewrites_total", "from", "assistant")
	}
	const n = 400
	counts := map[string]int{}
	for i := range n {
		status, _, got, text, _ := postModel(client, urls[i%2], `{"model": "assistant", "messages": [{"role": "user", "content": "<b>hi</b> & more"}]}`)
		if status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, status, text)
		}
		counts[got]++
	}
	checkChiSquare(t, counts, map[string]float64{"assistant-v1": 0.8, "assistant-v2": 0.2}, n)
	after := 0.0
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		after += metricValue(t, n.metr, "servemesh_picker_model_rewrites_total", "from", "assistant")
	}
	if after-before != n {
		t.Errorf("the nodes' pickers counted %v rewrites, want %d", after-before, n)
	}
	for _, u := range urls {
		if status, _, got, text, _ := postModel(client, u, `{"model": "base"}`); status != http.StatusOK || got != "base" {
			t.Errorf("a request for base through %s: status %d, model %q: %s", u, status, got, text)
		}
	}
}

// modelRouting: an OpenAI-style endpoint routes by the body's "model":
// model m-a splits 3:1 over ma1 and ma2 with half mirrored to msh, m-b
// goes to mb; mixed requests fit those shares (chi-square), and bodies
// without a model, with another, or too large get clear 4xx answers.
func modelRouting(t *testing.T, mesh *twoNodeMesh) {
	var backends []meshspec.Backend
	for _, b := range []string{"ma1", "ma2", "mb", "msh"} {
		backends = append(backends, meshspec.Backend{Name: b, Process: modelServer(b), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 0.25}})
	}
	mesh.createBackends(t, backends...)
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "chat", Route: "/v1/chat/completions", Methods: []string{"POST"},
		ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{
			"m-a": {Traffic: map[string]float64{"ma1": 0.75, "ma2": 0.25}, Shadows: map[string]float64{"msh": 0.5}},
			"m-b": {Traffic: map[string]float64{"mb": 1}},
		}}}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + mesh.n1.public + "/v1/chat/completions"
	client := httpClient()
	testutil.WaitFor(t, 60*time.Second, "every backend of both models to answer", func() bool {
		seen := map[string]bool{}
		for i := range 40 {
			if status, b, _, _, _ := postModel(client, url, fmt.Sprintf(`{"model": "m-%c"}`, "ab"[i%2])); status == http.StatusOK {
				seen[b] = true
			}
		}
		return len(seen) == 3
	})
	before := mirroredTo(mesh.n1, "msh")
	const n = 600
	counts := map[string]int{}
	for i := range n {
		want := fmt.Sprintf("m-%c", "ab"[i%2])
		status, b, got, text, _ := postModel(client, url, fmt.Sprintf(`{"model": %q, "messages": [{"role": "user", "content": "hi"}]}`, want))
		if status != http.StatusOK || got != want {
			t.Fatalf("request %d for %s: status %d, model %q from %q: %s", i, want, status, got, b, text)
		}
		counts[b]++
	}
	checkChiSquare(t, counts, map[string]float64{"ma1": 0.375, "ma2": 0.125, "mb": 0.5}, n)
	status, err := mesh.c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, e := range status.Endpoints {
		for _, b := range e.Backends {
			if e.Name == "chat" {
				rows = append(rows, fmt.Sprintf("%s:%s:%g:%g", b.Model, b.Backend, b.Weight, b.Shadow))
			}
		}
	}
	if got := strings.Join(rows, " "); got != "m-a:ma1:0.75:0 m-a:ma2:0.25:0 m-a:msh:0:0.5 m-b:mb:1:0" {
		t.Errorf("the status of chat: %s, want each model's split and shadows", got)
	}
	checkShare(t, "requests for m-a mirrored to msh", int(waitMirrored(t, mesh.n1, "msh", before)-before), n/2, 0.5)
	for _, c := range []struct {
		body   string
		status int
		says   string
	}{
		{`{"messages": []}`, http.StatusBadRequest, `send a JSON object with "model" set to one of: "m-a", "m-b"`},
		{`not json`, http.StatusBadRequest, `routes by the model a JSON body names`},
		{`{"model": "m-z"}`, http.StatusNotFound, `serves no such model; its models are: "m-a", "m-b"`},
		{`{"model": "m-a", "prompt": "` + strings.Repeat("a", meshspec.MaxModelBodyBytes) + `"}`, http.StatusRequestEntityTooLarge, ""},
	} {
		status, _, _, text, h := postModel(client, url, c.body)
		if c.says == "" {
			if status != c.status {
				t.Errorf("%.40s...: status %d %q, want %d", c.body, status, text, c.status)
			}
			continue
		}
		// As OpenAI's API words errors, which its SDKs read.
		var answer struct {
			Error struct{ Message, Type, Param string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(text), &answer); status != c.status || err != nil || !strings.Contains(answer.Error.Message, c.says) ||
			answer.Error.Type != "invalid_request_error" || answer.Error.Param != "model" || h.Get("Content-Type") != "application/json" {
			t.Errorf("%.40s...: status %d %q (%s), want %d, an OpenAI-shaped JSON error saying %q", c.body, status, text, h.Get("Content-Type"), c.status, c.says)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, pythonBin(t), "testdata/openai_errors.py", mesh.n2.public, "m-z", "m-a,m-b").CombinedOutput(); err != nil {
		t.Errorf("the official OpenAI SDK listing the models and naming an unknown one: %v\n%s", err, out)
	}
}

// checkChiSquare fails unless counts (of n) fit the expected shares:
// Pearson's chi-square below its 0.1% critical value.
func checkChiSquare(t *testing.T, counts map[string]int, shares map[string]float64, n int) {
	t.Helper()
	critical := map[int]float64{1: 10.83, 2: 13.82, 3: 16.27}[len(shares)-1]
	chi, total := 0.0, 0
	for name, p := range shares {
		expected := p * float64(n)
		chi += math.Pow(float64(counts[name])-expected, 2) / expected
		total += counts[name]
	}
	if total != n || chi > critical {
		t.Errorf("answers %v of %d, want shares %v: chi-square %.2f (critical %.2f at p=0.001), %d answered by others", counts, n, shares, chi, critical, n-total)
	} else {
		t.Logf("answers %v of %d fit shares %v: chi-square %.2f < %.2f", counts, n, shares, chi, critical)
	}
}

// shedding: one replica that runs 2 requests at a time (max 2 in flight,
// each 200 ms) gets 12 public clients of an endpoint whose requests are
// sheddable (one of them saying critical, which the public listener
// ignores), and one client inside the mesh that says critical:
// every critical request succeeds (waiting at the replica's node), the
// sheddable ones beyond the replica's room get 429 with Retry-After.
func shedding(t *testing.T, mesh *twoNodeMesh) {
	// With the CLI, as an operator would.
	env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr, "SERVEMESH_TOKEN_FILE=" + mesh.ctl.tokenFile()}
	args := []string{"backend", "create", "gen", "--num-replicas", "1", "--cpus", "0.25", "--max-concurrent-queries", "2", "--load-aware",
		"--health-path", "/health", "--command", servemeshBin}
	for _, a := range modelServer("gen", "--slots", "2", "--service", "200ms").Args {
		args = append(args, "--arg", a)
	}
	if code, out, errOut := cli(t, env, args...); code != 0 {
		t.Fatalf("servemesh %s: exit %d: %s %s", strings.Join(args, " "), code, out, errOut)
	}
	if code, out, errOut := cli(t, env, "endpoint", "create", "gen", "--route", "/gen", "--methods", "GET,POST", "--backend", "gen",
		"--criticality", "sheddable"); code != 0 {
		t.Fatalf("servemesh endpoint create: exit %d: %s %s", code, out, errOut)
	}
	if b, err := mesh.c.GetBackend(context.Background(), "gen"); err != nil || b.Config.LoadAware == nil {
		t.Fatalf("backend gen as stored: %+v, %v; want load-aware", b, err)
	}
	url := "http://" + mesh.n1.public + "/gen"
	waitReplicasAnswer(t, "the replica of gen", url, 1, 5)
	type outcome struct {
		critical   bool
		forger     bool
		status     int
		retryAfter string
		text       string
	}
	var mu sync.Mutex
	var outcomes []outcome
	var wg sync.WaitGroup
	end := time.Now().Add(4 * time.Second)
	for i := range 13 {
		// Client 0 is critical, calling from inside the mesh (as a
		// replica would, through the node's mesh listener); client 1 says
		// critical from outside, which the public listener ignores (issue
		// 34: any public client could say so and never be shed).
		critical, forger := i == 0, i == 1
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 30 * time.Second}
			for time.Now().Before(end) {
				to, h := url, []string(nil)
				if critical || forger {
					h = []string{meshspec.CriticalityHeader, string(meshspec.Critical)}
				}
				if critical {
					to, h = "http://"+mesh.n1.mesh+"/", append(h, "Host", "gen")
				}
				status, _, _, text, header := postModel(client, to, `{"model": "gen"}`, h...)
				mu.Lock()
				outcomes = append(outcomes, outcome{critical: critical, forger: forger, status: status, retryAfter: header.Get("Retry-After"), text: text})
				mu.Unlock()
				if status == http.StatusTooManyRequests {
					time.Sleep(50 * time.Millisecond) // a polite client backs off
				}
			}
		}()
	}
	wg.Wait()
	count := map[string]int{}
	for _, o := range outcomes {
		kind := map[bool]string{true: "critical", false: "sheddable"}[o.critical]
		count[fmt.Sprintf("%s %d", kind, o.status)]++
		if o.forger {
			count[fmt.Sprintf("forger %d", o.status)]++
		}
		switch {
		case o.critical && o.status != http.StatusOK:
			t.Errorf("a critical request got %d: %s", o.status, o.text)
		case !o.critical && o.status == http.StatusTooManyRequests && (o.retryAfter != "1" || !strings.Contains(o.text, "saturated")):
			t.Errorf("a shed request's answer: Retry-After %q, body %q", o.retryAfter, o.text)
		case !o.critical && o.status != http.StatusOK && o.status != http.StatusTooManyRequests:
			t.Errorf("a sheddable request got %d: %s", o.status, o.text)
		}
	}
	t.Logf("outcomes: %v", count)
	if count["critical 200"] == 0 || count["sheddable 429"] == 0 || count["sheddable 200"] == 0 {
		t.Errorf("outcomes %v: want critical requests served, and sheddable ones both served and shed", count)
	}
	if count["forger 429"] == 0 {
		t.Errorf("outcomes %v: the public client that says critical was never shed; want it shed like the other sheddable ones", count)
	}
}
