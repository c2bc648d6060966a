package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

// apiStandIn answers the reads the output tests make, as a controller
// would: one split endpoint, one routed by model, and a backend.
func apiStandIn(t *testing.T) string {
	t.Helper()
	model := meshspec.Endpoint{Name: "model", Route: "/model", Traffic: map[string]float64{"v1": 0.9, "v2": 0.1}, Shadows: map[string]float64{"v3": 0.2}}
	chat := meshspec.Endpoint{Name: "chat", Route: "/v1/chat/completions", Methods: []string{"POST"}, ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{
		"mistral-7b": {Traffic: map[string]float64{"mistral": 1}},
		"llama-3":    {Traffic: map[string]float64{"llama-a": 0.5, "llama-b": 0.5}, Shadows: map[string]float64{"llama-c": 0.1}},
	}}}
	now := time.Now().Unix()
	status := api.StatusReport{Backends: []api.BackendStatus{{Name: "v1", Desired: 3, Running: 3, Ready: 2, Replicas: []api.ReplicaStatus{
		{Tag: "v1#000001", Node: "n1", State: meshspec.Running, Ready: true, Address: "127.0.0.1:9001", Since: now - 150},
		{Tag: "v1#000002", Node: "n2", State: meshspec.Running, Address: "127.0.0.1:9002", Since: now - 3700, Restarts: 4, Note: "exited with status 1 (4 times)\nlast lines..."},
		{Tag: "v1#000003", Node: "n2", State: meshspec.Running, Ready: true, Address: "127.0.0.1:9003"},
	}}}}
	answers := map[string]any{
		"/v1/status":          status,
		"/v1/backends/v1":     meshspec.Backend{Name: "v1", Process: &meshspec.ProcessSpec{Command: "/srv/model"}, Config: meshspec.BackendConfig{NumReplicas: 3}},
		"/v1/endpoints":       []meshspec.Endpoint{chat, model},
		"/v1/endpoints/model": model,
		"/v1/endpoints/chat":  chat,
		"/v1/nodes": []api.NodeReport{{Name: "n1", Registered: true, Replicas: 1, CPUs: 8, MemoryMB: 16384, Version: "v0.2.0", Protocol: 2},
			{Name: "n2", Registered: true, Cordoned: true, Replicas: 2, CPUs: 4, MemoryMB: 8192, Version: "v0.2.0", Protocol: 2,
				Policy: &meshspec.NodePolicy{CPUs: 2, MemoryMB: 4096, AllowedCommands: []string{"/srv/model"}}}},
		"/v1/backends": []meshspec.Backend{{Name: "v1", Protocol: "grpc", Replicas: []meshspec.Replica{
			{Address: "127.0.0.1:9001", Node: "n1"}, {Address: "127.0.0.1:9002", Node: "n2"}, {Address: "127.0.0.1:9003", Node: "n2"}}}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := answers[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestReadsSpeakKubectl: every read takes -o table, wide, json and yaml;
// traffic get shows a split and its shadows, by model where the endpoint
// is routed by model, whose split endpoint list shows too (issue 40: its
// TRAFFIC column was empty).
func TestReadsSpeakKubectl(t *testing.T) {
	unsetClientEnv(t)
	url := apiStandIn(t)
	cli := func(args ...string) string {
		t.Helper()
		code, out, errOut := runCLI(append(args, "--server", url)...)
		if code != 0 {
			t.Fatalf("servemesh %v: code %d, stderr %q", args, code, errOut)
		}
		return out
	}
	if got, want := cli("traffic", "get", "model"), "MODEL  BACKEND  WEIGHT  SHADOW\n-      v1       0.9     -\n-      v2       0.1     -\n-      v3       -       0.2\n"; got != want {
		t.Errorf("traffic get model:\n%s\nwant:\n%s", got, want)
	}
	if got := cli("traffic", "get", "chat"); !strings.Contains(got, "llama-3     llama-a  0.5     -") || !strings.Contains(got, "llama-3     llama-c  -       0.1") ||
		!strings.Contains(got, "mistral-7b  mistral  1       -") {
		t.Errorf("traffic get chat shows no split by model:\n%s", got)
	}
	var split trafficSplit
	if err := yaml.Unmarshal([]byte(cli("traffic", "get", "chat", "-o", "yaml")), &split); err != nil || split.Models["llama-3"].Traffic["llama-b"] != 0.5 {
		t.Errorf("traffic get -o yaml: %+v, %v", split, err)
	}
	list := cli("endpoint", "list")
	if !strings.Contains(list, "model llama-3: llama-a=0.5,llama-b=0.5; model mistral-7b: mistral=1") || !strings.Contains(list, "model llama-3: llama-c=0.1") {
		t.Errorf("endpoint list shows no split of the endpoint routed by model:\n%s", list)
	}
	if wide := cli("endpoint", "list", "-o", "wide"); !strings.Contains(wide, "CRITICALITY/PRIORITY") || !strings.Contains(wide, "critical/0") {
		t.Errorf("endpoint list -o wide:\n%s", wide)
	}
	if wide := cli("backend", "list", "-o", "wide"); !strings.Contains(wide, "grpc      n1(1),n2(2)") {
		t.Errorf("backend list -o wide shows no nodes:\n%s", wide)
	}
	var backends []meshspec.Backend
	if err := yaml.Unmarshal([]byte(cli("backend", "list", "-o", "yaml")), &backends); err != nil || len(backends) != 1 || len(backends[0].Replicas) != 3 {
		t.Errorf("backend list -o yaml: %+v, %v", backends, err)
	}
	var v struct {
		Version  string `json:"version"`
		Protocol int    `json:"protocol"`
	}
	code, out, _ := runCLI("version", "-o", "json")
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.Version == "" || v.Protocol == 0 {
		t.Errorf("version -o json: code %d, %+v, %v", code, v, err)
	}
}

// TestExportFromAPreviousReleaseKeepsEverySetting: a controller of the
// previous release serves no GET /v1/spec; export then reads the state
// part by part, the mesh's tracing included (it once left it out, and
// `export | apply -f -` removed it).
func TestExportFromAPreviousReleaseKeepsEverySetting(t *testing.T) {
	unsetClientEnv(t)
	pct := 5.0
	answers := map[string]any{
		"/v1/backends":     []meshspec.Backend{{Name: "v1", Replicas: []meshspec.Replica{{Address: "10.0.0.1:9000", Node: "n1"}}}},
		"/v1/endpoints":    []meshspec.Endpoint{{Name: "e", Route: "/e", Traffic: map[string]float64{"v1": 1}}},
		"/v1/mesh/tracing": meshspec.Tracing{Collector: "127.0.0.1:4317", SamplingPercent: &pct},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := answers[r.URL.Path]
		if !ok {
			http.NotFound(w, r) // the previous release's mux: no /v1/spec
			return
		}
		_ = json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(srv.Close)
	code, out, errOut := runCLI("export", "--server", srv.URL)
	if code != 0 {
		t.Fatalf("export: code %d, stderr %q", code, errOut)
	}
	var spec meshspec.Spec
	if err := yaml.UnmarshalStrict([]byte(out), &spec); err != nil {
		t.Fatalf("export wrote what apply cannot read: %v\n%s", err, out)
	}
	if spec.Mesh == nil || spec.Mesh.Tracing == nil || spec.Mesh.Tracing.Collector != "127.0.0.1:4317" || *spec.Mesh.Tracing.SamplingPercent != 5 ||
		len(spec.Backends) != 1 || len(spec.Endpoints) != 1 || strings.Contains(out, "node:") {
		t.Fatalf("export of a previous release's state:\n%s", out)
	}
}

// TestMergeRefusedByAPreviousRelease: a controller of the previous
// release ignores ?merge and would apply a file as the whole mesh, so
// apply --merge against it is refused before anything is sent.
func TestMergeRefusedByAPreviousRelease(t *testing.T) {
	unsetClientEnv(t)
	applied := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/apply" {
			applied = true
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	code, _, errOut := runCLI("apply", "-f", "../../examples/demo.yaml", "--merge", "--server", srv.URL)
	if code == 0 || applied || !strings.Contains(errOut, "cannot merge a file into the mesh") {
		t.Fatalf("apply --merge against a previous release: exit %d, applied %v, stderr %q", code, applied, errOut)
	}
}

// TestNodeDescribe: a node in full (issue 62, 6: there was no node
// describe): its maintenance, claim and policy, and the replicas placed
// on it; an unknown node is refused naming those the controller knows.
func TestNodeDescribe(t *testing.T) {
	unsetClientEnv(t)
	url := apiStandIn(t)
	code, out, errOut := runCLI("node", "describe", "n2", "--server", url)
	if code != 0 {
		t.Fatalf("node describe n2: exit %d, %s", code, errOut)
	}
	for _, want := range []string{"Maintenance:   cordoned: it gets no new replicas", "Policy:        2 cpus, 4096 MB, commands /srv/model",
		"Agent claims:  4 cpus, 8192 MB", "v1       v1#000002  127.0.0.1:9002", "v1       v1#000003  127.0.0.1:9003"} {
		if !strings.Contains(out, want) {
			t.Errorf("node describe n2 lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "v1#000001") {
		t.Errorf("node describe n2 lists n1's replica:\n%s", out)
	}
	if code, _, errOut := runCLI("node", "describe", "n9", "--server", url); code == 0 || !strings.Contains(errOut, `no node "n9": the controller knows n1, n2`) {
		t.Errorf("node describe n9: exit %d, %q", code, errOut)
	}
}
