// Package main measures what removing replicas and upgrading Envoy cost
// long answer streams and the short requests around them (issue 59), in
// the default mode (mTLS, two nodes, a backend of two replicas). In each
// phase of a run, -streams answers of -tokens tokens (one every 100 ms)
// open through both nodes while short requests enter n1 at -rate a
// second, and a second in the phase's event happens:
//
//   - quiet: nothing (the baseline, in the same run);
//   - scale-down: the backend goes from two replicas to one (then back,
//     both ready, before the next phase);
//   - node drain: the node running a replica the streams use is drained
//     (then uncordoned);
//   - Envoy hot restart: a node's agent starts with another Envoy log
//     level, which hot restarts its Envoy (n1 and n2 in turn, run by run;
//     the agents' --envoy-upgrade-grace is 60 s, so each node's previous
//     old Envoy has ended by its next).
//
// Reported, medians over -runs: the streams' time to the first token (p50
// and the slowest), the streams that ended whole over those opened, and
// the short requests' p50 and p99 and failures.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/bench/loadgen"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

func main() {
	runs := flag.Int("runs", 3, "runs of the phases")
	rate := flag.Int("rate", 100, "short requests per second entering n1")
	streams := flag.Int("streams", 8, "streams opened in each phase, through n1 and n2 in turn")
	tokens := flag.Int("tokens", 150, "tokens in each stream, one every 100 ms")
	flag.Parse()
	if err := run(*runs, *rate, *streams, *tokens); err != nil {
		fmt.Fprintln(os.Stderr, "streams:", err)
		os.Exit(1)
	}
}

// phase is one kind of event, and what each run of it measured.
type phase struct {
	name          string
	event         func(run int) error // a second into the phase
	after         func() error        // puts the mesh back for the next phase
	short         []loadgen.Stats
	ttft          [][]time.Duration // per run, each stream's time to its first token
	whole, opened int
}

type bench struct {
	mesh    *benchenv.Mesh
	levels  []string // each node's Envoy log level
	streams int
	tokens  int
}

const backend = "s"

func run(runs, rate, streams, tokens int) error {
	ctx := context.Background()
	be, err := benchenv.Start(ctx, "streams")
	if err != nil {
		return err
	}
	defer be.Close()
	mesh, err := be.StartMesh(benchenv.MeshOptions{Work: filepath.Join(be.Dir, "mesh"), NodeCPUs: []string{"2", "2"}, KeepDataPlane: true,
		AgentArgs: []string{"--envoy-upgrade-grace", "60s"}})
	if err != nil {
		return err
	}
	defer mesh.Stop()
	spec := meshspec.BackendSpec{Name: backend, Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1},
		Process: &meshspec.ProcessSpec{Command: be.Bin, Args: []string{"demo-replica", "--backend", backend, "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
	if err := testutil.Until(30*time.Second, func() bool { _, err := mesh.Client.CreateBackend(ctx, spec); return err == nil }); err != nil {
		return fmt.Errorf("the backend was not placed: %w", err)
	}
	if _, err := mesh.Client.CreateEndpoint(ctx, meshspec.Endpoint{Name: backend, Route: "/s", Traffic: map[string]float64{backend: 1}}); err != nil {
		return err
	}
	b := &bench{mesh: mesh, levels: []string{"warning", "warning"}, streams: streams, tokens: tokens}
	for _, public := range mesh.Public {
		if err := loadgen.WaitServing("http://" + public + "/s"); err != nil {
			return err
		}
	}
	if err := b.twoReady(ctx); err != nil {
		return err
	}
	phases := b.phases(ctx)
	for r := range runs {
		for _, p := range phases {
			if err := b.measure(p, r, rate); err != nil {
				return fmt.Errorf("%s, run %d: %w", p.name, r+1, err)
			}
		}
	}
	report(phases, runs, rate, streams, tokens)
	return nil
}

func (b *bench) phases(ctx context.Context) []*phase {
	c := b.mesh.Client
	two, one := 2, 1
	scale := func(n *int) error {
		_, err := c.UpdateBackend(ctx, backend, meshspec.BackendConfigPatch{NumReplicas: n})
		return err
	}
	var drained string
	return []*phase{
		{name: "quiet (baseline)"},
		{name: "scale-down 2 to 1", event: func(int) error { return scale(&one) },
			after: func() error {
				if err := scale(&two); err != nil {
					return err
				}
				return b.twoReady(ctx)
			}},
		{name: "node drain", event: func(run int) error {
			work := b.mesh.WorkDirs[1-run%2] // n2, then n1, in turn
			drained = filepath.Base(filepath.Dir(work)) + "-" + filepath.Base(work)
			_, err := c.NodeAction(ctx, drained, api.Drain)
			return err
		}, after: func() error {
			if _, err := c.NodeAction(ctx, drained, api.Uncordon); err != nil {
				return err
			}
			return b.twoReady(ctx)
		}},
		{name: "Envoy hot restart", event: func(run int) error {
			i := run % 2
			b.levels[i] = map[string]string{"info": "warning", "warning": "info"}[b.levels[i]]
			return b.mesh.RestartAgent(i, "--envoy-log-level", b.levels[i])
		}, after: func() error { return loadgen.WaitServing("http://" + b.mesh.Public[0] + "/s") }},
	}
}

// measure runs phase p once: the streams, the short requests, the event.
func (b *bench) measure(p *phase, run, rate int) error {
	d := time.Duration(b.tokens)*100*time.Millisecond + 3*time.Second
	short := make(chan loadgen.Stats, 1)
	go func() { short <- loadgen.FixedRate("http://"+b.mesh.Public[0]+"/s", rate, d) }()
	results := make([]streamed, b.streams)
	var wg sync.WaitGroup
	for i := range b.streams {
		wg.Go(func() { results[i] = stream(b.mesh.Public[i%2], b.tokens) })
	}
	if p.event != nil {
		time.Sleep(time.Second)
		if err := p.event(run); err != nil {
			wg.Wait()
			<-short
			return err
		}
	}
	wg.Wait()
	st := <-short
	p.short = append(p.short, st)
	var ttft []time.Duration
	whole := 0
	for i, r := range results {
		p.opened++
		if r.tokens == b.tokens && r.err == nil {
			whole++
		} else {
			fmt.Fprintf(os.Stderr, "  %s, run %d: stream %d through n%d: %d of %d tokens (%v)\n", p.name, run+1, i, i%2+1, r.tokens, b.tokens, r.err)
		}
		if r.first > 0 {
			ttft = append(ttft, r.first)
		}
	}
	p.whole += whole
	p.ttft = append(p.ttft, ttft)
	fmt.Fprintf(os.Stderr, "%s, run %d: %d of %d streams whole; short requests %d failed of %d %s\n", p.name, run+1, whole, len(results), st.Errors, st.N, st.FirstError)
	if p.after != nil {
		return p.after()
	}
	return nil
}

// streamed is what one stream read: its tokens, when the first came.
type streamed struct {
	tokens int
	first  time.Duration
	err    error
}

// stream reads a streamed answer of tokens tokens through public.
func stream(public string, tokens int) streamed {
	start := time.Now()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, fmt.Sprintf("http://%s/s?tokens=%d&every_ms=100", public, tokens), nil)
	if err != nil {
		return streamed{err: err}
	}
	resp, err := (&http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return streamed{err: err}
	}
	defer func() { _ = resp.Body.Close() }()
	var out streamed
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if strings.HasPrefix(lines.Text(), "token ") {
			if out.tokens == 0 {
				out.first = time.Since(start)
			}
			out.tokens++
		}
	}
	out.err = lines.Err()
	return out
}

// twoReady waits until both replicas answer through n1.
func (b *bench) twoReady(ctx context.Context) error {
	return testutil.Until(time.Minute, func() bool {
		r, err := b.mesh.Client.Status(ctx)
		if err != nil {
			return false
		}
		for _, s := range r.Backends {
			if s.Name == backend {
				return s.Ready == 2 && s.Draining == 0
			}
		}
		return false
	})
}

func report(phases []*phase, runs, rate, streams, tokens int) {
	fmt.Printf("streams: %d streams of %d tokens (100 ms apart) and %d short req/s into n1 per phase, %d runs (medians)\n", streams, tokens, rate, runs)
	fmt.Println("| phase | first token p50 | first token, slowest | streams whole | short p50 | short p99 | short failed / sent |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- |")
	for _, p := range phases {
		sent, failed := loadgen.Totals(p.short)
		fmt.Printf("| %s | %s | %s | %d / %d | %s | %s | %d / %d |\n", p.name,
			loadgen.MS(medianOf(p.ttft, 50)), loadgen.MS(medianOf(p.ttft, 100)), p.whole, p.opened,
			loadgen.MS(loadgen.Median(p.short, func(s loadgen.Stats) time.Duration { return s.P50 })),
			loadgen.MS(loadgen.Median(p.short, func(s loadgen.Stats) time.Duration { return s.P99 })), failed, sent)
	}
}

// medianOf is the median over runs of each run's p-th percentile.
func medianOf(runs [][]time.Duration, p float64) time.Duration {
	var per []time.Duration
	for _, ds := range runs {
		if len(ds) > 0 {
			per = append(per, benchenv.Percentile(ds, p))
		}
	}
	if len(per) == 0 {
		return 0
	}
	slices.Sort(per)
	return per[len(per)/2]
}
