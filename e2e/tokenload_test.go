//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/servemesh/servemesh/meshspec"
)

// TestTokenLoadReleasesAffinityPastTheBudget: llm-d's sticky until
// saturated, on the default mesh (mTLS, two nodes). Two backends of
// stand-in model servers, two replicas on each node, with prompt
// affinity: tl with a TTFT budget of 500 ms, tc without. A prompt is a
// shared system prompt (8 blocks) and a question of its own (40 blocks,
// 10 ms of prefill each uncached: about 400 ms). One at a time, a
// prompt's requests stay on its home in both; the home's first, cold,
// prefill gives the picker its rate. Three at once: in tl the home's
// queued prefill with a second's passes the budget, so the affinity is
// released and another replica takes it (the picker counts it in
// servemesh_picker_affinity_released_total); in tc the home takes all
// three. The release depends on the requests being at the picker
// together (a prefill takes 400 ms), so a burst is tried up to five
// times; keeping them at home depends on nothing.
func TestTokenLoadReleasesAffinityPastTheBudget(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "tok")
	server := []string{"--slots", "4", "--service", "5ms", "--cache-blocks", "8192", "--prefill-per-block", "10ms"}
	for name, budget := range map[string]int{"tl": 500, "tc": 0} {
		mesh.createBackends(t, meshspec.Backend{Name: name, Process: modelServer(name, server...),
			Config: meshspec.BackendConfig{NumReplicas: 4, CPUs: 0.25, LoadAware: &meshspec.LoadAware{PromptAffinity: true, TTFTBudgetMs: budget}}})
		if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: name, Route: "/" + name, Methods: []string{"GET", "POST"},
			Traffic: map[string]float64{name: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"tl", "tc"} {
		mesh.waitPassing(t, name, 4, "http://"+mesh.n1.public+"/"+name)
	}
	client := httpClient()
	nodes := []*mtlsNode{mesh.n1, mesh.n2}
	system := strings.Repeat("You are terse. ", 64)[:512]                                                 // 8 blocks
	question := func(i int) string { return strings.Repeat(fmt.Sprintf("question %d? ", i), 300)[:2560] } // 40 blocks
	ask := func(name string, i int) string {
		return askChatAt(t, client, "http://"+nodes[i%2].public+"/"+name, name, system, question(i)).Replica
	}
	released := func(name string) float64 {
		sum := 0.0
		for _, n := range nodes {
			if v, found := scrapeMetric(t, n.metr, "servemesh_picker_affinity_released_total", "backend", name, "target", "home"); found {
				sum += v
			}
		}
		return sum
	}
	burst := func(name string, from int) map[string]int {
		by, mu := map[string]int{}, sync.Mutex{}
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() {
				a, err := postChat(t.Context(), client, "http://"+nodes[(from+i)%2].public+"/"+name, name, system, question(from+i))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				by[a.Replica]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		return by
	}
	for _, name := range []string{"tl", "tc"} {
		home := ask(name, 0)
		for i := 1; i < 4; i++ {
			if r := ask(name, i); r != home {
				t.Fatalf("%s: request %d of the prompt, one at a time, went to %s, not its home %s", name, i, r, home)
			}
		}
		if name == "tc" {
			if by := burst(name, 10); by[home] != 3 {
				t.Fatalf("tc (no budget): three requests of the prompt at once went to %v, want all at its home %s", by, home)
			}
			if v := released(name); v != 0 {
				t.Fatalf("tc (no budget): %v affinities released", v)
			}
			continue
		}
		var by map[string]int
		for try := range 5 {
			by = burst(name, 10*(try+1))
			if len(by) > 1 && released(name) > 0 {
				t.Logf("tl: three requests of the prompt at once went to %v (home %s) on try %d; %v affinities released", by, home, try+1, released(name))
				break
			}
		}
		if len(by) < 2 || released(name) == 0 {
			t.Fatalf("tl (budget 500 ms): five bursts of three requests of the prompt at once; the last went to %v, %v affinities released: want the home's released past its budget", by, released(name))
		}
	}
}
