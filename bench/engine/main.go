// Package main measures model traffic on a real model server with the
// field's own yardstick: inference-perf (the Gateway API Inference
// Extension's benchmarking tool) drives llama.cpp's server (the engine
// `make tools` builds) through servemesh, picking by prompt affinity, by
// load and by least requests, beside a hand-written Envoy doing round
// robin and straight to one server, one after another in the same run.
//
//	go run ./bench/engine [-runs 3] [-rates 1,2] [-seconds 40] [-warmup 0] [-shape shared-prefix|unshared|multi-turn] [-cache-mb 16] [-per-node 1] [-budget-ms 0] [-only prompt-affinity,least-requests]
//
// Through servemesh the mesh is the default one (mTLS): two nodes, a
// replica of the engine on each (-per-node 2: two, so each node's picker
// has a choice; the hand-written Envoy then has four), and with
// -budget-ms a fourth backend picking by token load (prompt affinity with
// that load_aware.ttft_budget_ms), the load entering at the first node, so
// half the requests, or those prompt affinity places there, cross to the
// other. Each engine serves the small model tools/model/make_model.py
// writes, one thread, its RAM prompt cache limited to -cache-mb (the
// memory a real engine's KV cache has: a few of the shape's prompts, not
// all of them). Every configuration starts on new engines. It prints, per
// configuration and rate, inference-perf's time to first token (p50, p90,
// p99), inter-token latency, output tokens a second, and the engines' own
// prompt-cache hit share (tokens their logs say they reused, of those they
// were sent), medians of -runs runs. With -warmup, each run is preceded
// by that many seconds of the same load, not counted: the figures are of
// engines that have seen the shape's prompts (a steady state), not of
// new ones. It needs `make tools` and `make
// bench-tools` (inference-perf, in .tools/perf-venv).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/servemesh/servemesh/bench/benchenv"
)

func main() {
	runs := flag.Int("runs", 3, "runs of each configuration; the figures are their medians")
	rates := flag.String("rates", "1,2", "requests a second, comma-separated")
	seconds := flag.Int("seconds", 40, "seconds of load in each run")
	warmup := flag.Int("warmup", 0, "seconds of the same load before each run, not counted (0: none)")
	shape := flag.String("shape", "shared-prefix", "shared-prefix (6 system prompts of 2,000 tokens, shared), unshared (each prompt its own) or multi-turn (shared-prefix conversations)")
	cacheMB := flag.Int("cache-mb", 16, "each engine's RAM prompt cache, in MB")
	perNode := flag.Int("per-node", 1, "engine replicas on each node (1 or 2); the hand-written Envoy has as many in all")
	budgetMs := flag.Int("budget-ms", 0, "with a budget, a backend picking by token load (prompt affinity, load_aware.ttft_budget_ms of it) is measured too")
	only := flag.String("only", "", "the configurations to measure, comma-separated parts of their names (prompt-affinity, load-aware, least-requests, Envoy, direct); empty: all")
	flag.Parse()
	if _, ok := shapes[*shape]; !ok {
		log.Fatalf("-shape %q: give shared-prefix, unshared or multi-turn", *shape)
	}
	if *perNode < 1 || *perNode > 2 {
		log.Fatalf("-per-node %d: give 1 or 2 (the machine's two cores run every engine)", *perNode)
	}
	if *budgetMs < 0 || *budgetMs > 600000 {
		log.Fatalf("-budget-ms %d: give 0 (no token-load backend) to 600000", *budgetMs)
	}
	if err := run(*runs, *rates, workload{shape: *shape, seconds: *seconds, warmup: *warmup}, fleet{cacheMB: *cacheMB, perNode: *perNode, budgetMs: *budgetMs}, *only); err != nil {
		log.Fatal(err)
	}
}

// run measures every configuration at each rate, runs times, and prints
// the medians.
// workload is what inference-perf sends in one run: the shape, at a rate
// for seconds, after warmup seconds not counted.
type workload struct {
	shape           string
	rate            float64
	seconds, warmup int
}

// fleet is the engines each configuration runs: caches of cacheMB, perNode
// on each node, and a token-load backend with budgetMs (0: none).
type fleet struct{ cacheMB, perNode, budgetMs int }

func run(runs int, rates string, w workload, fl fleet, only string) error {
	ctx := context.Background()
	env, err := benchenv.Start(ctx, "engine")
	if err != nil {
		return err
	}
	defer env.Close()
	eng, err := findEngine(fl.cacheMB)
	if err != nil {
		return err
	}
	perf, err := findPerf()
	if err != nil {
		return err
	}
	mesh, err := env.StartMesh(benchenv.MeshOptions{Work: filepath.Join(env.Dir, "mesh"), NodeCPUs: []string{"4", "4"},
		AgentArgs: eng.AllowFlags()})
	if err != nil {
		return err
	}
	defer mesh.Stop()
	var targets []target
	if fl.budgetMs > 0 {
		targets = append(targets, meshTarget(mesh, eng, "token-load", fl.perNode, fl.budgetMs))
	}
	targets = append(targets, meshTarget(mesh, eng, "prompt-affinity", fl.perNode, 0), meshTarget(mesh, eng, "load-aware", fl.perNode, 0),
		meshTarget(mesh, eng, "least-requests", fl.perNode, 0), envoyTarget(env, eng, 2*fl.perNode), directTarget(env, eng))
	if only != "" {
		targets = slices.DeleteFunc(targets, func(t target) bool {
			return !slices.ContainsFunc(strings.Split(only, ","), func(part string) bool { return strings.Contains(t.name, part) })
		})
		if len(targets) == 0 {
			return fmt.Errorf("-only %q names no configuration", only)
		}
	}
	all := map[string][]figures{}
	var keys []string
	for _, rate := range strings.Split(rates, ",") {
		var err error
		if w.rate, err = strconv.ParseFloat(rate, 64); err != nil {
			return fmt.Errorf("-rates: %q is not a rate", rate)
		}
		for i := 1; i <= runs; i++ {
			for _, t := range targets {
				f, err := measure(ctx, t, perf, eng, w, filepath.Join(env.Dir, fmt.Sprintf("perf-%s-%s-%d", t.name, rate, i)))
				if err != nil {
					return fmt.Errorf("%s at %s/s, run %d: %w", t.name, rate, i, err)
				}
				key := t.name + "@" + rate
				if _, seen := all[key]; !seen {
					keys = append(keys, key)
				}
				all[key] = append(all[key], f)
				fmt.Printf("run %d, %s at %s/s: %s\n", i, t.name, rate, f)
			}
		}
	}
	report(keys, all, runs, w, fl)
	return nil
}

// report prints the medians of each configuration's runs.
func report(keys []string, all map[string][]figures, runs int, w workload, fl fleet) {
	fmt.Printf("\n%s, %d s a run after %d s of warm-up, engines' prompt caches %d MB, %d a node (token load's budget %d ms); medians of %d runs (inference-perf's figures; the hit share from the engines' logs)\n\n",
		w.shape, w.seconds, w.warmup, fl.cacheMB, fl.perNode, fl.budgetMs, runs)
	fmt.Println("| configuration | rate | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | output tok/s | prompt-cache hit share | failed |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, key := range keys {
		name, rate, _ := strings.Cut(key, "@")
		fs := all[key]
		pick := func(v func(figures) float64) float64 {
			xs := make([]float64, len(fs))
			for i, f := range fs {
				xs[i] = v(f)
			}
			sort.Float64s(xs)
			return xs[len(xs)/2]
		}
		fmt.Printf("| %s | %s/s | %.0f ms | %.0f ms | %.0f ms | %.1f ms | %.1f | %.2f | %.0f |\n", name, rate,
			pick(func(f figures) float64 { return f.ttftP50 }), pick(func(f figures) float64 { return f.ttftP90 }),
			pick(func(f figures) float64 { return f.ttftP99 }), pick(func(f figures) float64 { return f.itlP50 }),
			pick(func(f figures) float64 { return f.outputTPS }), pick(func(f figures) float64 { return f.hitShare }),
			pick(func(f figures) float64 { return float64(f.failed) }))
	}
}

// measure runs inference-perf against t, started afresh, after w's
// warm-up, and reads its figures and what the engines logged since the
// warm-up.
func measure(ctx context.Context, t target, perf string, eng *engine, w workload, dir string) (figures, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return figures{}, err
	}
	url, logs, stop, err := t.start(ctx, dir)
	if err != nil {
		return figures{}, err
	}
	defer stop()
	if w.warmup > 0 {
		if err := os.MkdirAll(filepath.Join(dir, "warmup"), 0o755); err != nil {
			return figures{}, err
		}
		if _, err := runPerf(ctx, perf, eng, url, w.shape, w.rate, w.warmup, filepath.Join(dir, "warmup")); err != nil {
			return figures{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	from := logSizes(logs())
	f, err := runPerf(ctx, perf, eng, url, w.shape, w.rate, w.seconds, dir)
	if err != nil {
		return figures{}, err
	}
	if f.hitShare, err = hitShare(logs(), from); err != nil {
		return figures{}, err
	}
	return f, nil
}
