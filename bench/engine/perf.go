package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
)

// shapes are the workloads, as inference-perf's data section: its
// shared-prefix generator, tokenized with the model's own tokenizer, its
// seed fixed (the same prompts each run; with some seeds the generator
// cannot write a prompt of exactly the length asked in this vocabulary).
var shapes = map[string]map[string]any{
	"shared-prefix": {"type": "shared_prefix", "shared_prefix": map[string]any{
		"num_groups": 6, "num_prompts_per_group": 16, "system_prompt_len": 2000, "question_len": 32, "output_len": 16, "seed": 7}},
	"unshared": {"type": "shared_prefix", "shared_prefix": map[string]any{
		"num_groups": 96, "num_prompts_per_group": 1, "system_prompt_len": 2000, "question_len": 32, "output_len": 16, "seed": 7}},
	"multi-turn": {"type": "shared_prefix", "shared_prefix": map[string]any{
		"num_groups": 6, "num_prompts_per_group": 16, "system_prompt_len": 2000, "question_len": 32, "output_len": 16,
		"enable_multi_turn_chat": true, "seed": 7}},
}

// figures are one run's.
type figures struct {
	ttftP50, ttftP90, ttftP99, itlP50 float64 // milliseconds
	outputTPS, hitShare               float64
	failed                            int
}

func (f figures) String() string {
	return fmt.Sprintf("TTFT p50 %.0f ms, p90 %.0f ms, p99 %.0f ms; ITL p50 %.1f ms; %.1f output tokens/s; prompt-cache hit share %.2f; %d failed",
		f.ttftP50, f.ttftP90, f.ttftP99, f.itlP50, f.outputTPS, f.hitShare, f.failed)
}

// runPerf runs inference-perf at rate for seconds against url, its
// output in dir, and reads its figures.
func runPerf(ctx context.Context, perf string, eng *engine, url, shape string, rate float64, seconds int, dir string) (figures, error) {
	config := map[string]any{
		"load":      map[string]any{"type": "constant", "stages": []any{map[string]any{"rate": rate, "duration": seconds}}},
		"api":       map[string]any{"type": "chat", "streaming": true},
		"server":    map[string]any{"type": "vllm", "model_name": "tiny", "base_url": url, "ignore_eos": true},
		"tokenizer": map[string]any{"pretrained_model_name_or_path": eng.Tokenizer()},
		"data":      shapes[shape],
		"report":    map[string]any{"request_lifecycle": map[string]any{"summary": true}},
		"storage":   map[string]any{"local_storage": map[string]any{"path": filepath.Join(dir, "out")}},
	}
	text, err := json.Marshal(config) // JSON is YAML
	if err != nil {
		return figures{}, err
	}
	path := filepath.Join(dir, "inference-perf.yaml")
	if err := os.WriteFile(path, text, 0o644); err != nil {
		return figures{}, err
	}
	cmd := exec.CommandContext(ctx, perf, "-c", path)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return figures{}, fmt.Errorf("inference-perf: %w\n%s", err, out)
	}
	return readFigures(filepath.Join(dir, "out", "stage_0_lifecycle_metrics.json"))
}

// readFigures reads inference-perf's figures of a stage.
func readFigures(path string) (figures, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return figures{}, err
	}
	var m struct {
		Successes struct {
			Latency struct {
				TTFT quantiles `json:"time_to_first_token"`
				ITL  quantiles `json:"inter_token_latency"`
			} `json:"latency"`
			Throughput struct {
				Output float64 `json:"output_tokens_per_sec"`
			} `json:"throughput"`
		} `json:"successes"`
		Failures struct {
			Count int `json:"count"`
		} `json:"failures"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return figures{}, fmt.Errorf("%s: %w", path, err)
	}
	l := m.Successes.Latency
	return figures{ttftP50: 1000 * l.TTFT.Median, ttftP90: 1000 * l.TTFT.P90, ttftP99: 1000 * l.TTFT.P99, itlP50: 1000 * l.ITL.Median,
		outputTPS: m.Successes.Throughput.Output, failed: m.Failures.Count}, nil
}

type quantiles struct {
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
	P99    float64 `json:"p99"`
}

// What llama-cpp-python's server logs of each prompt: the tokens of its
// prefix it reused from the cache (Llama.generate, when any) and those it
// computed (llama.cpp's timings).
var (
	reusedLine   = regexp.MustCompile(`Llama\.generate: ([0-9]+) prefix-match hit`)
	computedLine = regexp.MustCompile(`prompt eval time =\s*[0-9.]+ ms /\s*([0-9]+) tokens`)
)

// logSizes are the logs' sizes now, by path (a log not there yet: 0).
func logSizes(logs []string) map[string]int64 {
	out := map[string]int64{}
	for _, path := range logs {
		if st, err := os.Stat(path); err == nil {
			out[path] = st.Size()
		}
	}
	return out
}

// hitShare is the share of the prompt tokens the engines were sent that
// they reused from their caches, as their logs say after from (each
// log's size then; logSizes).
func hitShare(logs []string, from map[string]int64) (float64, error) {
	reused, computed := 0, 0
	for _, path := range logs {
		text, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		text = text[min(from[path], int64(len(text))):]
		for _, m := range reusedLine.FindAllSubmatch(text, -1) {
			n, _ := strconv.Atoi(string(m[1]))
			reused += n
		}
		for _, m := range computedLine.FindAllSubmatch(text, -1) {
			n, _ := strconv.Atoi(string(m[1]))
			computed += n
		}
	}
	if reused+computed == 0 {
		return 0, fmt.Errorf("the engines' logs (%v) show no prompt evaluated", logs)
	}
	return float64(reused) / float64(reused+computed), nil
}
