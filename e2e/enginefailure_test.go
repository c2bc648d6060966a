//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/servemesh/servemesh/dev/devllama"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestAFailingEngineDoesNotDrawTheLoad: issue 60. Two replicas of
// llama.cpp's server, one on each node of the default mesh, load-aware;
// the one on the first node is healthy (it answers its probe) but fails
// every completion at once with a 500, as an engine out of memory slots
// or with a broken model does: its model's file is not a model, which the
// server finds only when a request names the model. A balancer by time to first byte sees
// that replica answer fastest and sends it ever more; servemesh counts a
// failure as a slow answer, so the failing replica's share of the answers
// falls to a few while the other serves the rest.
func TestAFailingEngineDoesNotDrawTheLoad(t *testing.T) {
	t.Parallel()
	eng := findEngine(t)
	dir := t.TempDir()
	// Each replica's server runs one of two configurations: the first
	// node's (the agent names the node in $SERVEMESH_NODE) the broken one.
	config := func(name, modelFile string) string {
		text, err := json.Marshal(map[string]any{"interrupt_requests": false, "models": []any{
			map[string]any{"model": eng.Model, "model_alias": "warm", "n_ctx": 2048, "n_threads": 1, "n_threads_batch": 1, "chat_format": "chatml"},
			map[string]any{"model": modelFile, "model_alias": "tiny", "n_ctx": 2048, "n_threads": 1, "n_threads_batch": 1, "chat_format": "chatml"}}})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, text, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	garbage := filepath.Join(dir, "broken.gguf")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("not a model "), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	good, broken := config("good.json", eng.Model), config("broken.json", garbage)
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`if [ "$SERVEMESH_NODE" = failing-n1 ]; then exec %q -m llama_cpp.server --config_file %q; else exec %q -m llama_cpp.server --config_file %q; fi`,
		eng.Python, broken, eng.Python, good)
	_, nodes := engineMesh(t, "failing", append(eng.AllowFlags(), "--allow-command", "/bin/sh", "--allow-command", sh),
		meshspec.Endpoint{Name: "chat", Route: "/v1/chat/completions", Methods: []string{"POST"}, Traffic: map[string]float64{"tiny": 1}},
		meshspec.Backend{Name: "tiny", Process: &meshspec.ProcessSpec{Command: "/bin/sh", Args: []string{"-c", script}, HealthPath: devllama.HealthPath},
			Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3, LoadAware: &meshspec.LoadAware{}}})
	// Answers through both nodes until the failing replica's share of the
	// last 20 is under a quarter; it starts at half or more (the nodes'
	// weights are equal until their load reports count, and the failing
	// replica is the faster), and stays there if failures read as fast.
	var last []int
	sent, failed := 0, 0
	testutil.WaitFor(t, 2*time.Minute, "the failing replica's share of the last 20 answers under a quarter", func() bool {
		answer := chat(t, nodes[sent%2].public, "", "tiny", fmt.Sprintf("Question %d?", sent))
		sent++
		switch answer.status {
		case http.StatusOK:
			last = append(last, 0)
		case http.StatusInternalServerError:
			last, failed = append(last, 1), failed+1
		default:
			t.Fatalf("request %d: %d; want 200 from the working replica or the failing one's 500", sent, answer.status)
		}
		if len(last) > 20 {
			last = last[1:]
		}
		n := 0
		for _, f := range last {
			n += f
		}
		return len(last) == 20 && n < 5
	})
	if failed == 0 {
		t.Fatalf("no request failed in %d: the failing replica was never tried, so the test shows nothing", sent)
	}
	t.Logf("%d requests until the failing replica answered fewer than 5 of the last 20; %d failed in all", sent, failed)
}
