package picker

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"github.com/servemesh/servemesh/agent/picker/scoring"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/meshspec"
)

// ScrapeInterval is how often the picker reads the metrics of the replicas
// whose backend names a metrics path (LoadAware.MetricsPath): the
// Inference Extension's endpoint picker reads model servers' every 50 ms;
// the node's own count of requests in flight is exact between reads.
const ScrapeInterval = 200 * time.Millisecond

// maxMetricsBytes bounds what one read of a replica's metrics takes in.
const maxMetricsBytes = 4 << 20

var scrapeClient = &http.Client{Timeout: ScrapeInterval, CheckRedirect: httpserver.NoRedirects}

// Scrape reads, every ScrapeInterval until ctx ends, the load the servers
// of load-aware backends report in their metrics.
func (p *Picker) Scrape(ctx context.Context) {
	t := time.NewTicker(ScrapeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.scrapeOnce(ctx)
	}
}

// scrapeOnce reads every target once, then gives replicas that have room
// now to the requests waiting.
func (p *Picker) scrapeOnce(ctx context.Context) {
	for _, target := range p.scrapeTargets() {
		load, err := readServerLoad(ctx, target)
		if err != nil {
			continue // stale figures stop counting (scoring.ServerStale)
		}
		p.mu.Lock()
		if r, ok := p.replicas[target.tag]; ok {
			r.Server, r.reportedCacheTokens = load.Server, load.cacheTokens
			for _, m := range load.models {
				r.models.use(m, target.maxModels)
			}
		}
		p.mu.Unlock()
	}
	p.dispatchAll()
}

// scrapeTarget is a replica whose metrics are read, and what of them.
type scrapeTarget struct {
	tag, url                string
	queue, running, kvCache string
	maxModels               int // models loaded on demand: read the adapters (meshspec.VLLMLoRAMetric)
}

// serverLoad is what a replica's metrics say: its load; for a backend
// whose replicas load models on demand, the models its server names in
// use (the least recent first); and the tokens its prefix cache holds (0:
// not said).
type serverLoad struct {
	scoring.Server
	models      []string
	cacheTokens int
}

// The engines' own word on their prefix caches' size: vLLM's info gauge
// labelled with its KV cache's blocks and their tokens, SGLang's gauge of
// its KV pool's tokens (testdata/engines).
const (
	vllmCacheConfigMetric   = "vllm:cache_config_info"
	sglangCacheTokensMetric = "sglang:max_total_num_tokens"
)

// cacheTokens is the most tokens one of the server's engines says its
// prefix cache holds (vLLM: num_gpu_blocks times block_size; SGLang: its
// pool), 0 if it says none.
func cacheTokens(families map[string]*dto.MetricFamily) int {
	var said []float64
	for _, m := range families[vllmCacheConfigMetric].GetMetric() {
		said = append(said, labelNumber(m, "num_gpu_blocks")*labelNumber(m, "block_size"))
	}
	for _, m := range families[sglangCacheTokensMetric].GetMetric() {
		said = append(said, m.GetGauge().GetValue()+m.GetUntyped().GetValue())
	}
	most := 0.0
	for _, v := range said {
		if v > most { // NaN is never more
			most = v
		}
	}
	return int(math.Min(most, math.MaxInt32))
}

// labelNumber is m's label name read as a number, 0 if it is none.
func labelNumber(m *dto.Metric, name string) float64 {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			if v, err := strconv.ParseFloat(l.GetValue(), 64); err == nil && v > 0 && !math.IsInf(v, 0) {
				return v
			}
		}
	}
	return 0
}

func (p *Picker) scrapeTargets() []scrapeTarget {
	view := p.desired()
	if view == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []scrapeTarget
	for _, r := range p.replicas {
		b, ok := view.Backend(r.backend)
		if !ok || !r.ready || b.Config.LoadAware == nil || b.Config.LoadAware.MetricsPath == "" {
			continue
		}
		l := b.Config.LoadAware
		out = append(out, scrapeTarget{tag: r.tag, url: "http://" + r.addr + l.MetricsPath,
			queue: l.QueueMetric, running: l.RunningMetric, kvCache: l.KVCacheMetric, maxModels: l.MaxModelsPerReplica})
	}
	return out
}

// readServerLoad reads a replica's metrics: each named gauge summed over
// its series (vLLM labels them by model).
func readServerLoad(ctx context.Context, t scrapeTarget) (serverLoad, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return serverLoad{}, err
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return serverLoad{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return serverLoad{}, fmt.Errorf("%s answered %d", t.url, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(prommodel.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return serverLoad{}, fmt.Errorf("%s: %w", t.url, err)
	}
	load := serverLoad{Server: scoring.Server{At: time.Now()}}
	if t.maxModels > 0 {
		load.models = adaptersInUse(families[meshspec.VLLMLoRAMetric], t.maxModels)
	}
	load.cacheTokens = cacheTokens(families)
	load.Waiting, load.HasWaiting = gaugeSum(families, t.queue)
	load.Running, load.HasRunning = gaugeSum(families, t.running)
	load.KV, load.HasKV = gaugeSum(families, t.kvCache)
	if !load.HasKV { // vLLM renamed it: read whichever name the server has
		load.KV, load.HasKV = gaugeSum(families, meshspec.KVCacheMetricFallback(t.kvCache))
	}
	return load, nil
}

// adaptersInUse are the adapters vLLM's newest lora_requests_info series
// names, waiting then running, at most limit (the last ones).
func adaptersInUse(f *dto.MetricFamily, limit int) []string {
	var newest *dto.Metric
	for _, m := range f.GetMetric() {
		if newest == nil || m.GetGauge().GetValue() > newest.GetGauge().GetValue() {
			newest = m
		}
	}
	var names []string
	for _, label := range []string{"waiting_lora_adapters", "running_lora_adapters"} {
		for _, l := range newest.GetLabel() {
			if l.GetName() != label {
				continue
			}
			for n := range strings.SplitSeq(l.GetValue(), ",") {
				if n = strings.TrimSpace(n); n != "" && !slices.Contains(names, n) {
					names = append(names, n)
				}
			}
		}
	}
	return names[max(len(names)-limit, 0):]
}

// gaugeSum is the sum of a gauge's series, and whether there is any.
func gaugeSum(families map[string]*dto.MetricFamily, name string) (float64, bool) {
	f, ok := families[name]
	if name == "" || !ok {
		return 0, false
	}
	sum, found := 0.0, false
	for _, m := range f.GetMetric() {
		switch {
		case m.GetGauge() != nil:
			sum, found = sum+m.GetGauge().GetValue(), true
		case m.GetUntyped() != nil:
			sum, found = sum+m.GetUntyped().GetValue(), true
		}
	}
	return sum, found
}
