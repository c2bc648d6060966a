//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestATokenSlowerCandidateIsRolledBack: on the default mesh (mTLS, two
// nodes), an endpoint of model traffic (a load-aware backend of stand-in
// model servers, one replica on each node, a token every 50 ms) rolls out
// a candidate whose tokens come 20% slower (60 ms) under a steady load of
// streamed chat answers through both nodes. Its answers are whole and its
// errors none, and their time to the last byte within the default latency
// check (twice the primary's); the rollout's check on the time between
// tokens (max_inter_token_ratio 1.1, p95 against the primary's) rolls it
// back at its first step, saying why, with both p95s in the verdict. The
// agents' GenAI histograms (endpoint, backend, model) counted the
// answers.
func TestATokenSlowerCandidateIsRolledBack(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "tok")
	backend := func(name, interval string) meshspec.Backend {
		return meshspec.Backend{Name: name, Process: modelServer(name, "--slots", "8", "--service", "5ms", "--token-interval", interval),
			Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.5, LoadAware: &meshspec.LoadAware{}}}
	}
	mesh.createBackends(t, backend("tok-v1", "50ms"), backend("tok-v2", "60ms"))
	ctx := context.Background()
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "tok", Route: "/v1/chat/completions", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"tok-v1": 1}}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + mesh.n1.public + "/v1/chat/completions"
	mesh.waitPassing(t, "tok-v1", 2, url)
	mesh.waitPassing(t, "tok-v2", 2, url)

	// Streamed answers of 8 tokens through both nodes, 4 at a time.
	urls := []string{url, "http://" + mesh.n2.public + "/v1/chat/completions"}
	stop := make(chan struct{})
	var sent, failed atomic.Int64
	var firstFailure atomic.Value
	var wg sync.WaitGroup
	client := loadClient()
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tokens, done, err := streamedTokens(t, client, urls[(w+i)%2], 8)
				sent.Add(1)
				if err != nil || tokens != 8 || !done {
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, fmt.Sprintf("%d tokens, [DONE] %t, %v", tokens, done, err))
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	testutil.WaitFor(t, 30*time.Second, "answers of the primary to stream", func() bool { return sent.Load() >= 40 })

	if _, err := mesh.c.StartRollout(ctx, "tok", meshspec.Rollout{Candidate: "tok-v2",
		Steps:  []meshspec.RolloutStep{{Weight: 0.5, DurationS: 60, MinRequests: 60}, {Weight: 1, DurationS: 10}},
		Checks: meshspec.RolloutChecks{MaxInterTokenRatio: 1.1, MinSample: 20}}); err != nil {
		t.Fatal(err)
	}
	var r api.RolloutReport
	testutil.WaitFor(t, 90*time.Second, "the rollout of tok-v2 to end", func() bool {
		got, err := mesh.c.Rollout(ctx, "tok")
		r = got
		return err == nil && !got.Phase.Active()
	})
	if failed.Load() != 0 {
		t.Errorf("%d of %d streamed answers were not whole; the first: %v", failed.Load(), sent.Load(), firstFailure.Load())
	}
	if r.Phase != meshspec.RolloutRolledBack || len(r.Verdicts) != 1 {
		t.Fatalf("the rollout ended %s with verdicts %+v (%s); want rolled back at its first step", r.Phase, r.Verdicts, r.Reason)
	}
	v := r.Verdicts[0]
	t.Logf("verdict: %s: %s; candidate %+v, primary %+v", v.Stage, v.Reason, v.Candidate, v.Primary)
	if v.Passed || v.Stage != "traffic 50%" || !strings.Contains(v.Reason, "time between tokens p95") || !strings.Contains(v.Reason, "more than 1.1 times the primary's") {
		t.Errorf("verdict %+v; want the first step failed on the time between tokens", v)
	}
	if v.Candidate.InterTokenMs <= 1.1*v.Primary.InterTokenMs || v.Primary.InterTokenMs < 45 || v.Candidate.InterTokenMs > 80 {
		t.Errorf("inter-token p95s: candidate %.1f ms, primary %.1f ms; want about 60 and 50", v.Candidate.InterTokenMs, v.Primary.InterTokenMs)
	}
	if v.Candidate.ErrorRate != 0 {
		t.Errorf("the candidate's error rate %v; want none: the tokens alone fail it", v.Candidate.ErrorRate)
	}
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		for _, b := range []string{"tok-v1", "tok-v2"} {
			if got := metricValue(t, n.metr, "servemesh_genai_time_per_output_token_seconds", "endpoint", "tok", "backend", b); got == 0 {
				t.Errorf("node %s counted no answer of %s in its inter-token histogram", n.id, b)
			}
		}
		if got := metricValue(t, n.metr, "servemesh_genai_time_to_first_token_seconds", "endpoint", "tok", "backend", "tok-v1"); got == 0 {
			t.Errorf("node %s counted no answer of tok-v1 in its time-to-first-token histogram", n.id)
		}
	}
}
