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
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// engine is the real model server `make tools` installs: llama.cpp's
// OpenAI-compatible server (PyPI llama-cpp-python, built from source) in
// its own Python, and the small model tools/model/make_model.py writes.
type engine struct{ python, model string }

func findEngine(t *testing.T) engine {
	t.Helper()
	python, err := filepath.Abs("../.tools/llama-venv/bin/python")
	if err != nil {
		t.Fatal(err)
	}
	e := engine{python: python, model: filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(python))), "models", "tiny.gguf")}
	if out, err := exec.CommandContext(context.Background(), python, "-c", "import llama_cpp.server, os, sys; os.stat(sys.argv[1])", e.model).CombinedOutput(); err != nil {
		t.Fatalf("the real model server (llama-cpp-python) and its model are required (`make tools` installs them): %v\n%s", err, out)
	}
	return e
}

// process runs the engine as a backend's replicas, one thread each.
func (e engine) process() *meshspec.ProcessSpec {
	return &meshspec.ProcessSpec{Command: e.python, Args: []string{"-m", "llama_cpp.server", "--model", e.model, "--host", "${HOST}", "--port", "${PORT}",
		"--n_ctx", "4096", "--n_threads", "1", "--chat_format", "chatml"}, HealthPath: "/v1/models"}
}

// TestARealModelServerBehindTheMesh: issue 60, its first step. llama.cpp's
// server, a replica on each node of the default mesh (mTLS), answers
// OpenAI chat completions through each node's public listener: streamed
// (server-sent events) with its first token timed, and whole with its own
// usage; and requests through both nodes cross the inbound hop to each
// replica.
func TestARealModelServerBehindTheMesh(t *testing.T) {
	t.Parallel()
	eng := findEngine(t)
	// The controller places a command by its path, the agents run it once
	// the file it leads to is allowed too: the venv's
	// python is a link to the interpreter it was made with.
	interpreter, err := filepath.EvalSymlinks(eng.python)
	if err != nil {
		t.Fatal(err)
	}
	mesh := startTwoNodeMeshWith(t, "engine", nil, []string{"--allow-command", eng.python, "--allow-command", interpreter})
	ctx := context.Background()
	mesh.createBackends(t, meshspec.Backend{Name: "tiny", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3}, Process: eng.process()})
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "openai", Route: "/v1", Methods: []string{"GET", "POST"}, Traffic: map[string]float64{"tiny": 1}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "both model servers to be ready", func() bool {
		r, err := mesh.c.Status(ctx)
		if err != nil {
			return false
		}
		for _, b := range r.Backends {
			if b.Name == "tiny" {
				return b.Ready == 2
			}
		}
		return false
	})
	nodes := []*mtlsNode{mesh.n1, mesh.n2}
	for _, n := range nodes {
		testutil.WaitFor(t, time.Minute, "the model servers to answer through "+n.id, func() bool {
			resp, err := httpClient().Get("http://" + n.public + "/v1/models") //nolint:noctx // test probe
			if err != nil {
				return false
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	for _, n := range nodes {
		first, got := streamChat(t, n.public, "Say hello to the mesh.")
		if got.chunks == 0 || !got.done {
			t.Fatalf("a streamed chat completion through %s: %+v; want content chunks and [DONE]", n.id, got)
		}
		usage := chat(t, n.public, "Say hello to the mesh.")
		if usage.PromptTokens == 0 || usage.CompletionTokens == 0 {
			t.Fatalf("a chat completion through %s: usage %+v; want the engine's token counts", n.id, usage)
		}
		t.Logf("through %s: streamed, first token after %s, %d chunks; whole, usage %+v", n.id, first.Round(time.Millisecond), got.chunks, usage)
	}
	for i := range 8 {
		streamChat(t, nodes[i%2].public, fmt.Sprintf("Request %d.", i))
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
}

// chatStream is what a streamed chat completion read: its token chunks
// (llama-cpp-python's server sends no usage in a stream, stream_options
// or not).
type chatStream struct {
	chunks int
	done   bool
}

// chatUsage is an answer's usage, as the engine counts it.
type chatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// chat asks for a whole chat completion of prompt through public and
// returns its usage.
func chat(t *testing.T, public, prompt string) chatUsage {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "tiny", "max_tokens": 16, "messages": []map[string]string{{"role": "user", "content": prompt}}})
	resp, err := (&http.Client{Timeout: time.Minute}).Post("http://"+public+"/v1/chat/completions", "application/json", bytes.NewReader(body)) //nolint:noctx // test call
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var answer struct {
		Usage chatUsage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/chat/completions through %s: %d, %v", public, resp.StatusCode, err)
	}
	return answer.Usage
}

// streamChat asks for a streamed chat completion of prompt through public
// and returns when its first token chunk came and what it read.
func streamChat(t *testing.T, public, prompt string) (time.Duration, chatStream) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "tiny", "stream": true, "max_tokens": 16,
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
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("a chunk that is not JSON: %q: %v", data, err)
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
