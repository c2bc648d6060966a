package autoscale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// BackendLoad is a backend's load over every node.
type BackendLoad struct {
	// InFlight is requests in flight or queued now, summed over nodes.
	InFlight float64 `json:"in_flight"`
	// Held are those of InFlight that nodes hold for want of a ready
	// replica.
	Held float64 `json:"held"`
	// Waiting are those of InFlight waiting for a replica of a load-aware
	// backend: in the nodes' pickers and the servers' own queues.
	Waiting float64 `json:"waiting,omitempty"`
	// RequestRate and ErrorRate are per second over RateWindow.
	RequestRate float64 `json:"request_rate"`
	ErrorRate   float64 `json:"error_rate"`
}

// RateWindow is what request and error rates are averaged over: long
// enough that a steady load reads steady, short enough to follow a change.
const RateWindow = 10 * time.Second

// AgentGetter asks node n's agent for path at its status listener.
type AgentGetter func(ctx context.Context, n wire.NodeInfo, path string) (*http.Response, error)

// Autoscaler polls the agents and scales autoscaled backends.
type Autoscaler struct {
	// Agents, if set, is how the nodes' agents are asked for their load
	// (the daemon's: mTLS, or a token for a previous release's agent);
	// otherwise plain HTTP. Set it before Run.
	Agents AgentGetter

	ctl   *controller.Controller
	nodes controller.NodeLister
	log   *slog.Logger
	http  *http.Client

	mu       sync.Mutex
	policies map[string]*Policy
	history  map[string][]wire.Load // by node, the samples of the last RateWindow
	load     map[string]BackendLoad
	routes   map[string]BackendLoad // by endpoint, over every node and listener
	configs  map[string]string      // by replica tag, the user_config version it runs
	draining map[string]int         // by draining replica tag, its requests in flight
	unread   map[string]string      // by node, why its last load could not be read

	inFlight  *prometheus.GaugeVec
	rate      *prometheus.GaugeVec
	errRate   *prometheus.GaugeVec
	decisions *prometheus.CounterVec
}

// New returns an autoscaler; reg receives its metrics (nil skips them).
func New(ctl *controller.Controller, nodes controller.NodeLister, log *slog.Logger, reg prometheus.Registerer) *Autoscaler {
	a := &Autoscaler{ctl: ctl, nodes: nodes, log: log, http: &http.Client{Timeout: time.Second, CheckRedirect: httpserver.NoRedirects},
		policies: map[string]*Policy{}, history: map[string][]wire.Load{}, load: map[string]BackendLoad{}, routes: map[string]BackendLoad{},
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
func (a *Autoscaler) Run(ctx context.Context) error {
	// The adopted state is read in place (Peek), never copied: a copy of
	// a large mesh's model, held through each sleep, was a tenth of the
	// controller's heap, and copying it every poll cost CPU at rest.
	for {
		var period time.Duration
		a.ctl.Peek(func(m *meshspec.Model, _ store.Revision) { period = pollPeriod(m) })
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(period):
		}
		a.ctl.Peek(func(m *meshspec.Model, _ store.Revision) {
			a.poll(ctx, m)
			a.decide(ctx, m)
		})
	}
}

// pollPeriod is the shortest metrics interval of the autoscaled backends,
// and at most one second so status rates stay fresh.
func pollPeriod(m *meshspec.Model) time.Duration {
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
func (a *Autoscaler) poll(ctx context.Context, m *meshspec.Model) {
	known := make(map[string]bool, len(m.Backends))
	placedOn := map[string]string{} // replica tag: its node
	for _, b := range m.Served() {  // a retiring backend's draining replicas too
		known[b.Name] = true
		for _, p := range b.Placements {
			placedOn[p.Tag] = p.Node
		}
	}
	nodes, err := a.nodes(ctx)
	if err != nil {
		a.log.Warn("autoscale: listing nodes failed", "err", err)
		return
	}
	totals, routes, configs, draining := map[string]BackendLoad{}, map[string]BackendLoad{}, map[string]string{}, map[string]int{}
	seen, unread := map[string]bool{}, map[string]string{}
	for _, n := range nodes {
		if n.StatusAddr == "" {
			unread[n.ID] = "its agent names no status address"
			continue
		}
		l, err := a.fetch(ctx, n)
		if err != nil {
			unread[n.ID] = err.Error() // it adds nothing this round, and status says so
			continue
		}
		seen[n.ID] = true
		for tag, version := range l.Configs {
			if placedOn[tag] == n.ID { // a node speaks only for its own replicas
				configs[tag] = version
			}
		}
		for tag, inFlight := range l.Draining {
			if placedOn[tag] == n.ID {
				draining[tag] = inFlight
			}
		}
		base := a.remember(n.ID, l)
		for backend, bl := range l.Backends {
			if !known[backend] {
				continue
			}
			t := totals[backend]
			t.InFlight += float64(bl.Active + bl.Pending)
			t.Held += float64(l.Held[backend])
			t.Waiting += l.Waiting[backend]
			if base != nil {
				addRates(&t, bl, base.Backends[backend], l.At.Sub(base.At))
			}
			totals[backend] = t
		}
		for key, rl := range l.Routes {
			endpoint, _, _ := strings.Cut(key, "/")
			if t := routes[endpoint]; base != nil {
				addRates(&t, rl, base.Routes[key], l.At.Sub(base.At))
				routes[endpoint] = t
			}
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for id := range a.history {
		if !seen[id] {
			delete(a.history, id)
		}
	}
	a.load, a.routes, a.configs, a.draining, a.unread = totals, routes, configs, draining, unread
	a.inFlight.Reset() // backends gone from the state lose their series
	a.rate.Reset()
	a.errRate.Reset()
	for backend, t := range totals {
		a.inFlight.WithLabelValues(backend).Set(t.InFlight)
		a.rate.WithLabelValues(backend).Set(t.RequestRate)
		a.errRate.WithLabelValues(backend).Set(t.ErrorRate)
	}
}

// remember adds node's newest sample l to its history, which keeps
// RateWindow of samples, and returns the oldest sample of the window to
// compute rates from (nil until there are two).
func (a *Autoscaler) remember(node string, l wire.Load) *wire.Load {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.history[node] = append(a.history[node], l)
	h := a.history[node]
	for len(h) > 2 && l.At.Sub(h[1].At) >= RateWindow {
		h = h[1:] // the next one still covers the window
	}
	a.history[node] = h
	if len(h) < 2 || !h[0].At.Before(l.At) {
		return nil
	}
	return &h[0]
}

// addRates adds to t the rates of counters now over counters then, dt
// apart; counters that went back (Envoy restarted) add nothing.
func addRates(t *BackendLoad, now, then wire.BackendLoad, dt time.Duration) {
	if dt <= 0 || now.Requests < then.Requests || now.Errors < then.Errors {
		return
	}
	t.RequestRate += float64(now.Requests-then.Requests) / dt.Seconds()
	t.ErrorRate += float64(now.Errors-then.Errors) / dt.Seconds()
}

// EndpointRates returns each endpoint's request and error rates over
// RateWindow, over every node and listener.
func (a *Autoscaler) EndpointRates() map[string]BackendLoad {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.routes)
}

func (a *Autoscaler) fetch(ctx context.Context, n wire.NodeInfo) (wire.Load, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	get := a.Agents
	if get == nil {
		get = a.plainGet
	}
	resp, err := get(ctx, n, wire.LoadPath)
	if err != nil {
		return wire.Load{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return wire.Load{}, fmt.Errorf("%s: status %d", n.StatusAddr, resp.StatusCode)
	}
	var l wire.Load
	return l, json.NewDecoder(io.LimitReader(resp.Body, wire.MaxLoadBytes)).Decode(&l)
}

// plainGet asks an agent over plain HTTP, with no token.
func (a *Autoscaler) plainGet(ctx context.Context, n wire.NodeInfo, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.StatusAddr+path, nil)
	if err != nil {
		return nil, err
	}
	return a.http.Do(req)
}

// decide feeds each autoscaled backend's policy and applies its decisions.
func (a *Autoscaler) decide(ctx context.Context, m *meshspec.Model) {
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
		p.Observe(Sample{At: now, InFlight: a.load[b.Name].InFlight, Waiting: a.load[b.Name].Waiting}, time.Duration(eff.LookBackPeriodS*float64(time.Second)))
		n, act := p.Decide(*as, b.Config.NumReplicas, now)
		avg, avgWaiting := p.Average(), p.AverageWaiting()
		a.mu.Unlock()
		if !act || !leading {
			continue
		}
		direction := "up"
		if n < b.Config.NumReplicas {
			direction = "down"
		}
		_, err := a.ctl.Autoscale(ctx, b.Name, n)
		var short *controller.Error
		switch {
		case errors.As(err, &short) && short.Shortfall > 0:
			a.log.Warn("autoscaled to what fits; the rest is placed when room comes", "backend", b.Name, "wanted", n,
				"placed", n-short.Shortfall, "why", err)
		case err != nil:
			a.log.Warn("autoscale: could not scale", "backend", b.Name, "to", n, "err", err)
			continue
		}
		a.decisions.WithLabelValues(b.Name, direction).Inc()
		a.log.Info("autoscaled", "backend", b.Name, "from", b.Config.NumReplicas, "to", n, "avg_in_flight", fmt.Sprintf("%.2f", avg),
			"target_per_replica", as.TargetInFlight, "avg_waiting", fmt.Sprintf("%.2f", avgWaiting), "target_waiting_per_replica", as.TargetQueued)
	}
}

// ConfigVersions returns, by replica tag, the user_config version each
// replica runs, as the agents last said.
func (a *Autoscaler) ConfigVersions() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.configs)
}

// DrainingInFlight returns the requests in flight to each draining
// replica, by tag, as its agent last reported them.
func (a *Autoscaler) DrainingInFlight() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.draining)
}

// Latest returns each node's latest load, as its agent last answered
// (nodes that did not answer the last poll are left out).
func (a *Autoscaler) Latest() map[string]wire.Load {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]wire.Load, len(a.history))
	for node, h := range a.history {
		if len(h) > 0 {
			out[node] = h[len(h)-1]
		}
	}
	return out
}

// Unread returns, by node, why the last poll could not read its load:
// the rates and loads leave those nodes out.
func (a *Autoscaler) Unread() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.unread)
}

// Load returns the latest load per backend.
func (a *Autoscaler) Load() map[string]BackendLoad {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.load)
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
	c.ctl.Peek(func(m *meshspec.Model, _ store.Revision) { c.collect(ch, m) })
}

func (c *replicaCollector) collect(ch chan<- prometheus.Metric, m *meshspec.Model) {
	for _, b := range m.Backends {
		if b.Process == nil {
			continue
		}
		count := map[meshspec.PlacementState]int{}
		for _, p := range b.Placements {
			count[p.State]++
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(count[meshspec.Running]), b.Name, string(meshspec.Running))
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(count[meshspec.Draining]), b.Name, string(meshspec.Draining))
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(b.Config.NumReplicas), b.Name, "desired")
	}
}
