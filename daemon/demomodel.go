package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/servemesh/servemesh/dev/devconsul"
	"github.com/servemesh/servemesh/dev/devllama"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// The demo's model servers (StackOptions.ModelServer): the stand-in, or
// the real engine `make tools` installs.
const (
	StandIn = "stand-in"
	Llama   = "llama"
)

// demoPromptFile, in the demo's work folder, is a chat request with a
// long system prompt, for the banner's prompt-affinity line.
const demoPromptFile = "long-prompt.json"

// writeDemoPrompt writes demoPromptFile: a system prompt of about 2,500
// characters, as long shared prompts (instructions, a document) are.
func writeDemoPrompt(dir string) error {
	system := strings.Repeat("You are the assistant of a team that runs many versions of its model servers. Answer briefly and cite the runbook. ", 22)
	body, err := json.Marshal(map[string]any{"model": "llama-3-8b", "max_tokens": 8, "messages": []map[string]string{
		{"role": "system", "content": system}, {"role": "user", "content": "How do I shift traffic to a new version?"}}})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, demoPromptFile), body, 0o644); err != nil {
		return fmt.Errorf("the demo's prompt: %w", err)
	}
	return nil
}

// demoSampling traces every request of the demo, to look at any one.
var demoSampling = 100.0

// DemoNodeCPUs are the CPUs the demo's node offers; every line the demo
// prints fits in them, in any order (a replica asks for DemoReplicaCPUs).
const (
	DemoNodeCPUs    = 8
	DemoReplicaCPUs = 0.5
)

// StackModel is the demo's mesh: replicas are `servemesh demo-replica`
// processes the agent runs, and the llama backend's the real engine if
// eng is set.
func StackModel(self string, eng *devllama.Engine) *meshspec.Model {
	backend := func(name string, replicas int) meshspec.Backend {
		return meshspec.Backend{Name: name, Config: meshspec.BackendConfig{NumReplicas: replicas, CPUs: DemoReplicaCPUs, MaxConcurrentQueries: 16},
			Process: &meshspec.ProcessSpec{Command: self, Args: []string{"demo-replica", "--backend", name, "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
	}
	embedder := backend("embedder", 1)
	embedder.Config.MaxConcurrentQueries = 2
	embedder.Config.Autoscaling = &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 4, TargetInFlight: 2,
		MetricsIntervalS: 0.5, LookBackPeriodS: 5, UpscaleDelayS: 2, DownscaleDelayS: 20}
	// Two model servers behind an OpenAI-style endpoint routed by the
	// model the body names, picked by their load and, for llama's two
	// replicas, by the prompt's prefix each holds in cache; the stand-in
	// reports vLLM's gauges, llama.cpp's server none.
	llm := func(name string, replicas int) meshspec.Backend {
		b := backend(name, replicas)
		b.Process.Args, b.Process.HealthPath = []string{"demo-model-server", "--backend", name, "--listen", "${HOST}:${PORT}",
			"--cache-blocks", "4096", "--prefill-per-block", "2ms"}, "/health"
		b.Config.LoadAware = &meshspec.LoadAware{MetricsPath: "/metrics", QueueMetric: "vllm:num_requests_waiting", RunningMetric: "vllm:num_requests_running",
			KVCacheMetric: meshspec.VLLMKVCacheMetric, PromptAffinity: true, TenantHeader: "x-tenant-id"}
		return b
	}
	llama := llm("llama", 2)
	if eng != nil {
		llama.Process = eng.Process("llama-3-8b")
		llama.Config.LoadAware = &meshspec.LoadAware{PromptAffinity: true, TenantHeader: "x-tenant-id"}
	}
	return &meshspec.Model{
		Backends: []meshspec.Backend{backend("model-v1", 2), backend("model-v2", 1), backend("model-v3-candidate", 1), embedder, llama, llm("mistral", 1)},
		Endpoints: []meshspec.Endpoint{
			{Name: "model", Route: "/model", Methods: []string{"GET", "POST"},
				Traffic: map[string]float64{"model-v1": 0.9, "model-v2": 0.1}, Shadows: map[string]float64{"model-v3-candidate": 0.2}},
			{Name: "embeddings", Traffic: map[string]float64{"embedder": 1}},
			{Name: "chat", Route: "/v1/chat/completions", Methods: []string{"POST"}, ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{
				"llama-3-8b": {Traffic: map[string]float64{"llama": 1}},
				"mistral-7b": {Traffic: map[string]float64{"mistral": 1}},
			}}},
		},
	}
}

// affinityLines are the banner's prompt-affinity lines: the stand-in
// says in its answers how much of the prompt it held; llama.cpp's server
// says it in its log, which `servemesh logs` reads.
func affinityLines(o StackOptions, bin string) string {
	prompt := filepath.Join(o.WorkDir, demoPromptFile)
	if o.ModelServer == Llama {
		return fmt.Sprintf(`  for i in $(seq 5); do curl -s -o /dev/null -w '%%{time_total}s\n' http://%[1]s/v1/chat/completions -H 'content-type: application/json' -d @%[2]s; done
  %[3]s logs llama --tail 100 | grep 'prompt eval time'
                                                   # prompt affinity: the long shared prompt goes to the replica holding it; the engine
                                                   # computes it in full once (its log: about 2,600 tokens), then a token or so
`, o.Public, prompt, bin)
	}
	return fmt.Sprintf(`  for i in $(seq 5); do curl -s http://%[1]s/v1/chat/completions -H 'content-type: application/json' -d @%[2]s; done |
      python3 -c 'import json,sys; [print(a["replica"], "prompt blocks cached:", a.get("cached", 0), "of", a["blocks"]) for a in map(json.loads, sys.stdin)]'
                                                   # prompt affinity: a long shared prompt stays on the replica that holds it in cache
`, o.Public, prompt)
}

func stackHelp(o StackOptions, consulAddr, meshFile, jaegerQuery string) string {
	bin := o.Self
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, o.Self); err == nil {
			bin = rel
		}
	}
	consulBin, err := devconsul.Find()
	if err != nil {
		consulBin = "consul"
	}
	server := "the stand-in model servers"
	if o.ModelServer == Llama {
		server = "llama (llama.cpp's server, a real engine) and the stand-in mistral"
	}
	return fmt.Sprintf(`
servemesh is running on this machine, as in production: Consul (UI http://%[1]s/ui, ACLs on:
log in with the token in %[13]s), the controller (API %[2]s, web console http://%[2]s/ui/),
and one node agent running its Envoy (public %[3]s) and %[9]d replicas as processes, in the
default mode: identities from Consul's service-mesh CA, xDS over TLS, calls between nodes over
mTLS. The applied state is in %[4]s.

Try:
  export SERVEMESH_SERVER=%[2]s
  curl -s http://%[3]s/model                       # 90%% model-v1, 10%% model-v2; 20%% mirrored to model-v3-candidate
  for i in $(seq 200); do curl -s http://%[3]s/model -o /dev/null -w '%%header{x-servemesh-backend}\n'; done | sort | uniq -c
  curl -si -X DELETE http://%[3]s/model            # 405, with an Allow header
  curl -s -H 'Host: embeddings' http://%[5]s/      # a headless endpoint, on the mesh listener
  curl -s http://%[3]s/v1/chat/completions -d '{"model": "mistral-7b", "messages": []}'
                                                   # routed by the model the body names (%[14]s); another model: 404
%[12]s  %[6]s status                           # live request rates next to the weights, replicas, nodes (-w: keep watching)
  %[6]s traffic set model model-v1=0.5 model-v2=0.5
  %[6]s backend update model-v2 --num-replicas 3
  %[6]s backend describe model-v2        # each replica: address, node, health, restarts, age
  for i in $(seq 8); do (for j in $(seq 60); do curl -s -o /dev/null -H 'Host: embeddings' 'http://%[5]s/?sleep_ms=200'; done &); done
                                                   # load on embedder: it autoscales from 1 up to 4, then back
  %[6]s endpoint create limited --route /limited --backend model-v1 \
      --global-rate-limit 5 --global-rate-limit-unit minute --global-rate-limit-header x-tenant-id --wait
  for i in $(seq 7); do curl -s -o /dev/null -w '%%{http_code} ' -H 'x-tenant-id: acme' http://%[3]s/limited; done; echo
                                                   # 200 five times, then 429: 5 a minute per tenant, on every node together
  %[6]s endpoint create metered --route /v1/completions --methods POST --backend llama --token-quota 50 --token-quota-header x-tenant-id --wait
  for i in $(seq 6); do curl -s -o /dev/null -w '%%{http_code} ' -H 'x-tenant-id: acme' http://%[3]s/v1/completions -H 'content-type: application/json' -d '{"prompt": "Count to three.", "max_tokens": 8}'; done; echo
                                                   # 200 until the answers' usage (the model server's count) passes 50 tokens a minute for the tenant, then 429
  curl -s 'http://%[3]s/model' -H 'traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' -o /dev/null
  for i in $(seq 30); do curl -sf %[10]s/api/traces/4bf92f3577b34da6a3ce929d0e0e4736 | grep -Eq '"operationName": ?"model"' && break; sleep 0.5; done
  curl -s %[10]s/api/traces/4bf92f3577b34da6a3ce929d0e0e4736 | python3 -m json.tool | grep -E '"(operationName|serviceName)"'
                                                   # that request's trace in Jaeger once its endpoint's span is in (a second or so): that span, its try on a replica (a 20%% mirror when sampled)
  %[6]s apply -f %[4]s --dry-run   # edit the file, then apply it without --dry-run
  CONSUL_HTTP_ADDR=%[1]s CONSUL_HTTP_TOKEN_FILE=%[13]s %[7]s catalog services -tags

Traces: every request, in Jaeger (query API %[10]s/api/traces?service=%[11]s; %[6]s tracing get).
Logs: %[8]s/*.log. Press Ctrl-C to stop everything.
`, consulAddr, o.API, o.Public, meshFile, o.Mesh, bin, consulBin, o.WorkDir, replicasOf(StackModel(o.Self, nil)), jaegerQuery, wire.TraceService(demoNode),
		affinityLines(o, bin), filepath.Join(o.WorkDir, stackConsulToken), server)
}

// replicasOf counts the replicas m's process backends start with.
func replicasOf(m *meshspec.Model) int {
	n := 0
	for _, b := range m.Backends {
		if b.Process != nil {
			n += b.Config.NumReplicas
		}
	}
	return n
}
