package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/controlplane/store"
)

// Options configure a Controller.
type Options struct {
	Logger *slog.Logger
	Store  store.Store
	// Publish receives every state the controller adopts (the xDS server's
	// SetModel). It is called with the write lock held, in order.
	Publish func(*model.Model) error
	// Registerer receives the controller's metrics; nil skips them.
	Registerer prometheus.Registerer
	// CrashAfterCheckpoint is the probability of exiting right after a
	// checkpoint is written and before it takes effect: fault injection.
	CrashAfterCheckpoint float64
	// Exit ends the process for fault injection; os.Exit when nil.
	Exit func(code int)
	// Nodes lists the live nodes replicas can be placed on; nil means none.
	Nodes NodeLister
	// DrainGrace is how long a draining replica keeps serving its in-flight
	// requests before its agent stops it; 5s when zero.
	DrainGrace time.Duration
	// ReplaceAfter is how long a node may be gone before its replicas are
	// placed elsewhere; 30s when zero.
	ReplaceAfter time.Duration
	// Healthy reports which replica tags of a backend pass their health
	// checks; a rollout drains old replicas only when enough new ones do.
	// Nil counts every placed replica as healthy.
	Healthy func(backend string) map[string]bool
}

// Controller owns the desired state. Create it with New, then call Lead to
// take writes (after recovery) or Run to follow the store.
type Controller struct {
	log     *slog.Logger
	store   store.Store
	publish func(*model.Model) error
	crashP  float64
	exit    func(int)
	metrics *metrics

	listNodes    NodeLister
	healthy      func(backend string) map[string]bool
	drainGrace   time.Duration
	replaceAfter time.Duration
	missingSince map[string]time.Time // node -> first seen gone; under mu
	lastPlaceErr map[string]string    // backend -> last placement error logged; under mu

	mu      sync.Mutex // the write lock
	state   *model.Model
	rev     store.Revision
	loaded  bool
	leading bool
	leader  string // the leader's API address, when known
}

// New returns a controller that has loaded nothing yet.
func New(o Options) *Controller {
	c := &Controller{
		log: o.Logger, store: o.Store, publish: o.Publish, crashP: o.CrashAfterCheckpoint,
		exit: o.Exit, metrics: newMetrics(o.Registerer), state: &model.Model{},
		listNodes: o.Nodes, healthy: o.Healthy, drainGrace: o.DrainGrace, replaceAfter: o.ReplaceAfter, missingSince: map[string]time.Time{}, lastPlaceErr: map[string]string{},
	}
	if c.drainGrace == 0 {
		c.drainGrace = 5 * time.Second
	}
	if c.replaceAfter == 0 {
		c.replaceAfter = 30 * time.Second
	}
	if c.exit == nil {
		c.exit = os.Exit
	}
	return c
}

// Lead makes this controller the writer. Holding the write lock throughout,
// it loads the stored state, publishes it, and only then accepts writes, as
// Ray Serve's controller recovers from its checkpoint.
func (c *Controller) Lead(ctx context.Context, self string) error {
	start := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	m, rev, err := c.store.Load(ctx)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	if err := m.Validate(); err != nil {
		// A stored state that fails today's validation is still what was
		// accepted; serve writes only once an operator fixes it.
		return fmt.Errorf("recover: the stored state is invalid; fix it in the store: %w", err)
	}
	c.adopt(m, rev)
	c.leading, c.leader = true, self
	c.metrics.leader.Set(1)
	c.log.Info("leading: recovered state and published it", "revision", rev, "backends", len(m.Backends),
		"endpoints", len(m.Endpoints), "took", time.Since(start))
	return nil
}

// Follow makes this controller a reader that refuses writes, naming leader.
func (c *Controller) Follow(leader string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leading {
		c.log.Warn("no longer leading", "leader", leader)
	}
	c.leading, c.leader = false, leader
	c.metrics.leader.Set(0)
}

// Run watches the store until ctx ends and adopts and publishes every new
// revision, including ones written by another controller.
func (c *Controller) Run(ctx context.Context) error {
	c.mu.Lock()
	if !c.loaded {
		m, rev, err := c.store.Load(ctx)
		if err != nil {
			c.mu.Unlock()
			return fmt.Errorf("load state: %w", err)
		}
		c.adopt(m, rev)
	}
	rev := c.rev
	c.mu.Unlock()
	for {
		m, next, err := c.store.Watch(ctx, rev)
		if ctx.Err() != nil {
			return ctx.Err() // shutting down
		}
		if err != nil {
			return fmt.Errorf("watch state: %w", err)
		}
		rev = next
		c.mu.Lock()
		// Revisions only grow. A watch result older than what this
		// controller already holds (it committed meanwhile) must not roll
		// its state back.
		if next > c.rev {
			c.adopt(m, next)
		}
		c.mu.Unlock()
	}
}

// adopt makes m the current state and publishes it. Called with mu held.
func (c *Controller) adopt(m *model.Model, rev store.Revision) {
	c.state, c.rev, c.loaded = m, rev, true
	if err := c.publish(m); err != nil {
		c.log.Error("publishing the stored state failed; the data plane keeps its last config", "revision", rev, "err", err)
	}
}

// State returns a copy of the current desired state and its revision.
func (c *Controller) State() (*model.Model, store.Revision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return model.Clone(c.state), c.rev
}

// Leader reports whether this controller takes writes, and the leader's
// address as far as it knows.
func (c *Controller) Leader() (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leading, c.leader
}

// mutate runs one operation: fn edits a copy of the state; an unchanged copy
// is a successful no-op; a changed one is validated, checkpointed, then
// adopted and published. It reports whether anything changed.
func (c *Controller) mutate(ctx context.Context, op string, fn func(m *model.Model) error) (changed bool, err error) {
	start := time.Now()
	defer func() { c.metrics.observe(op, changed, err, time.Since(start)) }()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.leading {
		return false, &Error{Kind: NotLeader, Msg: "this controller is not the leader; send writes to the leader", Leader: c.leader}
	}
	next := model.Clone(c.state)
	if err := fn(next); err != nil {
		return false, err
	}
	change := store.Diff(c.state, next)
	if change.Size() == 0 {
		return false, nil
	}
	if err := next.Validate(); err != nil {
		return false, &Error{Kind: Invalid, Msg: "refused", Err: err}
	}
	for _, part := range store.Split(change) {
		if err := c.checkpoint(ctx, part); err != nil {
			return changed, err
		}
		changed = true
	}
	return true, nil
}

// checkpoint writes one change at the current revision, then adopts it.
// Called with mu held.
func (c *Controller) checkpoint(ctx context.Context, change store.Change) error {
	next := store.Apply(c.state, change)
	if err := next.Validate(); err != nil {
		return &Error{Kind: Invalid, Msg: "this change needs several checkpoints and one of the intermediate states is invalid; apply it in smaller steps", Err: err}
	}
	start := time.Now()
	rev, err := c.store.Commit(ctx, c.rev, change)
	c.metrics.checkpoint.Observe(time.Since(start).Seconds())
	if errors.Is(err, store.ErrConflict) {
		// Another writer got in: adopt what is stored and let the client retry.
		if m, r, lerr := c.store.Load(ctx); lerr == nil {
			c.adopt(m, r)
		}
		return &Error{Kind: Unavailable, Msg: "the stored state changed under this controller; retry", Err: err}
	}
	if err != nil {
		return &Error{Kind: Unavailable, Msg: "checkpoint failed; nothing changed", Err: err}
	}
	if c.crashP > 0 && rand.Float64() < c.crashP {
		c.log.Warn("fault injection: exiting right after a checkpoint", "revision", rev)
		c.exit(3)
	}
	c.adopt(next, rev)
	return nil
}
