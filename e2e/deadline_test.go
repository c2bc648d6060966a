//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestDeadlines: on the default mesh (mTLS, two nodes), requests that
// state a time to first token (x-servemesh-ttft-objective-ms), from inside
// the mesh only.
//
// A backend of two stand-in model servers (50 ms an answer), one on each
// node, with load_aware.refuse_late: a request from a node's mesh listener
// stating 1 ms, less than its replicas take, is refused at once (429,
// naming the header); the same from outside, through the public
// listener, which removes a client's objective, is served; one stating
// ten seconds is served.
//
// Then the same load (DEADLINE_RATE requests a second, 10 by default,
// about what the servers answer; half stating 600 ms, half 4 s) to two
// identical backends (two servers of one slot each, 100 ms an answer
// alone), from the mesh listeners: one gets the objectives
// (waiting requests of one priority served earliest deadline first), the
// other the same requests without them (first come, first served, as
// before). No request fails; each one's share meeting its objective (the
// goodput) goes to the log (bench/inference -workload deadlines collects
// it for BENCHMARKS.md).
func TestDeadlines(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "ddl")
	mesh.createBackends(t, meshspec.Backend{Name: "late", Process: modelServer("late", "--slots", "4", "--service", "50ms"),
		Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.25, LoadAware: &meshspec.LoadAware{RefuseLate: true}}})
	for _, name := range []string{"edf", "fifo"} {
		mesh.createBackends(t, meshspec.Backend{Name: name, Process: modelServer(name, "--slots", "1", "--service", "100ms"),
			Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.25, MaxConcurrentQueries: 1, LoadAware: &meshspec.LoadAware{}}})
	}
	for _, name := range []string{"late", "edf", "fifo"} {
		if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: name, Route: "/" + name, Methods: []string{"GET", "POST"},
			Traffic: map[string]float64{name: 1}}); err != nil {
			t.Fatal(err)
		}
		mesh.waitPassing(t, name, 2, "http://"+mesh.n1.public+"/"+name)
		if nodes := runningOn(placements(t, mesh.c, name)); len(distinct(nodes)) != 2 {
			t.Fatalf("%s runs on %v, want one replica on each node", name, nodes)
		}
	}
	client := loadClient()
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for i := range 10 { // each node's picker learns its replicas' pace
		if status, _, _, text, _ := postModel(client, "http://"+[]*mtlsNode{mesh.n1, mesh.n2}[i%2].public+"/late", body); status != http.StatusOK {
			t.Fatalf("warming up: %d %s", status, text)
		}
	}
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		status, _, _, text, _ := postModel(client, "http://"+n.mesh+"/", body, "Host", "late", wire.TTFTObjectiveHeader, "1")
		if status != http.StatusTooManyRequests || !strings.Contains(text, wire.TTFTObjectiveHeader) {
			t.Errorf("through %s's mesh listener, an objective of 1 ms: %d %q; want 429 naming %s", n.id, status, text, wire.TTFTObjectiveHeader)
		}
		if status, _, _, text, _ := postModel(client, "http://"+n.public+"/late", body, wire.TTFTObjectiveHeader, "1"); status != http.StatusOK {
			t.Errorf("through %s's public listener, which removes a client's objective: %d %q; want 200", n.id, status, text)
		}
		if status, _, _, text, _ := postModel(client, "http://"+n.mesh+"/", body, "Host", "late", wire.TTFTObjectiveHeader, "10000"); status != http.StatusOK {
			t.Errorf("through %s's mesh listener, an objective of 10 s: %d %q; want 200", n.id, status, text)
		}
	}

	d, rate := loadSeconds(t, "DEADLINE_LOAD_S", 6), int(loadSeconds(t, "DEADLINE_RATE", 10)/time.Second)
	loads := map[string]*deadlineLoad{"edf": {host: "edf", stated: true}, "fifo": {host: "fifo"}}
	var wg sync.WaitGroup
	for _, l := range loads {
		l.urls = []string{"http://" + mesh.n1.mesh + "/", "http://" + mesh.n2.mesh + "/"}
		wg.Go(func() { l.run(rate, d) })
	}
	wg.Wait()
	for _, mode := range []string{"edf", "fifo"} {
		l := loads[mode]
		if l.failed > 0 {
			t.Errorf("%s: %d of %d requests failed (first: %s)", mode, l.failed, l.sent, l.firstFailure)
		}
		t.Logf("BENCH deadlines mode=%s rate=%d requests=%d goodput=%.3f tight_met=%.3f loose_met=%.3f", mode, rate, l.sent, l.goodput(), l.share("tight"), l.share("loose"))
	}
}

// deadlineLoad sends, open loop, requests of two classes in turn (tight:
// a 600 ms objective, loose: 4 s) to a node's mesh listener for host,
// stating the objective if stated, and counts those whose first byte came
// within it.
type deadlineLoad struct {
	urls   []string
	host   string
	stated bool

	mu           sync.Mutex
	sent, failed int
	firstFailure string
	met, of      map[string]int // by class
}

var deadlineClasses = []struct {
	name      string
	objective time.Duration
}{{"tight", 600 * time.Millisecond}, {"loose", 4 * time.Second}}

func (l *deadlineLoad) run(rate int, d time.Duration) {
	l.met, l.of = map[string]int{}, map[string]int{}
	client := loadClient()
	atRate(rate, d, func(i int) {
		class := deadlineClasses[i%2]
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, l.urls[i%len(l.urls)],
			strings.NewReader(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}]}`, i)))
		req.Host = l.host
		req.Header.Set("Content-Type", "application/json")
		if l.stated {
			req.Header.Set(wire.TTFTObjectiveHeader, fmt.Sprint(class.objective.Milliseconds()))
		}
		start := time.Now()
		resp, err := client.Do(req)
		took := time.Since(start)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.sent++
		if err != nil {
			if l.failed++; l.firstFailure == "" {
				l.firstFailure = err.Error()
			}
			return
		}
		l.of[class.name]++
		if took <= class.objective {
			l.met[class.name]++
		}
	})
}

// goodput is the share of the answered requests whose answer began
// within their objective.
func (l *deadlineLoad) goodput() float64 {
	return float64(l.met["tight"]+l.met["loose"]) / float64(max(l.of["tight"]+l.of["loose"], 1))
}

// share is the share of class's answered requests whose answer began
// within its objective.
func (l *deadlineLoad) share(class string) float64 {
	return float64(l.met[class]) / float64(max(l.of[class], 1))
}
