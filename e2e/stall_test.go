//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/meshspec"
)

// TestAStalledReplicaIsTriedAgain: on the default mesh (mTLS, two
// nodes), a backend of two stand-in model servers, one on each node,
// with config.first_byte_timeout_s 0.5: one server accepts every POST and
// never answers it (an engine that stalls). Every chat request, through
// either node, is answered 200 by the other one: a try whose answer has
// not started within the bound is given up and the request, a POST, is
// tried on the other node. A streamed answer that starts at once and
// lasts twice the bound (a token every 100 ms) arrives whole: Envoy never
// gives up a try whose answer has started. The time each request took
// beyond the bound goes to the log (bench/inference -workload stall
// collects it for BENCHMARKS.md).
func TestAStalledReplicaIsTriedAgain(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "stl")
	locks := t.TempDir()
	if err := os.Chmod(locks, 0o777); err != nil { // replicas may run as another user
		t.Fatal(err)
	}
	const bound = 500 * time.Millisecond
	mesh.createBackends(t, meshspec.Backend{Name: "stl",
		Process: modelServer("stl", "--slots", "4", "--service", "5ms", "--slow-lock", filepath.Join(locks, "stl"), "--slow-factor", "1", "--hang",
			"--token-interval", "100ms"),
		Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.5, FirstByteTimeoutS: bound.Seconds()}})
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "stl", Route: "/v1/chat/completions", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"stl": 1}}); err != nil {
		t.Fatal(err)
	}
	mesh.waitPassing(t, "stl", 2, "http://"+mesh.n1.public+"/v1/chat/completions")
	if nodes := runningOn(placements(t, mesh.c, "stl")); len(distinct(nodes)) != 2 {
		t.Fatalf("stl runs on %v, want one replica on each node", nodes)
	}
	client := loadClient()
	urls := []string{"http://" + mesh.n1.public + "/v1/chat/completions", "http://" + mesh.n2.public + "/v1/chat/completions"}
	const n = 20
	var took []time.Duration
	for i := range n {
		start := time.Now()
		_, a, _, err := timedPost(client, urls[i%2], fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}]}`, i))
		if err != nil {
			t.Fatalf("request %d through %s: %v", i, urls[i%2], err)
		}
		if a.Odd {
			t.Fatalf("request %d was answered by the stalled replica %s", i, a.Replica)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	beyond := func(d time.Duration) float64 { return ms(max(d-bound, 0)) }
	t.Logf("BENCH stall bound_ms=%.0f requests=%d took_p50_ms=%.1f took_max_ms=%.1f beyond_bound_p50_ms=%.1f beyond_bound_max_ms=%.1f",
		ms(bound), n, ms(took[n/2]), ms(took[n-1]), beyond(took[n/2]), beyond(took[n-1]))

	// A streamed answer longer than the bound is not cut: its first token
	// came at once.
	for i, u := range urls {
		tokens, done, err := streamedTokens(t, client, u, 10)
		if err != nil || tokens != 10 || !done {
			t.Errorf("a streamed answer of 10 tokens 100 ms apart through node %d: %d tokens, [DONE] %t, %v; want it whole", i+1, tokens, done, err)
		}
	}
}

// streamedTokens asks url for a streamed chat answer of want tokens and
// counts the tokens that arrive, and whether [DONE] does.
func streamedTokens(t *testing.T, client *http.Client, url string, want int) (int, bool, error) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"tell me"}]}`, want)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("status %d", resp.StatusCode)
	}
	tokens, done := 0, false
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		data, ok := strings.CutPrefix(s.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var chunk struct {
			Choices []demoreplica.Choice `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && len(chunk.Choices) > 0 && chunk.Choices[0].Delta != nil {
			tokens++
		}
	}
	return tokens, done, s.Err()
}
