package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"github.com/servemesh/servemesh/wire"
)

// overLimitMetric is the service's count of the requests it refused, by
// descriptor: key1 is the endpoint's entry (servemesh_endpoint_<name>),
// key2, if any, the header's or address's key (never its values, which
// may be API keys: the service counts a descriptor's configured keys).
const overLimitMetric = "ratelimit_service_rate_limit_over_limit"

// configLoadsMetric is the service's count of the configurations it has
// loaded (at start, and each time its file is replaced).
const configLoadsMetric = "ratelimit_service_config_load_success"

// metricsClient reads the service's metrics, on loopback.
var metricsClient = &http.Client{Timeout: 2 * time.Second}

// ErrNotRunning is Report's error while no service runs.
var ErrNotRunning = errors.New("rate limit service not running")

// Report is what a node's service does, as its metrics and the agent's
// record of what it wrote say.
type Report struct {
	// OverLimit are the requests it refused since it started, by
	// endpoint.
	OverLimit map[string]uint64
	// Loaded are the limits it counts, by endpoint
	// (meshspec.Endpoint.CountedLimits): those of the configuration it
	// has loaded.
	Loaded map[string]string
}

// Report reads what the node's service does.
func (s *Service) Report(ctx context.Context) (Report, error) {
	families, err := s.readMetrics(ctx)
	if err != nil {
		return Report{}, err
	}
	return Report{OverLimit: overLimitByEndpoint(families[overLimitMetric].GetMetric()), Loaded: s.loadedLimits(configLoads(families))}, nil
}

// configLoads is the configurations the service has loaded, by its
// metrics: 0 before its first (the metric appears with it).
func configLoads(families map[string]*dto.MetricFamily) float64 {
	var n float64
	for _, m := range families[configLoadsMetric].GetMetric() {
		n += m.GetCounter().GetValue()
	}
	return n
}

// readMetrics reads the service's metrics.
func (s *Service) readMetrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	s.mu.Lock()
	addr, child := s.metrics, s.child
	s.mu.Unlock()
	if child == nil || child.Exited() || addr == "" {
		return nil, ErrNotRunning
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("rate limit service metrics: %w", err)
	}
	resp, err := metricsClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("rate limit service metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("rate limit service metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(prommodel.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("rate limit service metrics: %w", err)
	}
	return families, nil
}

// overLimitByEndpoint sums the service's over-limit counters by endpoint.
func overLimitByEndpoint(metrics []*dto.Metric) map[string]uint64 {
	out := map[string]uint64{}
	for _, m := range metrics {
		for _, l := range m.GetLabel() {
			if l.GetName() != "key1" {
				continue
			}
			if name, ok := strings.CutPrefix(l.GetValue(), wire.RateLimitEndpointKey+"_"); ok && name != "" {
				out[name] += uint64(m.GetCounter().GetValue())
			}
		}
	}
	return out
}
