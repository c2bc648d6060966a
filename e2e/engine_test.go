//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/dev/devllama"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// findEngine is the real model server `make tools` installs
// (dev/devllama): llama.cpp's OpenAI-compatible server and the small
// model it writes. A test without it fails.
func findEngine(t *testing.T) *devllama.Engine {
	t.Helper()
	e, err := devllama.Find()
	if err == nil {
		err = e.Check(context.Background())
	}
	if err != nil {
		t.Fatalf("the real model server (llama-cpp-python) and its model are required (`make tools` installs them): %v", err)
	}
	return e
}

// engineMesh is the default mesh (mTLS, two nodes) named name, its agents
// given agentArgs, serving endpoint e from backends, once every node
// serves it; the nodes' logs and stats are printed if the test fails.
func engineMesh(t *testing.T, name string, agentArgs []string, e meshspec.Endpoint, backends ...meshspec.Backend) (*twoNodeMesh, []*mtlsNode) {
	t.Helper()
	mesh := startTwoNodeMeshWith(t, name, nil, agentArgs)
	mesh.createBackends(t, backends...)
	if _, err := mesh.c.CreateEndpoint(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	waitServed(t, mesh, e.Name)
	nodes := []*mtlsNode{mesh.n1, mesh.n2}
	t.Cleanup(func() { // before the mesh stops
		if t.Failed() {
			dumpNodes(t, nodes)
		}
	})
	return mesh, nodes
}

// TestARealModelServerBehindTheMesh: issue 60. llama.cpp's server, a
// replica on each node of the default mesh (mTLS), load-aware with
// prompt affinity: OpenAI chat completions through each node's public
// listener, streamed (server-sent events) with the first token timed and
// whole with the engine's usage, across the inbound hop both ways; a long
// shared prompt evaluated in full once, as the engine's own prompt
// evaluations say; a token quota counted from the engine's usage; and the
// official OpenAI SDK reading it all.
func TestARealModelServerBehindTheMesh(t *testing.T) {
	t.Parallel()
	eng := findEngine(t)
	mesh, nodes := engineMesh(t, "engine", append(eng.AllowFlags(), rateLimitArgs(t)...),
		meshspec.Endpoint{Name: "openai", Route: "/v1", Methods: []string{"GET", "POST"}, Traffic: map[string]float64{"tiny": 1}},
		meshspec.Backend{Name: "tiny", Process: eng.Process("tiny"),
			Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3, LoadAware: &meshspec.LoadAware{PromptAffinity: true}}})
	ctx := context.Background()

	t.Run("streamed and whole answers through each node, to each replica", func(t *testing.T) {
		for _, n := range nodes {
			first, got := streamChat(t, n.public, "Say hello to the mesh.", 16)
			if !got.whole() {
				t.Fatalf("a streamed chat completion of 16 tokens through %s: %+v; want them all, finish_reason length, and [DONE]", n.id, got)
			}
			answer := chat(t, n.public, "", "tiny", "Say hello to the mesh.")
			if answer.status != http.StatusOK || answer.Usage.PromptTokens == 0 || answer.Usage.CompletionTokens == 0 {
				t.Fatalf("a chat completion through %s: %+v; want the engine's token counts", n.id, answer)
			}
			t.Logf("through %s: streamed, first token after %s, %d chunks; whole, usage %+v", n.id, first.Round(time.Millisecond), got.chunks, answer.Usage)
		}
		// Requests in flight together, through both nodes: each replica
		// gets some, across the inbound hop, and each stream comes whole
		// though others wait for its engine (which, run with its default
		// request interruption, ends the running stream as soon as another
		// request waits: dev/devllama).
		var wg sync.WaitGroup
		streams := make([]chatStream, 8)
		for i := range streams {
			wg.Go(func() { _, streams[i] = streamChat(t, nodes[i%2].public, fmt.Sprintf("Request %d.", i), 16) })
		}
		wg.Wait()
		for i, got := range streams {
			if !got.whole() {
				t.Errorf("stream %d of 8 at once, 16 tokens: %+v; want them all, finish_reason length, and [DONE]", i, got)
			}
		}
		// Envoy writes its access log out every second or so.
		testutil.WaitFor(t, 10*time.Second, "the nodes' access logs to show requests to both replicas", func() bool {
			replicas := map[string]bool{}
			for _, n := range nodes {
				for _, line := range accessLog(t, n) {
					if line["listener"] == "inbound" && line["backend"] == "_inbound_tiny" {
						replicas[fmt.Sprint(line["replica"])] = true
					}
				}
			}
			return len(replicas) == 2
		})
	})

	t.Run("a long stream outlasts its replica's health probes", func(t *testing.T) {
		// The agent probes each replica every second (its check's TTL
		// over three), each probe waiting a second at most. A probe of a
		// path that waits for the model (llama-cpp-python's /v1/models)
		// fails while a completion runs longer than that, so the replica
		// reads as dead while it serves; and, with the server's request
		// interruption on, cuts the stream.
		const tokens = 300 // two seconds or more on this engine
		ready := func() int {
			report, err := mesh.c.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range report.Backends {
				if b.Name == "tiny" {
					return b.Ready
				}
			}
			t.Fatalf("status has no backend tiny: %+v", report.Backends)
			return 0
		}
		streaming, dropped := make(chan struct{}), make(chan int, 1)
		go func() {
			least := 2
			for {
				select {
				case <-streaming:
					dropped <- least
					return
				case <-time.After(100 * time.Millisecond):
					least = min(least, ready())
				}
			}
		}()
		start := time.Now()
		_, got := streamChat(t, mesh.n1.public, "Tell a long story.", tokens)
		took := time.Since(start)
		close(streaming)
		if !got.whole() {
			t.Fatalf("a stream of %d tokens (%s): %+v; want them all, finish_reason length, and [DONE]", tokens, took.Round(time.Millisecond), got)
		}
		if least := <-dropped; least != 2 {
			t.Fatalf("while a stream of %s ran, status counted %d of tiny's 2 replicas ready; want both: a probe must answer while the engine serves", took.Round(time.Millisecond), least)
		}
		t.Logf("a stream of %d tokens came whole in %s, both replicas ready throughout", tokens, took.Round(time.Millisecond))
	})

	t.Run("the official OpenAI SDK reads the engine's answers through each node", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, pythonBin(t), "testdata/engine/openai_sdk.py", mesh.n1.public, mesh.n2.public).CombinedOutput()
		if err != nil {
			t.Fatalf("openai_sdk.py: %v\n%s", err, out)
		}
		t.Logf("%s", out)
	})

	t.Run("a long shared prompt is evaluated in full once, by the engine's own count", func(t *testing.T) {
		// Two long system prompts, each asked four times through
		// alternating nodes: with prompt affinity each reaches the replica
		// that holds it, so the engines evaluate each in full once (about
		// 2,900 tokens) and the other six times only the new question.
		prompts := []string{strings.Repeat("You are the assistant of a team that runs many versions of its model servers. ", 36),
			strings.Repeat("Summarise the runbook of the inference platform carefully, step by step. ", 40)}
		for i := range 8 {
			answer := chat(t, nodes[i%2].public, prompts[i%2], "tiny", fmt.Sprintf("Question %d?", i))
			if answer.status != http.StatusOK {
				t.Fatalf("request %d: %+v", i, answer)
			}
		}
		var full []int
		testutil.WaitFor(t, 30*time.Second, "the engines to log their prompt evaluations", func() bool {
			full = fullEvaluations(t, mesh, "tiny")
			return len(full) >= 2
		})
		if len(full) != 2 {
			t.Fatalf("the engines evaluated a long prompt in full %d times (%v tokens); want 2, once each", len(full), full)
		}
		t.Logf("the engines evaluated the two long prompts in full once each (%v tokens), and six times their question alone", full)
	})

	t.Run("a token quota is counted from the engine's usage", func(t *testing.T) {
		// A route of its own (the longest route wins): its quota counts
		// only the tenants asked here.
		const quota = 60
		if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "metered", Route: "/v1/chat/completions", Methods: []string{"POST"},
			Traffic: map[string]float64{"tiny": 1}, RateLimit: &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: quota, Unit: "hour", Header: "x-tenant-id"}}}); err != nil {
			t.Fatal(err)
		}
		waitServed(t, mesh, "metered")
		spent, refused := 0, false
		for i := range 10 {
			calls := rateLimitCalls(t, nodes[i%2])
			answer := chat(t, nodes[i%2].public, "", "tiny", "Count to three.", "x-tenant-id", "acme")
			waitCharged(t, nodes[i%2], calls, answer.status)
			switch {
			case answer.status == http.StatusOK && spent <= quota:
				spent += answer.Usage.TotalTokens
			case answer.status == http.StatusTooManyRequests && spent > quota:
				refused = true
			default:
				t.Fatalf("request %d of tenant acme, %d tokens answered before it (the engine's usage): %d; want 200 while at most %d, then 429", i, spent, answer.status, quota)
			}
			if refused {
				break
			}
		}
		if !refused {
			t.Fatalf("tenant acme was never refused; %d tokens answered", spent)
		}
		if answer := chat(t, mesh.n2.public, "", "tiny", "Count to three.", "x-tenant-id", "globex"); answer.status != http.StatusOK {
			t.Fatalf("another tenant: %d; want 200, its own quota", answer.status)
		}
		t.Logf("tenant acme refused once %d tokens (the engine's usage) passed %d; another tenant served", spent, quota)
	})
}

// waitServed waits until every node serves the endpoints and their
// backends' replicas are ready.
func waitServed(t *testing.T, mesh *twoNodeMesh, endpoints ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := mesh.c.WaitServed(ctx, api.ServedQuery{Endpoints: endpoints}, nil); err != nil {
		t.Fatalf("endpoints %v served: %v", endpoints, err)
	}
}

// promptEvaluation is llama.cpp's line for each prompt it evaluates: the
// tokens it had to compute (those not reused from its cache).
var promptEvaluation = regexp.MustCompile(`prompt eval time =\s*[0-9.]+ ms /\s*([0-9]+) tokens`)

// engineLogs is what the engines of backend's replicas on both nodes
// logged, their logs one after another.
func engineLogs(t *testing.T, mesh *twoNodeMesh, backend string) string {
	t.Helper()
	var out strings.Builder
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		logs, err := filepath.Glob(filepath.Join(n.workDir, "replicas", backend+"-*.log*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range logs {
			text, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			out.Write(text)
		}
	}
	return out.String()
}

// evaluations are the prompt evaluations, in tokens computed, in the
// logs of backend's replicas on both nodes, as llama.cpp logs each.
func evaluations(t *testing.T, mesh *twoNodeMesh, backend string) []int {
	t.Helper()
	var out []int
	for _, m := range promptEvaluation.FindAllStringSubmatch(engineLogs(t, mesh, backend), -1) {
		tokens, _ := strconv.Atoi(m[1])
		out = append(out, tokens)
	}
	return out
}

// fullEvaluations are backend's prompt evaluations of 1,000 tokens or
// more: the long prompts its engines computed in full.
func fullEvaluations(t *testing.T, mesh *twoNodeMesh, backend string) []int {
	t.Helper()
	var out []int
	for _, tokens := range evaluations(t, mesh, backend) {
		if tokens >= 1000 {
			out = append(out, tokens)
		}
	}
	return out
}

// chatStream is what a streamed chat completion read: its token chunks
// (llama-cpp-python's server sends no usage in a stream, stream_options
// or not).
type chatStream struct {
	chunks int
	finish string // the last finish_reason
	done   bool
}

// whole reports whether a stream asked for an exact count of tokens
// (streamChat's min_tokens and max_tokens) came whole: token chunks ended by the length
// it was given (the engine sends that finish_reason only once it has
// generated them all; a stream it cut has none), then [DONE]. The chunks
// are not counted: llama-cpp-python's server holds back a token that ends
// within a character and may send it with the next, or an empty one.
func (s chatStream) whole() bool {
	return s.chunks > 0 && s.finish == "length" && s.done
}

// chatUsage is an answer's usage, as the engine counts it.
type chatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// chatAnswer is a whole chat completion: its status and usage.
type chatAnswer struct {
	status int
	// backend is the backend the mesh says answered (wire.BackendHeader).
	backend string
	Usage   chatUsage `json:"usage"`
}

// chat asks for a whole chat completion of model through public: of
// prompt, after system if given, with headers (name, value, ...).
func chat(t *testing.T, public, system, model, prompt string, headers ...string) chatAnswer {
	t.Helper()
	messages := []map[string]string{{"role": "user", "content": prompt}}
	if system != "" {
		messages = append([]map[string]string{{"role": "system", "content": system}}, messages...)
	}
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 8, "messages": messages})
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+public+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	answer := chatAnswer{status: resp.StatusCode, backend: resp.Header.Get(wire.BackendHeader)}
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
			t.Fatalf("POST /v1/chat/completions through %s: %v", public, err)
		}
	}
	return answer
}

// streamChat asks for a streamed chat completion of prompt through public,
// of tokens tokens exactly (min_tokens keeps the engine from ending it
// sooner), and returns when its first token chunk came and what it read.
func streamChat(t *testing.T, public, prompt string, tokens int) (time.Duration, chatStream) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "tiny", "stream": true, "max_tokens": tokens, "min_tokens": tokens,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+public+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /v1/chat/completions through %s: %d %s", public, resp.StatusCode, b)
	}
	var out chatStream
	var first time.Duration
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		data, ok := strings.CutPrefix(lines.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			out.done = true
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content *string `json:"content"` // "" for a token that ends within a character
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("a chunk that is not JSON: %q: %v", data, err)
		}
		if len(chunk.Choices) > 0 && chunk.Choices[0].FinishReason != nil {
			out.finish = *chunk.Choices[0].FinishReason
		}
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != nil {
			if out.chunks == 0 {
				first = time.Since(start)
			}
			out.chunks++
		}
	}
	if err := lines.Err(); err != nil {
		t.Fatalf("reading the stream through %s: %v", public, err)
	}
	return first, out
}

// TestModelVersionsOnARealEngine: issue 60. Two versions of a model, each
// llama.cpp's server, a replica each on the two nodes of the default
// mesh, behind one OpenAI-style endpoint routed by the model the body
// names: "tiny-v2" goes to v2 alone, "tiny" is split between the versions
// and mirrored to v2. The engines' own counts of the prompts they
// evaluated (their logs) show the routing, the split and the mirrors.
func TestModelVersionsOnARealEngine(t *testing.T) {
	t.Parallel()
	eng := findEngine(t)
	mesh, nodes := engineMesh(t, "versions", eng.AllowFlags(),
		meshspec.Endpoint{Name: "chat", Route: "/v1/chat/completions", Methods: []string{"POST"},
			ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{
				"tiny":    {Traffic: map[string]float64{"v1": 0.5, "v2": 0.5}, Shadows: map[string]float64{"v2": 0.5}},
				"tiny-v2": {Traffic: map[string]float64{"v2": 1}},
			}}},
		meshspec.Backend{Name: "v1", Process: eng.Process("tiny-v1"), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 3}},
		meshspec.Backend{Name: "v2", Process: eng.Process("tiny-v2"), Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 3}})
	// send asks for model n times through alternating nodes, two callers
	// at a time (each engine evaluates one request at a time), and waits
	// until the engines have evaluated every request the nodes sent them.
	send := func(model string, n int) {
		t.Helper()
		var wg sync.WaitGroup
		for w := range 2 {
			wg.Go(func() {
				for i := w; i < n; i += 2 {
					answer := chat(t, nodes[i%2].public, "", model, fmt.Sprintf("Question %d?", i))
					if answer.status != http.StatusOK {
						t.Errorf("a request for %s through %s: %d", model, nodes[i%2].id, answer.status)
					}
					// The mesh names the backend that answered: llama.cpp's
					// server sets no such header itself.
					if model == "tiny-v2" && answer.backend != "v2" {
						t.Errorf("a request for tiny-v2 through %s: answered by %q (%s), want v2", nodes[i%2].id, answer.backend, wire.BackendHeader)
					}
				}
			})
		}
		wg.Wait()
		settled(t, mesh, "v1", "v2")
	}
	const routed, split = 10, 60
	send("tiny-v2", routed)
	if v1, v2 := len(evaluations(t, mesh, "v1")), len(evaluations(t, mesh, "v2")); v1 != 0 || v2 != routed {
		t.Fatalf("%d requests for tiny-v2: v1's engine evaluated %d prompts, v2's %d; want v2's all, v1's none", routed, v1, v2)
	}
	send("tiny", split)
	v1 := len(evaluations(t, mesh, "v1"))
	checkShare(t, "tiny answered by v1 (weight 0.5), by its engine's count", v1, split, 0.5)
	mirrored := len(evaluations(t, mesh, "v2")) - routed - (split - v1)
	checkShare(t, "tiny mirrored to v2 (proportion 0.5), by its engine's count", mirrored, split, 0.5)
}

// settled waits until no node has a request in flight to backends (a
// mirror is in flight from when its request is sent): the engines, which
// log each prompt evaluation before they answer, have logged them all.
func settled(t *testing.T, mesh *twoNodeMesh, backends ...string) {
	t.Helper()
	testutil.WaitFor(t, time.Minute, fmt.Sprintf("no request in flight to %v, mirrors included", backends), func() bool {
		for _, b := range backends {
			for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
				if active, ok := readEnvoyStat(n.admin, "cluster."+b+".upstream_rq_active"); !ok || active != 0 {
					return false
				}
			}
		}
		return true
	})
}

// TestModelMultiplexingOnARealEngine: issue 60. llama.cpp's server with
// its own multi-model configuration (two models it loads on demand, one
// at a time: asking for the other closes the loaded one and loads it), two
// replicas on each node of the default mesh, load-aware with a model per
// replica: requests for both models, through alternating nodes, go to a
// replica that has theirs loaded, so the engines load a model once in all
// (a replica taking the second model), as their own logs say.
func TestModelMultiplexingOnARealEngine(t *testing.T) {
	t.Parallel()
	eng := findEngine(t)
	multi, err := eng.MultiModel(t.TempDir(), "m-a", "m-b")
	if err != nil {
		t.Fatal(err)
	}
	mesh, nodes := engineMesh(t, "multiplex", eng.AllowFlags(),
		meshspec.Endpoint{Name: "multi", Route: "/v1/chat/completions", Methods: []string{"POST"}, Traffic: map[string]float64{"multi": 1}},
		meshspec.Backend{Name: "multi", Process: multi,
			Config: meshspec.BackendConfig{NumReplicas: 4, CPUs: 1.5, LoadAware: &meshspec.LoadAware{MaxModelsPerReplica: 1, PromptAffinity: true}}})
	// Each replica loaded the first model as it started.
	// (At least once: an engine that lost its port to another process as
	// it bound it is started again by its agent on another, and loads its
	// model again.)
	testutil.WaitFor(t, 30*time.Second, "each replica's engine to have loaded its first model", func() bool { return modelLoads(t, mesh, "multi") >= 4 })
	// Each node's picker places the models that reach it on its own
	// replicas (README: multiplexing), and every engine starts with m-a
	// loaded: so m-b is loaded once on each node it reaches, at most
	// twice in all, whichever node Envoy sends each request to, and never
	// again; each request goes to a replica with its model loaded.
	round := func() int {
		before := modelLoads(t, mesh, "multi")
		for i := range 12 {
			want := []string{"m-a", "m-b"}[i%2]
			if answer := chat(t, nodes[(i/2)%2].public, "", want, fmt.Sprintf("Question %d?", i)); answer.status != http.StatusOK {
				t.Fatalf("request %d for %s: %+v", i, want, answer)
			}
		}
		return modelLoads(t, mesh, "multi") - before
	}
	rounds := []int{round(), round()}
	if rounds[0]+rounds[1] > len(nodes) {
		t.Fatalf("the engines loaded a model %v times for two rounds of 12 requests of two models through two nodes; want at most %d in all (m-b once on each node it reaches)", rounds, len(nodes))
	}
	t.Logf("two rounds of 12 requests of two models loaded a model %v times", rounds)
}

// modelLoads counts the models the engines of backend's replicas on both
// nodes loaded, as llama.cpp logs each load.
func modelLoads(t *testing.T, mesh *twoNodeMesh, backend string) int {
	t.Helper()
	return strings.Count(engineLogs(t, mesh, backend), "llama_model_loader: loaded meta data")
}
