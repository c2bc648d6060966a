package main

import (
	"fmt"
	"os"

	"github.com/servemesh/servemesh/bench/benchenv"
)

// sweep runs TestPromptWorkload at each of rates (requests a second per
// backend), runs times each, on prefill-bound stand-ins (one request at a
// time, 4 ms of prefill a block not cached) with questions of 16 blocks
// (256 tokens) after each tenant's 47-block system prompt, with a fifth
// backend picking by token load (budget budgetMs) beside prompt
// affinity, load alone, least requests and the hand-written Envoy. It
// prints each picker's medians at each rate, and its knee: the highest
// rate whose answers' time to first byte, p90, stays within sloMs, and
// the answers a second there. hotPercent of the requests are one tenant's
// (a hot prefix; 0: every tenant in turn).
func sweep(runs, seconds int, rates string, sloMs float64, budgetMs, hotPercent int) {
	pickers := []string{"token-load", "prompt-affinity", "load-aware", "least-request", "envoy-least-request"}
	type point struct{ rate, answered, p50, p90, hit float64 }
	at := map[string][]point{}
	counts, err := benchenv.Counts("rates", rates, 10000)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, rate := range counts {
		env := fmt.Sprintf("PROMPT_LOAD_S=%d PROMPT_RATE=%d PROMPT_SLOTS=1 PROMPT_PREFILL_MS=4 PROMPT_QUESTION_BLOCKS=16 PROMPT_TTFT_BUDGET_MS=%d PROMPT_HOT_PERCENT=%d", seconds, rate, budgetMs, hotPercent)
		figures := collect(runs, "TestPromptWorkload", env, "prompt", "picker", []string{"answered_per_s", "ttfb_p50_ms", "ttfb_p90_ms", "hit_rate"}, nil)
		for _, picker := range pickers {
			f := figures[picker]
			at[picker] = append(at[picker], point{float64(rate), median(f["answered_per_s"]), median(f["ttfb_p50_ms"]), median(f["ttfb_p90_ms"]), median(f["hit_rate"])})
		}
	}
	fmt.Printf("\nmedians of %d runs of %d s per rate; prefill-bound stand-ins; token load's budget %d ms; %d%% of requests one tenant's; knee: the highest rate with TTFB p90 within %.0f ms\n", runs, seconds, budgetMs, hotPercent, sloMs)
	fmt.Printf("%-20s %6s %12s %12s %12s %9s\n", "picker", "rate", "answered/s", "TTFB p50 ms", "TTFB p90 ms", "hit rate")
	for _, picker := range pickers {
		knee := point{}
		for _, p := range at[picker] {
			fmt.Printf("%-20s %6.0f %12.1f %12.1f %12.1f %9.3f\n", picker, p.rate, p.answered, p.p50, p.p90, p.hit)
			if p.p90 <= sloMs && p.rate > knee.rate {
				knee = p
			}
		}
		fmt.Printf("%-20s knee at %.0f requests/s: %.1f answered/s\n", picker, knee.rate, knee.answered)
	}
}
