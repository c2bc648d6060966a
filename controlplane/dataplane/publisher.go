package dataplane

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
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
	// Snapshot is every watched service's instances, Instances those of
	// the services named.
	Snapshot() map[string][]catalog.Instance
	Instances(services []string) map[string][]catalog.Instance
	// Changed signals a change; TakeChanged names the services it
	// changed since it last did.
	Changed() <-chan struct{}
	TakeChanged() []string
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
	stateErr error
	rev      meshspec.Revision
	lastErr  error
	// last is the last IR the sink took, seq numbers the IRs made, and
	// pending names what changed since last (see ir.Delta): the next IR
	// is lowered only where it names, unless it is All.
	last    *ir.DataPlane
	seq     uint64
	pending *ir.Delta
	// dropped are the instances left out of the last IR, by backend.
	droppedBy map[string][]Dropped
}

// New returns a Publisher; call Run to follow health changes.
func New(o Options) *Publisher {
	p := &Publisher{sink: o.Sink, instances: o.Instances, log: o.Logger, rules: o.Rules, pending: &ir.Delta{All: true},
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
// IR, which carries rev, lowered again only where touched (the change
// that made m) names. The error is the sink's.
func (p *Publisher) Publish(m *meshspec.Model, rev meshspec.Revision, touched meshspec.Touched) error {
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
	if p.stateErr != nil {
		touched = meshspec.WholeState // the change is from a state never served
	}
	p.state, p.rev, p.stateErr = m, rev, nil
	p.pending.All = p.pending.All || touched.Whole
	p.pending.AddBackends(touched.Backends...)
	p.pending.AddEndpoints(touched.Endpoints...)
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
		select {
		case <-ctx.Done():
			return nil
		case <-p.instances.Changed():
		case <-p.rules.Names.Changed():
			p.mu.Lock()
			p.pending.All = true // which names resolve anew, the resolver does not say
			p.mu.Unlock()
		case <-retry.C:
		}
		services := p.instances.TakeChanged()
		p.mu.Lock()
		if p.state != nil {
			p.pending.AddBackends(backendsReading(p.state, services)...)
		}
		// A change no backend reads changes nothing; a refused IR is
		// offered again.
		if p.state != nil && (!p.pending.Empty() || p.lastErr != nil) {
			_ = p.handOver() // logged and counted; kept in Err
		}
		p.mu.Unlock()
	}
}

// Dropped lists the instances the last view left out, and why.
func (p *Publisher) Dropped() []Dropped {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Dropped
	for _, b := range slices.Sorted(maps.Keys(p.droppedBy)) {
		out = append(out, p.droppedBy[b]...)
	}
	return out
}

// Err is why the last view was refused, or nil when it was accepted.
func (p *Publisher) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// handOver makes the IR of p.state and the catalog's replicas, lowered
// again where p.pending names, and gives it to the sink; what the sink
// took is the next IR's start. Called with mu held.
func (p *Publisher) handOver() error {
	dp, err := p.lower()
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
	p.last, p.pending = dp, &ir.Delta{}
	p.lastErr = p.stateErr
	return nil
}

// lower is the next IR: the whole state's after a fresh start or a change
// that is All, else the last one lowered again where p.pending names,
// carrying the change (ir.LowerDelta). The instances it drops are logged,
// and replace the dropped of the backends it lowered. Called with mu held.
func (p *Publisher) lower() (*ir.DataPlane, error) {
	p.seq++
	o := ir.Options{MTLS: p.rules.MTLS}
	if p.last == nil || p.pending.All {
		replicas, dropped := Replicas(p.state, p.instances.Snapshot(), p.rules)
		dp, err := ir.Lower(p.state, replicas, o)
		p.droppedBy = map[string][]Dropped{}
		p.noteDropped(dropped)
		if dp != nil {
			dp.Seq = p.seq
		}
		return dp, err
	}
	named := &meshspec.Model{}
	for _, b := range p.state.Served() {
		if _, ok := p.pending.Backends[b.Name]; ok {
			named.Backends = append(named.Backends, b)
		}
	}
	replicas, dropped := Replicas(named, p.instances.Instances(Services(named)), p.rules)
	for name := range p.pending.Backends {
		delete(p.droppedBy, name)
	}
	p.noteDropped(dropped)
	d := &ir.Delta{Since: p.last.Seq, Backends: p.pending.Backends, Endpoints: p.pending.Endpoints}
	dp, err := ir.LowerDelta(p.last, p.state, replicas, d, o)
	if dp != nil {
		dp.Seq = p.seq
	}
	return dp, err
}

// noteDropped logs the instances left out and keeps them by backend.
func (p *Publisher) noteDropped(dropped []Dropped) {
	for _, d := range dropped {
		p.log.Warn("instance left out of the data plane", "backend", d.Backend, "instance", d.Instance, "reason", d.Reason)
		p.droppedBy[d.Backend] = append(p.droppedBy[d.Backend], d)
	}
	n := 0
	for _, list := range p.droppedBy {
		n += len(list)
	}
	p.dropped.Set(float64(n))
}
