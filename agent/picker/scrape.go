package picker

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
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
			r.Server = load.Server
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

// serverLoad is what a replica's metrics say: its load and, for a
// backend whose replicas load models on demand, the models its server
// names in use (the least recent first).
type serverLoad struct {
	scoring.Server
	models []string
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
