package picker

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// engineSignals are the gauges README.md's table tells users to read for
// each engine (load_aware's queue_metric, running_metric and
// kv_cache_metric): what the picker reads of each engine's own /metrics.
var engineSignals = map[string]scrapeTarget{
	"vllm":     {queue: "vllm:num_requests_waiting", running: "vllm:num_requests_running", kvCache: "vllm:kv_cache_usage_perc"},
	"sglang":   {queue: "sglang:num_queue_reqs", running: "sglang:num_running_reqs", kvCache: "sglang:token_usage"},
	"llamacpp": {queue: "llamacpp:requests_deferred", running: "llamacpp:requests_processing"},
}

// TestTheEnginesOwnExpositions reads each engine's /metrics as the
// engine's own code writes it (testdata/engines: each file cites the
// project's file and commit its names, types and labels come from) with
// the names docs/model-traffic.md gives: every signal the engine has is read, with
// its value, and one it lacks is said to be missing, never read as 0; the
// size of its prefix cache where it says it (cacheTokens: vLLM's blocks
// times their tokens, SGLang's pool).
func TestTheEnginesOwnExpositions(t *testing.T) {
	for _, tc := range []struct {
		engine               string
		waiting, running, kv float64
		hasKV                bool
		cacheTokens          int
		maxModels            int
		models               []string
		deprecatedKVNameOnly bool
	}{
		{engine: "vllm", waiting: 7, running: 3, kv: 0.42, hasKV: true, cacheTokens: 4096 * 16},
		// Multiplexed adapters: the newest lora_requests_info series,
		// waiting then running.
		{engine: "vllm", waiting: 7, running: 3, kv: 0.42, hasKV: true, cacheTokens: 4096 * 16, maxModels: 2, models: []string{"sql-lora", "chat-lora"}},
		{engine: "sglang", waiting: 2, running: 5, kv: 0.76, hasKV: true, cacheTokens: 4096},
		{engine: "llamacpp", waiting: 4, running: 1},
	} {
		t.Run(tc.engine, func(t *testing.T) {
			text, err := os.ReadFile(filepath.Join("testdata", "engines", tc.engine+".prom"))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(text) }))
			defer srv.Close()
			target := engineSignals[tc.engine]
			target.url, target.maxModels = srv.URL+"/metrics", tc.maxModels
			got, err := readServerLoad(context.Background(), target)
			if err != nil {
				t.Fatal(err)
			}
			if !got.HasWaiting || got.Waiting != tc.waiting || !got.HasRunning || got.Running != tc.running {
				t.Errorf("waiting %v (read %t), running %v (read %t); want %v and %v", got.Waiting, got.HasWaiting, got.Running, got.HasRunning, tc.waiting, tc.running)
			}
			if got.HasKV != tc.hasKV || got.KV != tc.kv {
				t.Errorf("KV cache %v (read %t); want %v (read %t)", got.KV, got.HasKV, tc.kv, tc.hasKV)
			}
			if got.cacheTokens != tc.cacheTokens {
				t.Errorf("prefix cache of %d tokens, want %d", got.cacheTokens, tc.cacheTokens)
			}
			if !slices.Equal(got.models, tc.models) {
				t.Errorf("models in use %q; want %q", got.models, tc.models)
			}
		})
	}
}
