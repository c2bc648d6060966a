// Package main measures what restarts of servemesh's agents cost the
// requests a mesh serves, in the default mode (mTLS, two nodes, a replica
// on each, requests entering n1 and crossing to n2 for half of them), at a
// fixed rate, in three phases of each run:
//
//   - steady: nothing restarts (the baseline, in the same run);
//   - agent restarts: each node's agent is stopped (SIGTERM) and started
//     again, in turn, throughout the phase; each adopts its node's Envoy
//     and replica;
//   - hot restarts: the same, each start with another Envoy log level, so
//     each node's Envoy is hot restarted (--restart-epoch); reported too,
//     the time from the agent's start to the new Envoy serving at the next
//     epoch.
//
// Reported, medians over -runs: p50, p99 and p99.9 of the requests'
// latency, and the failed requests.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/bench/loadgen"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

func main() {
	runs := flag.Int("runs", 3, "runs of the three phases")
	rate := flag.Int("rate", 200, "requests per second entering n1")
	seconds := flag.Int("seconds", 12, "length of each phase")
	flag.Parse()
	if err := run(*runs, *rate, time.Duration(*seconds)*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "restarts:", err)
		os.Exit(1)
	}
}

type phase struct {
	name    string
	stats   []loadgen.Stats
	handoff []time.Duration
}

func run(runs, rate int, d time.Duration) error {
	ctx := context.Background()
	be, err := benchenv.Start(ctx, "restarts")
	if err != nil {
		return err
	}
	defer be.Close()
	// Each node is hot restarted every two seconds: its old Envoy serves
	// what it has open for a second after its drain (the default, 10
	// minutes, would defer each next hot restart until it had ended).
	mesh, err := be.StartMesh(benchenv.MeshOptions{Work: filepath.Join(be.Dir, "mesh"), NodeCPUs: []string{"2", "2"}, KeepDataPlane: true,
		AgentArgs: []string{"--envoy-upgrade-grace", "1s"}})
	if err != nil {
		return err
	}
	defer mesh.Stop()
	spec := meshspec.BackendSpec{Name: "r", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1},
		Process: &meshspec.ProcessSpec{Command: be.Bin, Args: []string{"demo-replica", "--backend", "r", "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
	if err := testutil.Until(30*time.Second, func() bool { _, err := mesh.Client.CreateBackend(ctx, spec); return err == nil }); err != nil {
		return fmt.Errorf("the backend was not placed: %w", err)
	}
	if _, err := mesh.Client.CreateEndpoint(ctx, meshspec.Endpoint{Name: "r", Route: "/r", Traffic: map[string]float64{"r": 1}}); err != nil {
		return err
	}
	url := "http://" + mesh.Public[0] + "/r"
	if err := loadgen.WaitServing(url); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // both replicas ready
	steady, agents, hot := &phase{name: "steady (baseline)"}, &phase{name: "agent restarts"}, &phase{name: "Envoy hot restarts"}
	levels := []string{"warning", "warning"} // each node's Envoy log level: servemesh's default first
	for range runs {
		steady.stats = append(steady.stats, loadgen.FixedRate(url, rate, d))
		st, err := during(url, rate, d, func() error { return mesh.RestartAgent(0) }, func() error { return mesh.RestartAgent(1) })
		if err != nil {
			return err
		}
		agents.stats = append(agents.stats, st)
		hotRestart := func(i int) func() error {
			return func() error {
				levels[i] = map[string]string{"info": "warning", "warning": "info"}[levels[i]]
				epoch := epochOf(mesh.WorkDirs[i])
				began := time.Now()
				if err := mesh.RestartAgent(i, "--envoy-log-level", levels[i]); err != nil {
					return err
				}
				if err := testutil.Until(time.Minute, func() bool { return epochOf(mesh.WorkDirs[i]) == epoch+1 }); err != nil {
					return fmt.Errorf("node %d's envoy was not hot restarted: %w", i+1, err)
				}
				hot.handoff = append(hot.handoff, time.Since(began))
				return nil
			}
		}
		if st, err = during(url, rate, d, hotRestart(0), hotRestart(1)); err != nil {
			return err
		}
		hot.stats = append(hot.stats, st)
	}
	fmt.Printf("restarts: %d req/s into n1, %s phases, %d runs (medians)\n", rate, d, runs)
	fmt.Println("| phase | p50 | p99 | p99.9 | failed / sent |")
	fmt.Println("| --- | --- | --- | --- | --- |")
	for _, p := range []*phase{steady, agents, hot} {
		sent, failed := loadgen.Totals(p.stats)
		fmt.Printf("| %s | %s | %s | %s | %d / %d |\n", p.name, loadgen.MS(loadgen.Median(p.stats, func(s loadgen.Stats) time.Duration { return s.P50 })),
			loadgen.MS(loadgen.Median(p.stats, func(s loadgen.Stats) time.Duration { return s.P99 })),
			loadgen.MS(loadgen.Median(p.stats, func(s loadgen.Stats) time.Duration { return s.P999 })), failed, sent)
	}
	fmt.Printf("Envoy hot restart, agent start to the new epoch serving: median %s (of %d)\n", benchenv.Millis(benchenv.Percentile(hot.handoff, 50)), len(hot.handoff))
	return nil
}

// during runs the fixed-rate load for d while it calls each restart in
// turn, a second apart, over and over.
func during(url string, rate int, d time.Duration, restarts ...func() error) (loadgen.Stats, error) {
	done := make(chan loadgen.Stats, 1)
	go func() { done <- loadgen.FixedRate(url, rate, d) }()
	end := time.Now().Add(d - 2*time.Second)
	for i := 0; time.Now().Before(end); i++ {
		time.Sleep(time.Second)
		if err := restarts[i%len(restarts)](); err != nil {
			<-done
			return loadgen.Stats{}, err
		}
	}
	return <-done, nil
}

// epochOf is the restart epoch of the Envoy recorded in a node's folder.
func epochOf(dir string) int {
	var rec struct {
		Epoch int `json:"epoch"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "envoy-process.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		return -1
	}
	return rec.Epoch
}
