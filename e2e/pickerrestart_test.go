//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/picker"
	"github.com/servemesh/servemesh/meshspec"
)

// TestPromptHitsAcrossAgentRestarts: on the default mesh (mTLS, two
// nodes), twelve tenants' long prompts at 40 requests a second through
// both nodes to a backend of four stand-in model servers with prompt
// affinity, two on each node. Under that load both nodes' agents restart
// twice: once keeping the pickers' checkpoints (kept), once with them
// removed while the agents are down (forgot, as every restart was before
// the checkpoint). The servers' prefix caches hold 150 blocks, three
// tenants' prompts: the fleet's hold them all only while each tenant
// keeps its replica. No request fails. For each restart it logs the
// prefix hit rate (blocks found cached) before it, while the agents are
// down (Envoy picks alone), in each quarter second after the new agents
// are ready, and how long after that the rate stays at 95% of the one
// before (bench/inference -workload restart collects them for
// BENCHMARKS.md).
func TestPromptHitsAcrossAgentRestarts(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "prr")
	mesh.createBackends(t, meshspec.Backend{Name: "prr",
		Process: modelServer("prr", "--slots", "4", "--service", "5ms", "--cache-blocks", "150", "--prefill-per-block", "1ms"),
		Config:  meshspec.BackendConfig{NumReplicas: 4, CPUs: 0.25, LoadAware: &meshspec.LoadAware{PromptAffinity: true}}})
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "prr", Route: "/prr", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"prr": 1}}); err != nil {
		t.Fatal(err)
	}
	mesh.waitPassing(t, "prr", 4, "http://"+mesh.n1.public+"/prr")
	on := map[string]int{}
	for _, node := range runningOn(placements(t, mesh.c, "prr")) {
		on[node]++
	}
	if len(on) != 2 {
		t.Fatalf("prr runs on %v, want both nodes", on)
	}
	phase := loadSeconds(t, "PROMPT_RESTART_LOAD_S", 4)
	l := &timedPrompts{promptLoop: promptLoop{urls: []string{"http://" + mesh.n1.public + "/prr", "http://" + mesh.n2.public + "/prr"}, tenants: 12}}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); l.run(40, stop) }()
	type restart struct {
		mode         string
		begun, ready time.Time
	}
	var restarts []restart
	for _, mode := range []string{"kept", "forgot"} {
		time.Sleep(phase) // the load settles: every tenant has its replica
		r := restart{mode: mode, begun: time.Now()}
		for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
			restartPicker(t, n, on[n.id], mode == "forgot")
		}
		r.ready = time.Now()
		restarts = append(restarts, r)
		time.Sleep(phase)
	}
	close(stop)
	<-done
	if l.failed > 0 {
		t.Errorf("%d of %d requests failed across the agents' restarts (first: %s)", l.failed, len(l.sent)+l.failed, l.firstFailure)
	}
	for _, r := range restarts {
		before := l.hitRate(r.begun.Add(-2*time.Second), r.begun)
		var quarters []string
		for q := range 8 {
			from := r.ready.Add(time.Duration(q) * 250 * time.Millisecond)
			quarters = append(quarters, fmt.Sprintf("%.2f", l.hitRate(from, from.Add(250*time.Millisecond))))
		}
		t.Logf("BENCH restart mode=%s hit_before=%.3f hit_during=%.3f hit_first_second=%.3f hit_after=%.3f recovery_ms=%.0f restart_ms=%.0f quarters=%s",
			r.mode, before, l.hitRate(r.begun, r.ready), l.hitRate(r.ready, r.ready.Add(time.Second)), l.hitRate(r.ready, r.ready.Add(phase)),
			ms(l.recovery(r.ready, 0.95*before, phase)), ms(r.ready.Sub(r.begun)), strings.Join(quarters, ","))
	}
}

// restartPicker stops n's agent, removes its picker's checkpoint if
// forget, and starts it again, waiting until it has adopted want replicas
// and its Envoy is ready.
func restartPicker(t *testing.T, n *mtlsNode, want int, forget bool) {
	t.Helper()
	if !forget {
		restartAgent(t, n.agentProc, false, want, nil)
		return
	}
	// The agent writes its checkpoint as it stops: remove it after.
	if err := n.child.Stop(15 * time.Second); err != nil {
		t.Fatalf("agent %s: %v", n.id, err)
	}
	path := filepath.Join(n.workDir, picker.CheckpointFile)
	if err := os.Remove(path); err != nil {
		t.Fatalf("the picker's checkpoint of %s, written as its agent stopped: %v", n.id, err)
	}
	restartStopped(t, n.agentProc, want)
}

// timedPrompts is a promptLoop that also keeps when each answered
// request was sent, with its prompt's blocks, found cached or not.
type timedPrompts struct {
	promptLoop
	sentMu sync.Mutex
	sent   []sentPrompt
}

type sentPrompt struct {
	at             time.Time
	blocks, cached int
}

// run sends rate requests a second, open loop, until stop closes, and
// waits for their answers.
func (l *timedPrompts) run(rate int, stop <-chan struct{}) {
	client := loadClient()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		wg.Go(func() { l.one(client, i) })
	}
}

// one sends request i, of tenant i*7 mod tenants (every tenant in turn,
// not in order), through the urls in turn.
func (l *timedPrompts) one(client *http.Client, i int) {
	tenant := (i * 7) % l.tenants
	body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`,
		strings.Repeat(fmt.Sprintf("Tenant %d's assistant answers in its house style. ", tenant), 60), i)
	at := time.Now()
	_, a, _, err := timedPost(client, l.urls[i%len(l.urls)], body)
	l.sentMu.Lock()
	defer l.sentMu.Unlock()
	if err != nil {
		if l.failed++; l.firstFailure == "" {
			l.firstFailure = err.Error()
		}
		return
	}
	l.sent = append(l.sent, sentPrompt{at: at, blocks: a.Blocks, cached: a.Cached})
}

// hitRate is the share of the blocks of the prompts sent in [from, to)
// found cached.
func (l *timedPrompts) hitRate(from, to time.Time) float64 {
	l.sentMu.Lock()
	defer l.sentMu.Unlock()
	blocks, cached := 0, 0
	for _, s := range l.sent {
		if !s.at.Before(from) && s.at.Before(to) {
			blocks, cached = blocks+s.blocks, cached+s.cached
		}
	}
	return float64(cached) / float64(max(blocks, 1))
}

// recovery is how long after from the hit rate of every quarter second
// until from+within is at least target: the start of the first quarter
// after the last one below it.
func (l *timedPrompts) recovery(from time.Time, target float64, within time.Duration) time.Duration {
	var below []time.Duration
	for q := time.Duration(0); q < within; q += 250 * time.Millisecond {
		if l.hitRate(from.Add(q), from.Add(q+250*time.Millisecond)) < target {
			below = append(below, q)
		}
	}
	if len(below) == 0 {
		return 0
	}
	sort.Slice(below, func(i, j int) bool { return below[i] < below[j] })
	return below[len(below)-1] + 250*time.Millisecond
}
