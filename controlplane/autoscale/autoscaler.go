package autoscale

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/wire"
)

// BackendLoad is a backend's load over every node.
type BackendLoad struct {
	// InFlight is requests in flight or queued now, summed over nodes.
	InFlight float64 `json:"in_flight"`
	// RequestRate and ErrorRate are per second over the last poll interval.
	RequestRate float64 `json:"request_rate"`
	ErrorRate   float64 `json:"error_rate"`
}

// Autoscaler polls the agents and scales autoscaled backends.
type Autoscaler struct {
	// AgentToken, if set, is the bearer token agents' status listeners ask
	// for. Set it before Run.
	AgentToken string

	ctl   *controller.Controller
	nodes controller.NodeLister
	log   *slog.Logger
	http  *http.Client

	mu       sync.Mutex
	policies map[string]*Policy
	last     map[string]wire.Load // by node
	load     map[string]BackendLoad

	inFlight  *prometheus.GaugeVec
	rate      *prometheus.GaugeVec
	errRate   *prometheus.GaugeVec
	decisions *prometheus.CounterVec
}

// New returns an autoscaler; reg receives its metrics (nil skips them).
func New(ctl *controller.Controller, nodes controller.NodeLister, log *slog.Logger, reg prometheus.Registerer) *Autoscaler {
	a := &Autoscaler{ctl: ctl, nodes: nodes, log: log, http: &http.Client{Timeout: time.Second},
		policies: map[string]*Policy{}, last: map[string]wire.Load{}, load: map[string]BackendLoad{},
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "servemesh_backend_in_flight_requests",
			Help: "Requests in flight to the backend, summed over every node's Envoy."}, []string{"backend"}),
		rate: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "servemesh_backend_request_rate",
			Help: "Requests per second to the backend over every node's Envoy."}, []string{"backend"}),
		errRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "servemesh_backend_error_rate",
			Help: "5xx answers per second from the backend over every node's Envoy."}, []string{"backend"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "servemesh_autoscale_decisions_total",
			Help: "Autoscaling decisions taken, by backend and direction (up, down)."}, []string{"backend", "direction"}),
	}
	if reg != nil {
		reg.MustRegister(a.inFlight, a.rate, a.errRate, a.decisions, newReplicaCollector(ctl))
	}
	return a
}

// Run polls and decides until ctx ends. Every controller polls (so status
// works on followers); only the leader's decisions are accepted.
func (a *Autoscaler) Run(ctx context.Context) {
	for {
		m, _ := a.ctl.State()
		period := pollPeriod(m)
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
		a.poll(ctx, m)
		a.decide(ctx, m)
	}
}

// pollPeriod is the shortest metrics interval of the autoscaled backends,
// and at most one second so status rates stay fresh.
func pollPeriod(m *model.Model) time.Duration {
	period := time.Second
	for _, b := range m.Backends {
		if as := b.Config.Autoscaling; as != nil {
			period = min(period, time.Duration(as.Effective().MetricsIntervalS*float64(time.Second)))
		}
	}
	return max(period, 100*time.Millisecond)
}

// poll reads every live agent's load and sums it per backend of m; names an
// agent reports that m does not have are ignored, so they make no metric
// labels.
func (a *Autoscaler) poll(ctx context.Context, m *model.Model) {
	known := make(map[string]bool, len(m.Backends))
	for _, b := range m.Backends {
		known[b.Name] = true
	}
	nodes, err := a.nodes(ctx)
	if err != nil {
		a.log.Warn("autoscale: listing nodes failed", "err", err)
		return
	}
	totals := map[string]BackendLoad{}
	seen := map[string]bool{}
	for _, n := range nodes {
		if n.StatusAddr == "" {
			continue
		}
		l, err := a.fetch(ctx, n.StatusAddr)
		if err != nil {
			continue // a node that cannot answer adds nothing this round
		}
		seen[n.ID] = true
		a.mu.Lock()
		prev, hadPrev := a.last[n.ID]
		a.last[n.ID] = l
		a.mu.Unlock()
		dt := l.At.Sub(prev.At).Seconds()
		for backend, bl := range l.Backends {
			if !known[backend] {
				continue
			}
			t := totals[backend]
			t.InFlight += float64(bl.Active + bl.Pending)
			if p, ok := prev.Backends[backend]; hadPrev && ok && dt > 0 && bl.Requests >= p.Requests {
				t.RequestRate += float64(bl.Requests-p.Requests) / dt
				t.ErrorRate += float64(bl.Errors-p.Errors) / dt
			}
			totals[backend] = t
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for id := range a.last {
		if !seen[id] {
			delete(a.last, id)
		}
	}
	a.load = totals
	a.inFlight.Reset() // backends gone from the state lose their series
	a.rate.Reset()
	a.errRate.Reset()
	for backend, t := range totals {
		a.inFlight.WithLabelValues(backend).Set(t.InFlight)
		a.rate.WithLabelValues(backend).Set(t.RequestRate)
		a.errRate.WithLabelValues(backend).Set(t.ErrorRate)
	}
}

func (a *Autoscaler) fetch(ctx context.Context, addr string) (wire.Load, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+wire.LoadPath, nil)
	if err != nil {
		return wire.Load{}, err
	}
	if a.AgentToken != "" {
		req.Header.Set("Authorization", "Bearer "+a.AgentToken)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return wire.Load{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return wire.Load{}, fmt.Errorf("%s: status %d", addr, resp.StatusCode)
	}
	var l wire.Load
	return l, json.NewDecoder(io.LimitReader(resp.Body, wire.MaxLoadBytes)).Decode(&l)
}

// decide feeds each autoscaled backend's policy and applies its decisions.
func (a *Autoscaler) decide(ctx context.Context, m *model.Model) {
	now := time.Now()
	leading, _ := a.ctl.Leader()
	for _, b := range m.Backends {
		as := b.Config.Autoscaling
		if as == nil {
			continue
		}
		eff := as.Effective()
		a.mu.Lock()
		p := a.policies[b.Name]
		if p == nil {
			p = &Policy{}
			a.policies[b.Name] = p
		}
		p.Observe(Sample{At: now, InFlight: a.load[b.Name].InFlight}, time.Duration(eff.LookBackPeriodS*float64(time.Second)))
		n, act := p.Decide(*as, b.Config.NumReplicas, now)
		avg := p.Average()
		a.mu.Unlock()
		if !act || !leading {
			continue
		}
		direction := "up"
		if n < b.Config.NumReplicas {
			direction = "down"
		}
		if _, err := a.ctl.Autoscale(ctx, b.Name, n); err != nil {
			a.log.Warn("autoscale: could not scale", "backend", b.Name, "to", n, "err", err)
			continue
		}
		a.decisions.WithLabelValues(b.Name, direction).Inc()
		a.log.Info("autoscaled", "backend", b.Name, "from", b.Config.NumReplicas, "to", n, "avg_in_flight", fmt.Sprintf("%.2f", avg),
			"target_per_replica", as.TargetInFlight)
	}
}

// Load returns the latest load per backend.
func (a *Autoscaler) Load() map[string]BackendLoad {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]BackendLoad, len(a.load))
	for k, v := range a.load {
		out[k] = v
	}
	return out
}

// replicaCollector exports replicas per backend and state from the
// controller's placements.
type replicaCollector struct {
	ctl  *controller.Controller
	desc *prometheus.Desc
}

func newReplicaCollector(ctl *controller.Controller) *replicaCollector {
	return &replicaCollector{ctl: ctl, desc: prometheus.NewDesc("servemesh_replicas",
		"Replicas placed, by backend and state (running, draining), and desired (num_replicas).", []string{"backend", "state"}, nil)}
}

func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	m, _ := c.ctl.State()
	for _, b := range m.Backends {
		if b.Process == nil {
			continue
		}
		count := map[model.PlacementState]int{}
		for _, p := range b.Placements {
			count[p.State]++
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(count[model.Running]), b.Name, string(model.Running))
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(count[model.Draining]), b.Name, string(model.Draining))
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(b.Config.NumReplicas), b.Name, "desired")
	}
}
