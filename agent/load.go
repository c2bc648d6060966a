package agent

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/wire"
)

// ReadLoad reads the load figures from an Envoy's admin API. Envoy counts
// them; nothing is counted in Go.
func ReadLoad(ctx context.Context, admin envoy.Admin, node string) (wire.Load, error) {
	stats, histograms, err := admin.StatsAndHistograms(ctx, wire.StatsFilter, wire.LatencyBoundsMs)
	if err != nil {
		return wire.Load{}, err
	}
	return wire.NewLoad(node, time.Now(), stats, histograms), nil
}

// loadCollector exports the node's Envoy figures as Prometheus metrics on
// each scrape.
type loadCollector struct {
	admin envoy.Admin
	node  string
	// global reads the node's rate limit service (nil: none runs).
	global RateLimitReader

	requests, errors, active, pending, routeRequests, routeErrors, rateLimited *prometheus.Desc
	mu                                                                         sync.Mutex
}

func newLoadCollector(admin envoy.Admin, node string) *loadCollector {
	return &loadCollector{admin: admin, node: node,
		requests:      prometheus.NewDesc("servemesh_backend_requests_total", "Requests this node's Envoy sent to the backend (Envoy's cluster.<backend>.upstream_rq_total).", []string{"backend", "node"}, nil),
		errors:        prometheus.NewDesc("servemesh_backend_errors_total", "5xx answers from the backend through this node's Envoy (upstream_rq_5xx).", []string{"backend", "node"}, nil),
		active:        prometheus.NewDesc("servemesh_backend_active_requests", "Requests in flight from this node's Envoy to the backend (upstream_rq_active).", []string{"backend", "node"}, nil),
		pending:       prometheus.NewDesc("servemesh_backend_queued_requests", "Requests queued in this node's Envoy for the backend's replicas to have room (upstream_rq_pending_active).", []string{"backend", "node"}, nil),
		routeRequests: prometheus.NewDesc("servemesh_http_requests_total", "HTTP requests per endpoint and listener through this node's Envoy (Ray Serve's num_http_requests).", []string{"endpoint", "listener", "node"}, nil),
		routeErrors:   prometheus.NewDesc("servemesh_http_errors_total", "5xx answers per endpoint and listener through this node's Envoy.", []string{"endpoint", "listener", "node"}, nil),
		rateLimited: prometheus.NewDesc("servemesh_rate_limited_total", "Requests an endpoint's rate limit refused (429) on this node: limit local is its Envoy's buckets, over its listeners; global its rate limit service's count, since the service started.",
			[]string{"endpoint", "node", "limit"}, nil),
	}
}

func (c *loadCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.requests, c.errors, c.active, c.pending, c.routeRequests, c.routeErrors, c.rateLimited} {
		ch <- d
	}
}

func (c *loadCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l, err := ReadLoad(ctx, c.admin, c.node)
	if err != nil {
		return // Envoy down: no figures rather than wrong ones
	}
	for b, v := range l.Backends {
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(v.Requests), b, c.node)
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(v.Errors), b, c.node)
		ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, float64(v.Active), b, c.node)
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(v.Pending), b, c.node)
	}
	for key, v := range l.Routes {
		endpoint, listener, _ := strings.Cut(key, "/") // see wire.RouteKey
		ch <- prometheus.MustNewConstMetric(c.routeRequests, prometheus.CounterValue, float64(v.Requests), endpoint, listener, c.node)
		ch <- prometheus.MustNewConstMetric(c.routeErrors, prometheus.CounterValue, float64(v.Errors), endpoint, listener, c.node)
	}
	for endpoint, n := range l.RateLimited {
		ch <- prometheus.MustNewConstMetric(c.rateLimited, prometheus.CounterValue, float64(n), endpoint, c.node, "local")
	}
	if c.global == nil {
		return
	}
	refused, _, err := c.global(ctx)
	if err != nil {
		return // the service down: no figures rather than wrong ones
	}
	for endpoint, n := range refused {
		ch <- prometheus.MustNewConstMetric(c.rateLimited, prometheus.CounterValue, float64(n), endpoint, c.node, "global")
	}
}

// RateLimitReader reads what the node's rate limit service does: the
// requests it refused and the limits it has loaded, by endpoint
// (ratelimit.Service.Report).
type RateLimitReader func(context.Context) (refused map[string]uint64, loaded map[string]string, err error)

// RegisterLoadMetrics exports the node's Envoy figures through reg, and
// those of its rate limit service, if global reads them (nil: none).
func RegisterLoadMetrics(reg prometheus.Registerer, admin envoy.Admin, node string, global RateLimitReader) {
	c := newLoadCollector(admin, node)
	c.global = global
	reg.MustRegister(c)
}
