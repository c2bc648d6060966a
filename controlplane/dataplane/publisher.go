package dataplane

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/controlplane/catalog"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
)

// Sink takes the data plane's IR to serve; the xDS server's SetDataPlane.
type Sink interface {
	SetDataPlane(dp *ir.DataPlane) error
}

// Instances is the health view of the watched services: a catalog.Watcher.
type Instances interface {
	Sync(services []string)
	Snapshot() map[string][]catalog.Instance
	Changed() <-chan struct{}
}

// Options configure a Publisher.
type Options struct {
	Sink      Sink
	Instances Instances
	Logger    *slog.Logger
	// Registerer receives the publisher's metrics; nil skips them.
	Registerer prometheus.Registerer
	// Rules are what the view checks of instances (see View).
	Rules Rules
}

// Publisher hands the data plane the desired state merged with the health
// view, in order. See the package doc for the steps.
type Publisher struct {
	sink      Sink
	instances Instances
	log       *slog.Logger
	failures  prometheus.Counter
	dropped   prometheus.Gauge
	rules     Rules

	mu    sync.Mutex
	state *meshspec.Model // the last valid state published
	// stateErr is why the last state published was refused as invalid
	// (nil: it was not): the data plane follows state, the last valid
	// one, and Err says so while it does.
	stateErr    error
	rev         meshspec.Revision
	lastErr     error
	lastDropped []Dropped // left out of the last view
}

// New returns a Publisher; call Run to follow health changes.
func New(o Options) *Publisher {
	p := &Publisher{sink: o.Sink, instances: o.Instances, log: o.Logger, rules: o.Rules,
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "servemesh_dataplane_view_refusals_total",
			Help: "Data-plane views the xDS server refused; the last accepted one keeps serving."}),
		dropped: prometheus.NewGauge(prometheus.GaugeOpts{Name: "servemesh_dataplane_dropped_instances",
			Help: "Service instances left out of the last data-plane view because they cannot be used."}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(p.failures, p.dropped)
	}
	return p
}

// Publish makes m, the stored state at revision rev, the state the data
// plane follows: it syncs the watched services to m's and hands over m's
// view, which carries rev. The error is the sink's.
func (p *Publisher) Publish(m *meshspec.Model, rev meshspec.Revision) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Validated here, once a state, in its role (the stored state): the
	// health changes that follow lower it again without checking it again.
	// A state another writer stored that today's validation refuses is
	// not served; the data plane keeps the last one.
	if err := m.Validate(); err != nil {
		p.failures.Inc()
		p.stateErr = fmt.Errorf("the stored state at revision %d is invalid; the data plane keeps serving the last valid one: %w", rev, err)
		p.lastErr = p.stateErr
		p.log.Error("publishing the stored state failed", "revision", rev, "err", err)
		return p.lastErr
	}
	p.state, p.rev, p.stateErr = m, rev, nil
	p.instances.Sync(Services(m))
	return p.handOver()
}

// RetryEvery is how often a refused view is offered again.
const RetryEvery = 5 * time.Second

// Run rebuilds and hands over the view whenever the health view (or what
// a replica's DNS name resolves to) changes,
// and every RetryEvery while the last one was refused, until ctx ends.
func (p *Publisher) Run(ctx context.Context) error {
	retry := time.NewTicker(RetryEvery)
	defer retry.Stop()
	if p.rules.Names != nil {
		var names sync.WaitGroup
		defer names.Wait()
		names.Go(func() { _ = p.rules.Names.Run(ctx) })
	}
	for {
		refusedOnly := false
		select {
		case <-ctx.Done():
			return nil
		case <-p.instances.Changed():
		case <-p.rules.Names.Changed():
		case <-retry.C:
			refusedOnly = true
		}
		p.mu.Lock()
		if p.state != nil && (!refusedOnly || p.lastErr != nil) {
			_ = p.handOver() // logged and counted; kept in Err
		}
		p.mu.Unlock()
	}
}

// Dropped lists the instances the last view left out, and why.
func (p *Publisher) Dropped() []Dropped {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Dropped(nil), p.lastDropped...)
}

// Err is why the last view was refused, or nil when it was accepted.
func (p *Publisher) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// handOver builds the IR of p.state's view and gives it to the sink.
// Called with mu held.
func (p *Publisher) handOver() error {
	dp, dropped, err := lower(p.state, p.instances.Snapshot(), p.rules)
	p.lastDropped = dropped
	p.dropped.Set(float64(len(dropped)))
	for _, d := range dropped {
		p.log.Warn("instance left out of the data plane", "backend", d.Backend, "instance", d.Instance, "reason", d.Reason)
	}
	if err == nil {
		dp.Revision = uint64(p.rev)
		err = p.sink.SetDataPlane(dp)
	}
	if err != nil {
		p.failures.Inc()
		p.lastErr = fmt.Errorf("the data plane refused the view; it keeps serving the last one: %w", err)
		p.log.Error("publishing the data-plane view failed", "err", err)
		return p.lastErr
	}
	p.lastErr = p.stateErr
	return nil
}
