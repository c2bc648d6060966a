package agent

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/envoy"
)

// BackendLoad is one backend's request figures as one node's Envoy counts
// them.
type BackendLoad struct {
	// Active is the number of requests in flight to the backend now, and
	// Pending those queued in Envoy waiting for a replica to have room
	// (max_concurrent_queries). Both count as load: Ray Serve's signal is
	// its router's queue.
	Active  uint64 `json:"active"`
	Pending uint64 `json:"pending"`
	// Requests and Errors (5xx answers) are totals since Envoy started.
	Requests uint64 `json:"requests"`
	Errors   uint64 `json:"errors"`
}

// Load is what an agent reports: its node's Envoy's figures per backend
// (cluster) and per endpoint (route).
type Load struct {
	Node     string                 `json:"node"`
	At       time.Time              `json:"at"`
	Backends map[string]BackendLoad `json:"backends"`
	// Routes are HTTP requests per endpoint and listener ("public" or
	// "mesh"), with their 5xx answers.
	Routes map[string]BackendLoad `json:"routes"`
}

// statsFilter selects the Envoy stats servemesh reads.
const statsFilter = `^(cluster\.[^_].*\.upstream_rq_(total|5xx|active|pending_active)|vhost\..*\.route\..*\.upstream_rq_(total|5xx))$`

// ReadLoad reads the load figures from an Envoy's admin API. Envoy counts
// them; nothing is counted in Go.
func ReadLoad(ctx context.Context, admin envoy.Admin, node string) (Load, error) {
	stats, err := admin.Stats(ctx, statsFilter)
	if err != nil {
		return Load{}, err
	}
	l := Load{Node: node, At: time.Now(), Backends: map[string]BackendLoad{}, Routes: map[string]BackendLoad{}}
	for name, v := range stats {
		if rest, ok := strings.CutPrefix(name, "cluster."); ok {
			for _, suffix := range []string{".upstream_rq_total", ".upstream_rq_5xx", ".upstream_rq_active", ".upstream_rq_pending_active"} {
				if backend, ok := strings.CutSuffix(rest, suffix); ok {
					b := l.Backends[backend]
					switch suffix {
					case ".upstream_rq_total":
						b.Requests = v
					case ".upstream_rq_5xx":
						b.Errors = v
					case ".upstream_rq_pending_active":
						b.Pending = v
					default:
						b.Active = v
					}
					l.Backends[backend] = b
				}
			}
			continue
		}
		// vhost.<vhost>.route.<endpoint>.upstream_rq_{total,5xx}; the
		// public listener's vhost is "public", the mesh's the endpoint.
		rest, _ := strings.CutPrefix(name, "vhost.")
		vhost, route, ok := strings.Cut(rest, ".route.")
		if !ok {
			continue
		}
		listener := "mesh"
		if vhost == "public" {
			listener = "public"
		}
		for _, suffix := range []string{".upstream_rq_total", ".upstream_rq_5xx"} {
			if endpoint, ok := strings.CutSuffix(route, suffix); ok {
				key := endpoint + "/" + listener
				r := l.Routes[key]
				if suffix == ".upstream_rq_total" {
					r.Requests = v
				} else {
					r.Errors = v
				}
				l.Routes[key] = r
			}
		}
	}
	return l, nil
}

// loadCollector exports the node's Envoy figures as Prometheus metrics on
// each scrape.
type loadCollector struct {
	admin envoy.Admin
	node  string

	requests, errors, active, pending, routeRequests, routeErrors *prometheus.Desc
	mu                                                            sync.Mutex
}

func newLoadCollector(admin envoy.Admin, node string) *loadCollector {
	return &loadCollector{admin: admin, node: node,
		requests:      prometheus.NewDesc("servemesh_backend_requests_total", "Requests this node's Envoy sent to the backend (Envoy's cluster.<backend>.upstream_rq_total).", []string{"backend", "node"}, nil),
		errors:        prometheus.NewDesc("servemesh_backend_errors_total", "5xx answers from the backend through this node's Envoy (upstream_rq_5xx).", []string{"backend", "node"}, nil),
		active:        prometheus.NewDesc("servemesh_backend_active_requests", "Requests in flight from this node's Envoy to the backend (upstream_rq_active).", []string{"backend", "node"}, nil),
		pending:       prometheus.NewDesc("servemesh_backend_queued_requests", "Requests queued in this node's Envoy for the backend's replicas to have room (upstream_rq_pending_active).", []string{"backend", "node"}, nil),
		routeRequests: prometheus.NewDesc("servemesh_http_requests_total", "HTTP requests per endpoint and listener through this node's Envoy (the seed's num_http_requests).", []string{"endpoint", "listener", "node"}, nil),
		routeErrors:   prometheus.NewDesc("servemesh_http_errors_total", "5xx answers per endpoint and listener through this node's Envoy.", []string{"endpoint", "listener", "node"}, nil),
	}
}

func (c *loadCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.requests, c.errors, c.active, c.pending, c.routeRequests, c.routeErrors} {
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
		endpoint, listener, _ := strings.Cut(key, "/")
		ch <- prometheus.MustNewConstMetric(c.routeRequests, prometheus.CounterValue, float64(v.Requests), endpoint, listener, c.node)
		ch <- prometheus.MustNewConstMetric(c.routeErrors, prometheus.CounterValue, float64(v.Errors), endpoint, listener, c.node)
	}
}

// RegisterLoadMetrics exports the node's Envoy figures through reg.
func RegisterLoadMetrics(reg prometheus.Registerer, admin envoy.Admin, node string) {
	reg.MustRegister(newLoadCollector(admin, node))
}
