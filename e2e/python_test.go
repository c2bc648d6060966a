//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/dev/devjaeger"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// pythonBin is the project's Python with pytest, which `make tools`
// installs.
func pythonBin(t *testing.T) string {
	t.Helper()
	bin, err := filepath.Abs("../.tools/py-venv/bin/python")
	if err == nil {
		err = exec.CommandContext(context.Background(), bin, "-m", "pytest", "--version").Run()
	}
	if err != nil {
		t.Fatalf("the project's Python with pytest is required (`make tools` installs it): %v", err)
	}
	return bin
}

// TestPythonClient runs the Python client's pytest suite
// (clients/python/tests) against live controllers with the real Consul: a
// leader and a standby, with a token, the standby serving HTTPS. The
// suite drives Ray Serve's verbs, checks the typed errors, has the client
// follow the leader from the standby and past a dead server, and verify
// the standby's certificate with a CA file; the replica runtime's spans
// are read back from a real Jaeger.
func TestPythonClient(t *testing.T) {
	t.Parallel()
	python := pythonBin(t)
	consul := startConsul(t)
	tokenFile := writeToken(t, "python-token-0123456789abcdef")
	args := []string{"--plaintext", "--token-file", tokenFile}
	leader := startController(t, consul, "py-c1", args)
	leader.waitLeading(20 * time.Second)
	ca, dir := newTestCA(t), t.TempDir()
	ca.issue(t, dir, 400)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	standby := startController(t, consul, "py-c2", append(args, "--api-tls-cert", filepath.Join(dir, "cert.pem"), "--api-tls-key", filepath.Join(dir, "key.pem")))
	// The replica runtime's traces go to a real Jaeger.
	jaeger, err := devjaeger.Start(context.Background(), t.TempDir(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer jaeger.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--ignore", "tests/mesh", "tests")
	cmd.Dir = "../clients/python"
	cmd.Env = append(os.Environ(), "SERVEMESH_TEST_LEADER="+leader.apiAddr, "SERVEMESH_TEST_STANDBY=https://"+standby.apiAddr,
		"SERVEMESH_TEST_TOKEN_FILE="+tokenFile, "SERVEMESH_TEST_CA_FILE="+caFile,
		"SERVEMESH_TEST_JAEGER_OTLP="+jaeger.OTLP, "SERVEMESH_TEST_JAEGER_QUERY="+jaeger.Query)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pytest: %v\n%s", err, out)
	}
	t.Logf("pytest:\n%s", lastLines(string(out), 5))
}

// TestPythonServed runs the Python client's mesh suite
// (clients/python/tests/mesh) on the default mesh (mTLS, two nodes), its
// backends the Python replica runtime: each of Ray Serve's calls returns
// once the change is served, so a request right after it, through either
// node, gets the new state's answer; a crash-looping backend fails the
// call at once; a Ray Serve config file (testdata/pymodel/serve_config.yaml)
// is applied as it is and served, its ingress calling its other
// deployment through a handle.
func TestPythonServed(t *testing.T) {
	t.Parallel()
	python, runtime, src, models := pythonReplicas(t)
	mesh := startTwoNodeMeshWith(t, "pys", nil, []string{"--allow-command", python, "--allow-command", servemeshBin})
	replica, err := json.Marshal([]string{python, runtime, "--path", src, "--path", models, "--host", "${HOST}", "--port", "${PORT}", "model:Model"})
	if err != nil {
		t.Fatal(err)
	}
	rayFlags, err := json.Marshal([]string{"--python", python, "--runtime", runtime, "--path", src, "--path", venvPackages(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// -x: the first failure ends the run with its report, before the
	// bound above would kill pytest and lose it.
	cmd := exec.CommandContext(ctx, pythonBin(t), "-m", "pytest", "-x", "-q", "-s", "-p", "no:cacheprovider", "tests/mesh")
	cmd.Dir = "../clients/python"
	cmd.Env = append(os.Environ(), "SERVEMESH_TEST_MESH_SERVER="+mesh.ctl.apiAddr, "SERVEMESH_TEST_MESH_TOKEN_FILE="+mesh.ctl.tokenFile(),
		"SERVEMESH_TEST_MESH_PUBLIC="+mesh.n1.public+","+mesh.n2.public, "SERVEMESH_TEST_REPLICA_ARGS="+string(replica),
		"SERVEMESH_TEST_BIN="+servemeshBin, "SERVEMESH_TEST_RAY_CONFIG="+filepath.Join(models, "serve_config.yaml"), "SERVEMESH_TEST_RAY_FLAGS="+string(rayFlags))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pytest: %v\n%s", err, out)
	}
	t.Logf("pytest:\n%s", out)
}

// TestPythonAsyncStreaming serves an async model class that streams its
// answer (e2e/testdata/pymodel/streaming.py) on the asyncio runtime
// (servemesh.asgi under uvicorn), on the default mesh (mTLS, two nodes),
// split between two backends of it and mirrored to a third: through
// either node, each Server-Sent Event comes as the model yields it (the
// first before the model makes the rest), from both backends of the
// split, while the shadow gets its copies.
func TestPythonAsyncStreaming(t *testing.T) {
	t.Parallel()
	python, runtime, src, models := pythonReplicas(t)
	packages := venvPackages(t)
	mesh := startTwoNodeMeshWith(t, "pystream", nil, []string{"--allow-command", python})
	process := func() *meshspec.ProcessSpec {
		return &meshspec.ProcessSpec{Command: python, HealthPath: "/-/healthz",
			Args: []string{runtime, "--path", src, "--path", models, "--path", packages, "--server", "asyncio", "--host", "${HOST}", "--port", "${PORT}", "streaming:Streamer"}}
	}
	mesh.createBackends(t,
		meshspec.Backend{Name: "sa", Process: process(), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}},
		meshspec.Backend{Name: "sb", Process: process(), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}},
		meshspec.Backend{Name: "sc", Process: process(), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}})
	ctx := context.Background()
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "tokens", Route: "/tokens", Methods: []string{"POST"},
		Traffic: map[string]float64{"sa": 0.5, "sb": 0.5}, Shadows: map[string]float64{"sc": 1}}); err != nil {
		t.Fatal(err)
	}
	if err := mesh.c.WaitServed(ctx, api.ServedQuery{Endpoints: []string{"tokens"}}, nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil { // the replicas look for the release files here
		t.Fatal(err)
	}
	before := mirroredTo(mesh.n1, "sc") + mirroredTo(mesh.n2, "sc")
	backends := map[string]int{}
	var firsts []time.Duration
	for i := range 12 {
		node := []*mtlsNode{mesh.n1, mesh.n2}[i%2]
		release := filepath.Join(dir, fmt.Sprintf("release-%d", i))
		first, events := streamEvents(t, "http://"+node.public+"/tokens?release="+release, release)
		firsts = append(firsts, first)
		if len(events) != 4 {
			t.Fatalf("stream %d through %s: %d events %v; want 4", i, node.id, len(events), events)
		}
		backends[events[0].Backend]++
	}
	if backends["sa"] == 0 || backends["sb"] == 0 || len(backends) != 2 {
		t.Errorf("the streams came from %v; want both backends of the split", backends)
	}
	testutil.WaitFor(t, 10*time.Second, "the shadow to get its copies", func() bool {
		return mirroredTo(mesh.n1, "sc")+mirroredTo(mesh.n2, "sc")-before >= 12
	})
	slices.Sort(firsts)
	t.Logf("time to the first event through the mesh (split and shadowed), 12 streams: median %s, max %s", firsts[len(firsts)/2], firsts[len(firsts)-1])
}

// TestPythonPipeline: a two-stage pipeline on the default mesh (mTLS,
// two nodes): the router backend's async model calls the embed endpoint
// through a handle (servemesh.get_handle, its node's mesh listener), once
// for an answer and once streamed, and streams both back. The embed
// endpoint is split between two backends, one of them necessarily on the
// other node: the handles' calls follow the split and cross the inbound
// hop over mTLS.
func TestPythonPipeline(t *testing.T) {
	t.Parallel()
	python, runtime, src, models := pythonReplicas(t)
	packages := venvPackages(t)
	mesh := startTwoNodeMeshWith(t, "pypipe", nil, []string{"--allow-command", python})
	process := func(class string) *meshspec.ProcessSpec {
		return &meshspec.ProcessSpec{Command: python, HealthPath: "/-/healthz",
			Args: []string{runtime, "--path", src, "--path", models, "--path", packages, "--host", "${HOST}", "--port", "${PORT}", "pipeline:" + class}}
	}
	// 2.5 + 2.5 CPUs cannot share a 4-CPU node: embed-a runs on the node
	// the router does not.
	mesh.createBackends(t,
		meshspec.Backend{Name: "router", Process: process("Router"), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 2.5}},
		meshspec.Backend{Name: "embed-a", Process: process("Embed"), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 2.5}},
		meshspec.Backend{Name: "embed-b", Process: process("Embed"), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}})
	ctx := context.Background()
	for _, e := range []meshspec.Endpoint{
		// Headless (in the mesh only), created as Ray Serve's
		// create_endpoint made it: no methods, so GET alone; the router's
		// handle calls it with a body all the same, as Ray's handles do
		// (issue 62, 6: the mesh answered 405).
		{Name: "embed", Traffic: map[string]float64{"embed-a": 0.5, "embed-b": 0.5}},
		{Name: "pipeline", Route: "/pipeline", Methods: []string{"POST"}, Traffic: map[string]float64{"router": 1}},
	} {
		if _, err := mesh.c.CreateEndpoint(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := mesh.c.WaitServed(ctx, api.ServedQuery{Endpoints: []string{"embed", "pipeline"}}, nil); err != nil {
		t.Fatal(err)
	}
	if router, embedA := placements(t, mesh.c, "router"), placements(t, mesh.c, "embed-a"); router[0].Node == embedA[0].Node {
		t.Fatalf("router and embed-a both on %s; the test wants the handle's calls to cross nodes", router[0].Node)
	}
	embedded, streamed := map[string]int{}, map[string]int{}
	for i := range 16 {
		node := []*mtlsNode{mesh.n1, mesh.n2}[i%2]
		events := pipelineEvents(t, "http://"+node.public+"/pipeline")
		if len(events) != 4 || events[0]["stage"] != "router" || fmt.Sprint(events[0]["vector"]) != "[5]" {
			t.Fatalf("pipeline %d through %s: %v; want the router's stage with embed's vector, then 3 tokens", i, node.id, events)
		}
		embedded[fmt.Sprint(events[0]["embedded_by"])]++
		for _, e := range events[1:] {
			streamed[fmt.Sprint(e["backend"])]++
		}
	}
	for what, by := range map[string]map[string]int{"embedded": embedded, "streamed tokens": streamed} {
		if by["embed-a"] == 0 || by["embed-b"] == 0 {
			t.Errorf("%s by %v; want both backends of embed's split", what, by)
		}
	}
	t.Logf("16 pipelines through both nodes: embedded by %v, tokens streamed by %v", embedded, streamed)
}

// pipelineEvents POSTs a text to url asking for Server-Sent Events and
// returns each event's data.
func pipelineEvents(t *testing.T, url string) []map[string]any {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(`{"text":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, body)
	}
	var out []map[string]any
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if data, ok := strings.CutPrefix(lines.Text(), "data: "); ok {
			var e map[string]any
			if err := json.Unmarshal([]byte(data), &e); err != nil {
				t.Fatalf("event %q: %v", data, err)
			}
			out = append(out, e)
		}
	}
	return out
}

type streamEvent struct {
	Backend string `json:"backend"`
	Chunk   int    `json:"chunk"`
}

// streamEvents POSTs to url asking for Server-Sent Events, reads the
// first, creates release (the model then makes the rest) and reads the
// rest; it returns how long the first took and every event.
func streamEvents(t *testing.T, url, release string) (time.Duration, []streamEvent) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(`{"prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	start := time.Now()
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	lines := bufio.NewScanner(resp.Body)
	var events []streamEvent
	var first time.Duration
	for lines.Scan() {
		data, ok := strings.CutPrefix(lines.Text(), "data: ")
		if !ok {
			continue
		}
		var e streamEvent
		if err := json.Unmarshal([]byte(data), &e); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		events = append(events, e)
		if len(events) == 1 {
			// The model holds the rest until this file exists: the first
			// event came unbuffered.
			first = time.Since(start)
			if err := os.WriteFile(release, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := lines.Err(); err != nil {
		t.Fatal(err)
	}
	return first, events
}

// venvPackages is the project's Python's site-packages folder: the
// replicas' --path to its packages (uvicorn, Starlette, the OpenTelemetry
// SDK), as the system's Python runs them.
func venvPackages(t *testing.T) string {
	t.Helper()
	found, _ := filepath.Glob("../.tools/py-venv/lib/python3*/site-packages/uvicorn")
	if len(found) == 0 {
		t.Fatal("uvicorn is required in the project's Python (`make tools` installs it)")
	}
	packages, err := filepath.Abs(filepath.Dir(found[0]))
	if err != nil {
		t.Fatal(err)
	}
	return packages
}

// TestPythonBackend serves a Python model class (e2e/testdata/pymodel)
// with the Python replica runtime, as processes the agents run, on the
// default mesh (mTLS, two nodes): split 3:1 between two backends of it,
// half mirrored to a third, and one backend's user_config reaching its
// replicas' reconfigure method.
func TestPythonBackend(t *testing.T) {
	t.Parallel()
	python, runtime, src, models := pythonReplicas(t)
	mesh := startTwoNodeMeshWith(t, "py", nil, []string{"--allow-command", python})
	process := func() *meshspec.ProcessSpec {
		return &meshspec.ProcessSpec{Command: python, HealthPath: "/-/healthz", ReconfigurePath: "/-/reconfigure",
			Args: []string{runtime, "--path", src, "--path", models, "--host", "${HOST}", "--port", "${PORT}", "model:Model"}}
	}
	var uc meshspec.UserConfig
	if err := uc.UnmarshalJSON([]byte(`{"threshold": 0.3}`)); err != nil {
		t.Fatal(err)
	}
	mesh.createBackends(t,
		meshspec.Backend{Name: "pya", Process: process(), Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1, UserConfig: uc}},
		meshspec.Backend{Name: "pyb", Process: process(), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}},
		meshspec.Backend{Name: "pyc", Process: process(), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}})
	ctx := context.Background()
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "pyep", Route: "/pyep", Traffic: map[string]float64{"pya": 0.75, "pyb": 0.25},
		Shadows: map[string]float64{"pyc": 0.5}}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + mesh.n1.public + "/pyep"
	defer func() { // on failure, what the endpoint answers
		if t.Failed() {
			t.Logf("GET %s: %v", url, do(httpClient(), http.MethodGet, url, ""))
		}
	}()
	waitReplicasAnswer(t, "the Python replicas to answer", url, 3, 60)
	testutil.WaitFor(t, 20*time.Second, "pya's replicas to take their user_config", func() bool {
		for range 20 {
			var got struct {
				Backend string         `json:"backend"`
				Config  map[string]any `json:"config"`
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err := doJSON(req, &got); err != nil || (got.Backend == "pya" && got.Config["threshold"] != 0.3) {
				return false
			}
		}
		return true
	})
	checkSplitAndMirror(t, mesh.n1, url, 400, "pyb", 0.25, "pyc", 0.5)
}

// TestPythonMultiplexedModels: Python replicas whose model class uses
// servemesh.replica's multiplexed (Ray Serve's @serve.multiplexed: two
// models held per replica, loaded by the serve_multiplexed_model_id each
// request names), on the default mesh (mTLS, two nodes), with the
// backend's max_models_per_replica: each node's picker sends a model's
// requests to a replica that holds it (what it sent there, and what the
// runtime lists at /-/metrics), and calling nodes hash the model to the
// node. Four models through both nodes, 40 requests: each model settles
// on one replica, so few loads.
func TestPythonMultiplexedModels(t *testing.T) {
	t.Parallel()
	python, runtime, src, models := pythonReplicas(t)
	mesh := startTwoNodeMeshWith(t, "pymux", nil, []string{"--allow-command", python})
	mesh.createBackends(t, meshspec.Backend{Name: "pymx",
		Process: &meshspec.ProcessSpec{Command: python, HealthPath: "/-/healthz",
			Args: []string{runtime, "--path", src, "--path", models, "--host", "${HOST}", "--port", "${PORT}", "adapters:Adapters"}},
		Config: meshspec.BackendConfig{NumReplicas: 4, CPUs: 0.5,
			LoadAware: &meshspec.LoadAware{PromptAffinity: true, MaxModelsPerReplica: 2, MetricsPath: "/-/metrics"}}})
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "pymx", Route: "/pymx", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"pymx": 1}}); err != nil {
		t.Fatal(err)
	}
	mesh.waitPassing(t, "pymx", 4, "http://"+mesh.n1.public+"/pymx")
	loads, replicas := 0, map[string]map[string]bool{} // model: the replicas that answered it
	for i := range 40 {
		model := fmt.Sprintf("adapter-%d", (i*3)%4)
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+[]*mtlsNode{mesh.n1, mesh.n2}[i%2].public+"/pymx",
			strings.NewReader(`{"prompt":"hi"}`))
		req.Header.Set("serve_multiplexed_model_id", model)
		var a struct {
			Replica string `json:"replica"`
			Model   string `json:"model"`
			Loaded  bool   `json:"loaded_model"`
		}
		if err := doJSON(req, &a); err != nil || a.Model != model {
			t.Fatalf("request %d for %s: %+v, %v", i, model, a, err)
		}
		if a.Loaded {
			loads++
		}
		if replicas[model] == nil {
			replicas[model] = map[string]bool{}
		}
		replicas[model][a.Replica] = true
	}
	if loads > 8 {
		t.Errorf("the Python replicas loaded a model %d times for 40 requests of 4 models, want at most 8 (each model settling on one replica); replicas by model: %v", loads, replicas)
	}
	t.Logf("%d model loads for 40 requests of 4 models on 4 Python replicas holding two each; replicas by model: %v", loads, replicas)
}

// pythonReplicas are what Python replicas run: the system's python3, the
// replica runtime, its package's folder and the test models' folder.
func pythonReplicas(t *testing.T) (python, runtime, src, models string) {
	t.Helper()
	python, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Fatalf("the system's python3 runs the replicas: %v", err)
	}
	runtime, _ = filepath.Abs("../clients/python/src/servemesh/replica.py")
	src, _ = filepath.Abs("../clients/python/src")
	models, _ = filepath.Abs("testdata/pymodel")
	return python, runtime, src, models
}

// TestPythonReplicasTraceToTheMeshsCollector: a Python backend whose env
// names no collector, on the default mesh (mTLS, two nodes, its replica
// on n2, the request through n1): the agent starts the replica with the
// mesh's collector in the OpenTelemetry SDK's variables, so a traced
// request's trace in a real Jaeger holds the runtime's span, of the
// backend's service, the child of n2's Envoy's span that sent it there.
func TestPythonReplicasTraceToTheMeshsCollector(t *testing.T) {
	t.Parallel()
	// The system's Python runs the replica (the backend's own user cannot
	// read the project venv's interpreter), with the venv's packages, the
	// OpenTelemetry SDK among them, on its path.
	python, runtime, src, models := pythonReplicas(t)
	sdk, _ := filepath.Glob("../.tools/py-venv/lib/python3*/site-packages/opentelemetry/sdk")
	if len(sdk) == 0 {
		t.Fatal("the OpenTelemetry SDK is required in the project's Python (`make tools` installs it)")
	}
	packages, err := filepath.Abs(filepath.Dir(filepath.Dir(sdk[0])))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	jaeger, err := devjaeger.Start(ctx, t.TempDir(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer jaeger.Stop()
	mesh := startTwoNodeMeshWith(t, "pyt", nil, []string{"--allow-command", python})
	if _, err := mesh.c.NodeAction(ctx, mesh.n1.id, api.Cordon); err != nil {
		t.Fatal(err)
	}
	all := 100.0
	if _, err := mesh.c.SetTracing(ctx, &meshspec.Tracing{Collector: jaeger.OTLP, SamplingPercent: &all}); err != nil {
		t.Fatal(err)
	}
	mesh.createBackends(t, meshspec.Backend{Name: "pyt", Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1},
		Process: &meshspec.ProcessSpec{Command: python, HealthPath: "/-/healthz",
			Args: []string{runtime, "--path", src, "--path", models, "--path", packages, "--host", "${HOST}", "--port", "${PORT}", "model:Model"}}})
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "pyt", Route: "/pyt", Traffic: map[string]float64{"pyt": 1}}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + mesh.n1.public + "/pyt"
	waitReplicasAnswer(t, "the Python replica to answer", url, 1, 60)
	id := randomHex(t, 16)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("traceparent", "00-"+id+"-"+randomHex(t, 8)+"-01")
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a traced request to /pyt: %d", resp.StatusCode)
	}
	var tr *devjaeger.Trace
	testutil.WaitFor(t, 30*time.Second, "the Python replica's span in trace "+id, func() bool {
		tr, err = jaeger.Trace(ctx, id)
		return err == nil && slices.ContainsFunc(tr.Spans, func(s devjaeger.Span) bool { return s.OperationName == "replica GET" })
	})
	span := spanNamed(t, tr, "replica GET")
	if service := tr.Processes[span.ProcessID].ServiceName; service != "pyt" {
		t.Errorf("the replica's span is of service %q; want the backend's name, pyt", service)
	}
	parent, ok := spanByID(tr, parentOf(span))
	if want := wire.TraceService(mesh.n2.id); !ok || tr.Processes[parent.ProcessID].ServiceName != want {
		t.Fatalf("the replica's span's parent %q is not a span of n2's Envoy (%s):\n%s", parentOf(span), want, describeTrace(tr))
	}
	t.Logf("the Python replica's span %q (service pyt) under %q", span.OperationName, parent.OperationName)
}
