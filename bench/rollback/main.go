// Package main measures how fast a rollout takes back a bad candidate, in
// the default mode (mTLS, two nodes, each with its Envoy), under a steady
// load entering both nodes:
//
//   - the primary answers every request; each run creates a candidate whose
//     user_config makes it answer 500 to 5% of requests (the demo replica's
//     faults) and starts a rollout of it whose first step sends it 10%;
//   - from the clients' side it records the first 500 after the rollout
//     began, and from the controller's the verdict (the rollback's
//     checkpoint) and the moment every node's Envoy acknowledged the
//     config that sends all traffic back to the primary.
//
// Reported, over -runs: from the first error to the verdict, and to the
// full rollback (every node in sync), p50 and p99 (the highest of few
// runs), and the failed requests per run.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/bench/loadgen"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

func main() {
	runs := flag.Int("runs", 7, "bad candidates rolled out, one after the other")
	workers := flag.Int("workers", 2, "clients per node, each sending its next request when the last is answered")
	flag.Parse()
	if err := run(*runs, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "rollback:", err)
		os.Exit(1)
	}
}

func run(runs, workers int) error {
	ctx := context.Background()
	be, err := benchenv.Start(ctx, "rollback")
	if err != nil {
		return err
	}
	defer be.Close()
	mesh, err := be.StartMesh(benchenv.MeshOptions{Work: filepath.Join(be.Dir, "mesh"), NodeCPUs: []string{"4", "4"}})
	if err != nil {
		return err
	}
	defer mesh.Stop()
	version := func(name string, replicas int, faults string) meshspec.BackendSpec {
		var uc meshspec.UserConfig
		_ = uc.UnmarshalJSON([]byte(faults))
		return meshspec.BackendSpec{Name: name, Config: meshspec.BackendConfig{NumReplicas: replicas, CPUs: 0.5, UserConfig: uc},
			Process: &meshspec.ProcessSpec{Command: be.Bin, HealthPath: "/", ReconfigurePath: "/-/reconfigure",
				Args: []string{"demo-replica", "--backend", name, "--listen", "${HOST}:${PORT}"}}}
	}
	if err := create(ctx, mesh.Client, version("v1", 2, `{"delay_ms": 5}`)); err != nil {
		return err
	}
	if _, err := mesh.Client.CreateEndpoint(ctx, meshspec.Endpoint{Name: "gen", Route: "/gen", Traffic: map[string]float64{"v1": 1}}); err != nil {
		return err
	}
	if err := testutil.Until(60*time.Second, func() bool { return answers(mesh.Public) }); err != nil {
		return fmt.Errorf("gen never answered on every node: %w", err)
	}
	l := startLoad(mesh.Public, workers)
	defer l.stop()
	var toVerdict, toRollback []time.Duration
	var failed []int
	for i := range runs {
		verdict, rollback, n, err := badRun(ctx, mesh.Client, l, version(fmt.Sprintf("bad-%d", i), 1, `{"delay_ms": 5, "error_rate": 0.05}`))
		if err != nil {
			return fmt.Errorf("run %d: %w", i, err)
		}
		toVerdict, toRollback, failed = append(toVerdict, verdict), append(toRollback, rollback), append(failed, n)
	}
	fmt.Printf("a candidate failing 5%% of requests, first step 10%%, %d runs (%d clients per node, %d requests sent):\n\n", runs, workers, l.sent.Load())
	fmt.Println("| from the first error to | p50 | p99 (highest) | each run |")
	fmt.Println("|---|---:|---:|---|")
	row := func(to string, ds []time.Duration) {
		fmt.Printf("| %s | %s | %s | %s |\n", to, benchenv.Millis(benchenv.Percentile(ds, 50)), benchenv.Millis(benchenv.Percentile(ds, 100)), list(ds))
	}
	row("the verdict (rollback checkpointed)", toVerdict)
	row("every node's Envoy on the primary only", toRollback)
	fmt.Println()
	fmt.Printf("failed requests per run: %v\n", failed)
	return nil
}

// badRun rolls out bad and returns the times from the first error the
// clients saw to the verdict and to every node running the rollback, and
// how many requests failed.
func badRun(ctx context.Context, c *api.Client, l *load, bad meshspec.BackendSpec) (verdict, rollback time.Duration, failed int, err error) {
	if err := create(ctx, c, bad); err != nil {
		return 0, 0, 0, err
	}
	before := l.failures()
	r := meshspec.Rollout{Candidate: bad.Name, Steps: []meshspec.RolloutStep{{Weight: 0.1, DurationS: 120, MinRequests: 1000}, {Weight: 1, DurationS: 60}}}
	if _, err := c.StartRollout(ctx, "gen", r); err != nil {
		return 0, 0, 0, err
	}
	var rep api.RolloutReport
	if err := testutil.Until(120*time.Second, func() bool {
		rep, err = c.Rollout(ctx, "gen")
		return err == nil && !rep.Phase.Active()
	}); err != nil {
		return 0, 0, 0, fmt.Errorf("the rollout of %s did not end", bad.Name)
	}
	if rep.Phase != meshspec.RolloutRolledBack {
		return 0, 0, 0, fmt.Errorf("the rollout of %s ended %s: %s", bad.Name, rep.Phase, rep.Reason)
	}
	if err := testutil.Until(30*time.Second, func() bool { return inSync(ctx, c) }); err != nil {
		return 0, 0, 0, fmt.Errorf("the nodes never ran the rollback")
	}
	synced := time.Now() // within the 50 ms poll of the last ACK
	time.Sleep(2 * time.Second)
	errs := l.failures()[len(before):]
	if len(errs) == 0 {
		return 0, 0, 0, fmt.Errorf("the candidate %s failed no request", bad.Name)
	}
	first, at := errs[0], time.UnixMilli(rep.Verdicts[len(rep.Verdicts)-1].AtMs)
	if _, err := c.DeleteBackend(ctx, bad.Name); err != nil {
		return 0, 0, 0, err
	}
	return at.Sub(first), synced.Sub(first), len(errs), nil
}

// inSync reports whether every node's Envoy acknowledged the latest config.
func inSync(ctx context.Context, c *api.Client) bool {
	s, err := c.Status(ctx)
	if err != nil || len(s.Nodes) == 0 {
		return false
	}
	for _, n := range s.Nodes {
		if !n.InSync {
			return false
		}
	}
	return true
}

func create(ctx context.Context, c *api.Client, b meshspec.BackendSpec) error {
	if err := testutil.Until(30*time.Second, func() bool { _, err := c.CreateBackend(ctx, b); return err == nil }); err != nil {
		return fmt.Errorf("create backend %s (are the agents up?): %w", b.Name, err)
	}
	return nil
}

func answers(public []string) bool {
	for _, p := range public {
		resp, err := http.Get("http://" + p + "/gen") //nolint:noctx // one bounded probe
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
	}
	return true
}

// load is closed-loop clients on every node, recording when requests fail.
type load struct {
	sent atomic.Int64
	mu   sync.Mutex
	errs []time.Time
	done chan struct{}
	wg   sync.WaitGroup
}

func startLoad(public []string, workers int) *load {
	l := &load{done: make(chan struct{})}
	for _, p := range public {
		for range workers {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				client := loadgen.NewClient(1)
				for {
					select {
					case <-l.done:
						return
					default:
					}
					err := loadgen.Get(client, "http://"+p+"/gen")
					l.sent.Add(1)
					if err != nil {
						l.mu.Lock()
						l.errs = append(l.errs, time.Now())
						l.mu.Unlock()
					}
				}
			}()
		}
	}
	return l
}

func (l *load) failures() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

func (l *load) stop() {
	close(l.done)
	l.wg.Wait()
}

func list(ds []time.Duration) string {
	out := ""
	for i, d := range ds {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond))
	}
	return out + " ms"
}
