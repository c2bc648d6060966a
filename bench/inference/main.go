// Package main compares load-aware replica picking with least
// requests, side by side in the same runs, on the real mesh (Consul, the
// controller, two nodes' agents and Envoys in the default mTLS mode): it
// runs e2e TestInferenceServing's first part -runs times with -seconds of
// load, and prints each run's figures and their medians.
//
//	go run ./bench/inference [-runs 3] [-seconds 30] [-workload slow-replica|prompts|prompts-unshared|fairness|multiplexing]
//
// Each run: two backends of three stand-in model servers (a batch of 4,
// 20 ms alone, slower as the batch grows), one replica of each three times
// slower; one backend picked by load, the other by least requests; and,
// the baseline without the mesh, three more behind a minimal hand-written
// Envoy picking by least requests (e2e/testdata/inference-baseline.yaml).
// Each gets 70 requests a second at once (the mesh's entering at both
// nodes; open loop: a slow answer does not slow the load). It needs
// `make tools`.
//
// With -workload prompts it runs e2e TestPromptWorkload instead: twelve
// tenants' long system prompts at 40 requests a second through four
// backends of stand-in servers with small prefix caches (prompt affinity,
// load-aware alone, least requests, and the hand-written Envoy), and
// prints each one's prefix hit rate beside the oracle's and its times to
// first byte. -workload prompts-unshared is the same with no prompt
// shared (every request its own, nothing to find cached): what prompt
// affinity costs where it cannot help.
//
// With -workload fairness it runs e2e TestFairnessUnderBurst: a steady
// tenant at 8 requests a second and a bursting one at 80 through a
// backend of two stand-in servers that serve fewer, once with the
// backend's tenant_header (tenants take turns while requests wait) and
// once without (first come first served); it prints each tenant's times
// to first byte.
//
// With -workload restart it runs e2e TestPromptHitsAcrossAgentRestarts:
// twelve tenants' long prompts at 40 requests a second through a backend
// of four stand-in servers with prompt affinity and small prefix caches,
// both nodes' agents restarted under that load twice, keeping the
// pickers' checkpoints and with them removed; it prints, for each, the
// prefix hit rate before, while the agents are down, in the first second
// after and the rest of the phase, and how long until it stays at 95% of
// the rate before.
//
// With -workload stall it runs e2e TestAStalledReplicaIsTriedAgain: twenty
// chat requests through both nodes to a backend of two stand-in servers,
// one of which stalls every POST, with first_byte_timeout_s 0.5; it prints
// how long the requests took, and how much beyond the bound the slowest
// did.
//
// With -workload deadlines it runs e2e TestDeadlines at 10, 12 and 16
// requests a second (about what the servers answer, 20% and 60% over),
// half stating a 600 ms time to first token, half 4 s, from inside the mesh to two identical backends of two one-slot
// stand-in servers, one getting the objectives (earliest deadline first),
// the other not (first come, first served); it prints each one's goodput,
// the share of requests answered within their objective.
//
// With -workload multiplexing it runs e2e TestMultiplexingWorkload: eight
// models at 40 requests a second on four stand-in servers that hold two
// each, picked with max_models_per_replica and by least requests; it
// prints each one's model loads per 1,000 requests.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	runs := flag.Int("runs", 3, "runs of the comparison")
	seconds := flag.Int("seconds", 30, "seconds of load in each run")
	workload := flag.String("workload", "slow-replica", "slow-replica (one replica three times slower), prompts (long shared prompts, prefix caches), prompts-unshared (the same, none shared), restart (agents restarted under prompts' load, with and without the pickers' checkpoints), stall (a replica that stalls, first_byte_timeout_s 0.5), deadlines (requests stating their time to first token, earliest deadline first or not), fairness (one tenant bursting at ten times another's rate) multiplexing (eight models on four servers holding two) or prompts-sweep (prompts with long questions at -rates, prefill-bound servers, token load beside prompt affinity: the knee)")
	rates := flag.String("rates", "10,20,30,40", "prompts-sweep: requests a second per backend, comma-separated")
	sloMs := flag.Float64("slo-ms", 1000, "prompts-sweep: the time to first byte, p90, a rate's answers must keep to count as under the knee")
	budgetMs := flag.Int("budget-ms", 300, "prompts-sweep: token load's load_aware.ttft_budget_ms")
	hot := flag.Int("hot-percent", 0, "prompts-sweep: the share of requests (0 to 100) that are one tenant's, a hot prefix; 0: every tenant in turn")
	flag.Parse()
	switch *workload {
	case "prompts-sweep":
		if *hot < 0 || *hot > 100 {
			fmt.Fprintf(os.Stderr, "-hot-percent %d: want a share of the requests, 0 to 100\n", *hot)
			os.Exit(2)
		}
		sweep(*runs, *seconds, *rates, *sloMs, *budgetMs, *hot)
		return
	case "prompts", "prompts-unshared":
		prompts(*runs, *seconds, *workload == "prompts-unshared")
		return
	case "fairness":
		fairness(*runs, *seconds)
		return
	case "multiplexing":
		multiplexing(*runs, *seconds)
		return
	case "restart":
		restarts(*runs, *seconds)
		return
	case "stall":
		stalls(*runs)
		return
	case "deadlines":
		deadlines(*runs, *seconds)
		return
	}
	placements := map[string]int{} // load-aware runs by whether the slow replica was alone on its node
	figures := collect(*runs, "TestInferenceServing/load-aware", fmt.Sprintf("INFERENCE_LOAD_S=%d", *seconds), "inference", "picker",
		[]string{"slow_share", "ttfb_p50_ms", "ttfb_p99_ms", "requests"}, func(line map[string]string) {
			if line["picker"] == "load-aware" {
				placements[line["slow_alone_on_its_node"]]++
			}
		})
	fmt.Printf("\nmedians of %d runs of %d s at 70 requests/s per backend:\n", *runs, *seconds)
	fmt.Printf("(the load-aware backend's slow replica was alone on its node in %d runs, beside a fast one in %d)\n", placements["true"], placements["false"])
	fmt.Printf("%-20s %10s %12s %12s %10s\n", "picker", "slow share", "TTFB p50 ms", "TTFB p99 ms", "requests")
	for _, picker := range []string{"load-aware", "least-request", "envoy-least-request"} {
		f := figures[picker]
		fmt.Printf("%-20s %10.3f %12.1f %12.1f %10.0f\n", picker, median(f["slow_share"]), median(f["ttfb_p50_ms"]), median(f["ttfb_p99_ms"]), median(f["requests"]))
	}
}

// collect runs e2e test run runs times with env ("NAME=value": its load's
// length, its workload), prints each run's figures of kind ("BENCH <kind>
// ..." lines; each line seen also goes to see, if not nil) and returns
// them: by each line's group figure (its picker, its mode), each of keys'
// values over the runs.
func collect(runs int, run, env, kind, group string, keys []string, see func(map[string]string)) map[string]map[string][]float64 {
	figures := map[string]map[string][]float64{}
	for i := range runs {
		cmd := exec.CommandContext(context.Background(), "go", "test", "-tags", "e2e", "-count=1", "-v", "-timeout", "20m", "-run", run, "./e2e/")
		cmd.Env = append(os.Environ(), strings.Fields(env)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "run %d: %v\n%s", i+1, err, out)
			os.Exit(1)
		}
		for _, line := range benchLines(out, kind) {
			fmt.Printf("run %d: %s\n", i+1, line["raw"])
			if see != nil {
				see(line)
			}
			if figures[line[group]] == nil {
				figures[line[group]] = map[string][]float64{}
			}
			for _, k := range keys {
				v, _ := strconv.ParseFloat(line[k], 64)
				figures[line[group]][k] = append(figures[line[group]][k], v)
			}
		}
	}
	return figures
}

// prompts runs TestPromptWorkload runs times and prints each run's
// figures and their medians: twelve tenants' shared prompts, or with
// unshared none (every request its own prompt).
func prompts(runs, seconds int, unshared bool) {
	env := fmt.Sprintf("PROMPT_LOAD_S=%d", seconds)
	if unshared {
		env += " PROMPT_TENANTS=0"
	}
	keys := []string{"hit_rate", "oracle_hit_rate", "ttfb_p50_ms", "ttfb_p90_ms", "ttfb_p99_ms", "requests"}
	figures := collect(runs, "TestPromptWorkload", env, "prompt", "picker", keys, nil)
	fmt.Printf("\nmedians of %d runs of %d s at 40 requests/s per backend:\n", runs, seconds)
	fmt.Printf("%-20s %9s %9s %12s %12s %12s %9s\n", "picker", "hit rate", "oracle", "TTFB p50 ms", "TTFB p90 ms", "TTFB p99 ms", "requests")
	for _, picker := range []string{"prompt-affinity", "load-aware", "least-request", "envoy-least-request"} {
		f := figures[picker]
		fmt.Printf("%-20s %9.3f %9.3f %12.1f %12.1f %12.1f %9.0f\n", picker, median(f["hit_rate"]), median(f["oracle_hit_rate"]),
			median(f["ttfb_p50_ms"]), median(f["ttfb_p90_ms"]), median(f["ttfb_p99_ms"]), median(f["requests"]))
	}
}

// fairness runs TestFairnessUnderBurst runs times and prints each run's
// figures and their medians.
func fairness(runs, seconds int) {
	keys := []string{"steady_p50_ms", "steady_p99_ms", "burst_p50_ms", "burst_p99_ms", "urgent_p50_ms"}
	figures := collect(runs, "TestFairnessUnderBurst", fmt.Sprintf("FAIRNESS_LOAD_S=%d", seconds), "fairness", "mode", keys, nil)
	fmt.Printf("\nmedians of %d runs of %d s, steady tenant 8/s, bursting tenant 80/s:\n", runs, seconds)
	fmt.Printf("%-6s %14s %14s %14s %14s %14s\n", "mode", "steady p50 ms", "steady p99 ms", "burst p50 ms", "burst p99 ms", "urgent p50 ms")
	for _, mode := range []string{"fair", "fifo"} {
		f := figures[mode]
		fmt.Printf("%-6s %14.1f %14.1f %14.1f %14.1f %14.1f\n", mode, median(f["steady_p50_ms"]), median(f["steady_p99_ms"]),
			median(f["burst_p50_ms"]), median(f["burst_p99_ms"]), median(f["urgent_p50_ms"]))
	}
}

// multiplexing runs TestMultiplexingWorkload runs times and prints each
// run's figures and their medians.
func multiplexing(runs, seconds int) {
	figures := collect(runs, "TestMultiplexingWorkload", fmt.Sprintf("MULTIPLEX_LOAD_S=%d", seconds), "multiplex", "picker", []string{"loads_per_1000"}, nil)
	fmt.Printf("\nmedians of %d runs of %d s at 40 requests/s, eight models:\n", runs, seconds)
	for _, picker := range []string{"multiplexed", "least-request"} {
		fmt.Printf("%-14s %6.0f model loads per 1,000 requests\n", picker, median(figures[picker]["loads_per_1000"]))
	}
}

// restarts runs TestPromptHitsAcrossAgentRestarts runs times, each phase
// (settling, and after each restart) seconds long, and prints each run's
// figures and their medians.
func restarts(runs, seconds int) {
	keys := []string{"hit_before", "hit_during", "hit_first_second", "hit_after", "recovery_ms", "restart_ms"}
	figures := collect(runs, "TestPromptHitsAcrossAgentRestarts", fmt.Sprintf("PROMPT_RESTART_LOAD_S=%d", seconds), "restart", "mode", keys, nil)
	fmt.Printf("\nmedians of %d runs, phases of %d s at 40 requests/s, both agents restarted:\n", runs, seconds)
	fmt.Printf("%-7s %10s %10s %12s %10s %12s %11s\n", "mode", "hit before", "hit during", "first second", "hit after", "recovery ms", "restart ms")
	for _, mode := range []string{"kept", "forgot"} {
		f := figures[mode]
		fmt.Printf("%-7s %10.3f %10.3f %12.3f %10.3f %12.0f %11.0f\n", mode, median(f["hit_before"]), median(f["hit_during"]),
			median(f["hit_first_second"]), median(f["hit_after"]), median(f["recovery_ms"]), median(f["restart_ms"]))
	}
}

// stalls runs TestAStalledReplicaIsTriedAgain runs times and prints each
// run's figures and their medians.
func stalls(runs int) {
	keys := []string{"took_p50_ms", "took_max_ms", "beyond_bound_max_ms"}
	figures := collect(runs, "TestAStalledReplicaIsTriedAgain", "", "stall", "bound_ms", keys, nil)
	for bound, f := range figures {
		fmt.Printf("\nmedians of %d runs, first_byte_timeout %s ms, one of two replicas stalling: took p50 %.1f ms, max %.1f ms; the slowest %.1f ms beyond the bound\n",
			runs, bound, median(f["took_p50_ms"]), median(f["took_max_ms"]), median(f["beyond_bound_max_ms"]))
	}
}

// deadlines runs TestDeadlines runs times and prints each run's figures
// and their medians.
func deadlines(runs, seconds int) {
	keys := []string{"goodput", "tight_met", "loose_met", "requests"}
	for _, rate := range []int{10, 12, 16} {
		figures := collect(runs, "TestDeadlines", fmt.Sprintf("DEADLINE_LOAD_S=%d DEADLINE_RATE=%d", seconds, rate), "deadlines", "mode", keys, nil)
		fmt.Printf("\nmedians of %d runs of %d s at %d requests/s, half due in 600 ms, half in 4 s:\n", runs, seconds, rate)
		fmt.Printf("%-6s %9s %12s %12s %9s\n", "mode", "goodput", "600 ms met", "4 s met", "requests")
		for _, mode := range []string{"edf", "fifo"} {
			f := figures[mode]
			fmt.Printf("%-6s %9.3f %12.3f %12.3f %9.0f\n", mode, median(f["goodput"]), median(f["tight_met"]), median(f["loose_met"]), median(f["requests"]))
		}
	}
}

var pair = regexp.MustCompile(`(\w+)=(\S+)`)

// benchLines are the test's figures of kind ("BENCH <kind> ..."), a map
// per line (raw: the line).
func benchLines(out []byte, kind string) []map[string]string {
	benchLine := regexp.MustCompile(`BENCH ` + kind + ` (.*)`)
	var lines []map[string]string
	s := bufio.NewScanner(bytes.NewReader(out))
	for s.Scan() {
		m := benchLine.FindStringSubmatch(s.Text())
		if m == nil {
			continue
		}
		line := map[string]string{"raw": m[1]}
		for _, kv := range pair.FindAllStringSubmatch(m[1], -1) {
			line[kv[1]] = kv[2]
		}
		lines = append(lines, line)
	}
	return lines
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
