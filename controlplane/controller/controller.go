package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"

	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/internal/backoff"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Options configure a Controller.
type Options struct {
	Logger *slog.Logger
	Store  store.Store
	// Publish receives every state the controller adopts, with its stored
	// revision and what the change that made it touched (the data plane's
	// publisher). It is called with the write lock held, in order.
	Publish func(*meshspec.Model, store.Revision, meshspec.Touched) error
	// Registerer receives the controller's metrics; nil skips them.
	Registerer prometheus.Registerer
	// CrashAfterCheckpoint is the probability of exiting right after a
	// checkpoint is written and before it takes effect: fault injection.
	CrashAfterCheckpoint float64
	// Exit ends the process for fault injection; os.Exit when nil.
	Exit func(code int)
	// Nodes lists the live nodes replicas can be placed on; nil means none.
	Nodes NodeLister
	// DrainGrace is how long a draining replica serves at least, while
	// the nodes' Envoys stop sending it new requests; 5s when zero. Then
	// its agent stops it once its requests in flight have ended, or at its
	// backend's graceful shutdown timeout.
	DrainGrace time.Duration
	// Registered tells the replica tags of a backend's Consul service,
	// and whether the controller has read the service yet: a draining
	// replica is forgotten once its registration is gone (its agent
	// deregisters it when it has stopped it). Without it, or while a
	// service is unread, at the backend's graceful shutdown timeout.
	Registered func(service string) (tags map[string]bool, known bool)
	// ReplaceAfter is how long a node may be gone before its replicas are
	// placed elsewhere; 30s when zero.
	ReplaceAfter time.Duration
	// Healthy reports which replica tags of a backend pass their health
	// checks; a rollout drains old replicas only when enough new ones do.
	// Nil counts every placed replica as healthy.
	Healthy func(backend string) map[string]bool
	// Addresses are the static replica addresses users may name.
	Addresses meshspec.AddressPolicy
	// Plaintext is set when the mesh runs without mTLS: what only the
	// mTLS data plane serves (load_aware) is refused.
	Plaintext bool
	// Now is the clock placements and drains are timed by; time.Now when
	// nil (tests pass their own).
	Now func() time.Time
}

// Controller owns the desired state. Create it with New, then call Lead to
// take writes (after recovery) or Run to follow the store.
type Controller struct {
	log     *slog.Logger
	store   store.Store
	publish func(*meshspec.Model, store.Revision, meshspec.Touched) error
	crashP  float64
	now     func() time.Time
	exit    func(int)
	metrics *metrics

	listNodes    NodeLister
	healthy      func(backend string) map[string]bool
	addresses    meshspec.AddressPolicy
	plaintext    bool
	drainGrace   time.Duration
	registered   func(service string) (map[string]bool, bool)
	replaceAfter time.Duration
	missingSince map[string]time.Time // node -> first seen gone; under mu
	lastPlaceErr map[string]string    // backend -> last placement error logged; under mu
	// placeProblems is a copy of lastPlaceErr for readers, who never wait
	// for mu.
	placeProblems atomic.Pointer[map[string]string]
	// unreadableLogged are the stored keys already logged as unreadable;
	// under mu.
	unreadableLogged map[string]bool

	mu      sync.Mutex // the write lock
	state   *meshspec.Model
	rev     store.Revision
	loaded  bool
	leading bool
	leader  string // the leader's API address, when known

	// adopted is the last adopted state, read without the write lock so
	// that no write, however long, delays a read.
	adopted atomic.Pointer[adoptedState]
	// leadership mirrors leading and leader for readers, likewise.
	leadership atomic.Pointer[leadership]
}

type adoptedState struct {
	model *meshspec.Model
	rev   store.Revision
}

type leadership struct {
	leading bool
	leader  string
}

// New returns a controller that has loaded nothing yet.
func New(o Options) *Controller {
	c := &Controller{
		log: o.Logger, store: o.Store, publish: o.Publish, crashP: o.CrashAfterCheckpoint,
		exit: o.Exit, metrics: newMetrics(o.Registerer), state: &meshspec.Model{},
		listNodes: o.Nodes, healthy: o.Healthy, addresses: o.Addresses, plaintext: o.Plaintext, drainGrace: o.DrainGrace, registered: o.Registered, replaceAfter: o.ReplaceAfter, missingSince: map[string]time.Time{}, lastPlaceErr: map[string]string{},
		now: o.Now,
	}
	if c.now == nil {
		c.now = time.Now
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
	c.adopted.Store(&adoptedState{model: c.state})
	c.leadership.Store(&leadership{})
	return c
}

// setLeading records who leads. Called with mu held.
func (c *Controller) setLeading(leading bool, leader string) {
	c.leading, c.leader = leading, leader
	c.leadership.Store(&leadership{leading: leading, leader: leader})
	if leading {
		c.metrics.leader.Set(1)
	} else {
		c.metrics.leader.Set(0)
	}
}

// Lead makes this controller the writer. Holding the write lock throughout,
// it loads the stored state, publishes it, and only then accepts writes, as
// Ray Serve's controller recovers from its checkpoint.
func (c *Controller) Lead(ctx context.Context, self string) error {
	start := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.store.Settle(ctx); err != nil {
		c.log.Error("recover: settling the store failed; leading with what it holds", "err", err)
	}
	m, rev, err := c.store.Load(ctx)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	c.reportUnreadable()
	if err := m.Validate(); err != nil {
		// A stored state that fails today's validation is still what was
		// accepted; serve writes only once an operator fixes it.
		return fmt.Errorf("recover: the stored state is invalid; fix it in the store: %w", err)
	}
	c.adopt(m, rev, meshspec.WholeState)
	c.setLeading(true, self)
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
	c.setLeading(false, leader)
}

// Run watches the store until ctx ends and adopts and publishes every new
// revision written by another controller. Its own commits it adopted as
// it made them, so it does not read them back: at 10,000 endpoints a read
// of the whole store is tens of MB decoded, and the leader made one after
// each change it stored. A store that cannot be read is retried, with
// backoff; the last state keeps serving.
func (c *Controller) Run(ctx context.Context) error {
	retry := backoff.Consul()
	for !c.loadOnce(ctx) {
		if !backoff.Sleep(ctx, retry.Next(0)) {
			return ctx.Err()
		}
	}
	c.mu.Lock()
	rev := c.rev
	c.mu.Unlock()
	retry.Reset()
	for {
		next, err := c.follow(ctx, rev)
		if ctx.Err() != nil {
			return ctx.Err() // shutting down
		}
		if err != nil {
			c.log.Warn("watching the stored state failed; retrying", "err", err)
			if !backoff.Sleep(ctx, retry.Next(0)) {
				return ctx.Err()
			}
			continue
		}
		retry.Reset()
		rev = next
	}
}

// follow waits for the stored revision to move past rev and adopts what
// another writer stored; it returns the revision it got to.
func (c *Controller) follow(ctx context.Context, rev store.Revision) (store.Revision, error) {
	next, err := c.store.Wait(ctx, rev)
	if err != nil {
		return rev, err
	}
	// A commit of this controller's holds mu from before it writes until
	// it adopts what it wrote, so c.rev already names it here.
	c.mu.Lock()
	own := next <= c.rev
	c.mu.Unlock()
	if own {
		return next, nil
	}
	m, loaded, err := c.store.Load(ctx)
	if err != nil {
		return rev, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reportUnreadable()
	// Revisions only grow. A read older than what this controller already
	// holds (it committed meanwhile) must not roll its state back.
	if loaded > c.rev {
		c.adopt(m, loaded, meshspec.WholeState)
	}
	return loaded, nil
}

// loadOnce loads the stored state unless something was loaded already; it
// reports whether there is a state.
func (c *Controller) loadOnce(ctx context.Context) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loaded {
		return true
	}
	m, rev, err := c.store.Load(ctx)
	if err != nil {
		c.log.Warn("loading the stored state failed; retrying", "err", err)
		return false
	}
	c.reportUnreadable()
	c.adopt(m, rev, meshspec.WholeState)
	return true
}

// reportUnreadable sets the metric to what the store's last load left out
// and logs each key once, when it first cannot be read. Called with mu held.
func (c *Controller) reportUnreadable() {
	u := c.store.Unreadable()
	c.metrics.unreadable.Set(float64(len(u)))
	seen := make(map[string]bool, len(u))
	for _, x := range u {
		seen[x.Key] = true
		if !c.unreadableLogged[x.Key] {
			c.log.Warn("a stored key cannot be read; it is left out and left alone", "key", x.Key, "reason", x.Reason)
		}
	}
	c.unreadableLogged = seen
}

// StoreProblems lists the stored keys the last load left out, and why.
func (c *Controller) StoreProblems() []store.Unreadable { return c.store.Unreadable() }

// PlacementProblems are, by backend, why the leader could not place every
// replica the backend wants at its last try (it keeps trying); none on a
// follower.
func (c *Controller) PlacementProblems() map[string]string {
	if p := c.placeProblems.Load(); p != nil {
		return *p
	}
	return nil
}

// adopt makes m the current state and publishes it with what the change
// that made it touched. Called with mu held.
func (c *Controller) adopt(m *meshspec.Model, rev store.Revision, touched meshspec.Touched) {
	c.state, c.rev, c.loaded = m, rev, true
	c.adopted.Store(&adoptedState{model: m, rev: rev})
	if err := c.publish(m, rev, touched); err != nil {
		c.log.Error("publishing the stored state failed; the data plane keeps its last config", "revision", rev, "err", err)
	}
}

// State returns a copy of the last adopted state and its revision. It
// never waits for a write in progress.
func (c *Controller) State() (*meshspec.Model, store.Revision) {
	a := c.adopted.Load()
	return meshspec.Clone(a.model), a.rev
}

// Revision is the last adopted state's revision. It never waits for a
// write in progress.
func (c *Controller) Revision() store.Revision {
	return c.adopted.Load().rev
}

// Peek calls fn with the last adopted state and its revision, not copied:
// fn must neither change it nor keep it. It never waits for a write in
// progress.
func (c *Controller) Peek(fn func(m *meshspec.Model, rev store.Revision)) {
	a := c.adopted.Load()
	fn(a.model, a.rev)
}

// Leader reports whether this controller takes writes, and the leader's
// address as far as it knows. It never waits for a write in progress.
func (c *Controller) Leader() (bool, string) {
	l := c.leadership.Load()
	return l.leading, l.leader
}

// mutate runs one operation: fn edits a copy of the state; an unchanged copy
// is a successful no-op; a changed one is checked against the caller's
// authority and the operator's settings (guard), validated, checkpointed, then adopted and
// published. It reports whether anything changed.
func (c *Controller) mutate(ctx context.Context, op string, fn func(m *meshspec.Model) error) (changed bool, err error) {
	return c.change(ctx, op, fn, true)
}

// change is mutate; validate false says fn validated the whole state it
// made already (an apply validates before it places replicas), so each
// change is validated once.
func (c *Controller) change(ctx context.Context, op string, fn func(m *meshspec.Model) error, validate bool) (changed bool, err error) {
	start := time.Now()
	ctx, span := startSpan(ctx, "operation "+op, attribute.String(wire.TagOperation, op))
	defer func() {
		c.metrics.observe(op, changed, err, time.Since(start))
		endSpan(span, err, attribute.Bool("servemesh.changed", changed))
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.leading {
		return false, &Error{Kind: NotLeader, Msg: "this controller is not the leader; send writes to the leader", Leader: c.leader}
	}
	next := meshspec.Clone(c.state)
	if err := fn(next); err != nil {
		return false, err
	}
	retireDeleted(c.state, next, c.now())
	if err := retiringNameTaken(next); err != nil {
		return false, err
	}
	change := store.Diff(c.state, next)
	if change.Size() == 0 {
		return false, nil
	}
	if err := c.guard(ctx, c.state, next); err != nil {
		return false, err
	}
	if validate {
		if err := next.Validate(); err != nil {
			return false, &Error{Kind: Invalid, Msg: "refused", Err: err}
		}
	}
	if err := c.checkpoint(ctx, change, store.Apply(c.state, change)); err != nil {
		return false, err
	}
	return true, nil
}

// checkpointTimeout bounds one commit, which a client that goes away does
// not cut short: an accepted change is stored whole or not at all.
const checkpointTimeout = 2 * time.Minute

// checkpoint commits change at the current revision, then adopts next, the
// state it makes. Called with mu held.
func (c *Controller) checkpoint(ctx context.Context, change store.Change, next *meshspec.Model) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkpointTimeout)
	defer cancel()
	start := time.Now()
	commitCtx, span := startSpan(ctx, "checkpoint", attribute.Int("servemesh.keys", change.Size()))
	rev, err := c.store.Commit(commitCtx, c.rev, change)
	endSpan(span, err, attribute.Int64(wire.TagRevision, int64(rev)))
	c.metrics.checkpoint.Observe(time.Since(start).Seconds())
	switch {
	case errors.Is(err, store.ErrTooLarge):
		return &Error{Kind: Invalid, Msg: "refused", Err: err}
	case errors.Is(err, store.ErrConflict):
		// Another writer got in: adopt what is stored and let the client retry.
		if m, r, lerr := c.store.Load(ctx); lerr == nil {
			c.adopt(m, r, meshspec.WholeState)
		}
		return &Error{Kind: Unavailable, Msg: "the stored state changed under this controller; nothing changed; retry", Err: err}
	case err != nil:
		return c.afterFailedCommit(ctx, err, next)
	}
	if c.crashP > 0 && rand.Float64() < c.crashP {
		c.log.Warn("fault injection: exiting right after a checkpoint", "revision", rev)
		c.exit(3)
	}
	if c.storesWhatWasMissing(change) {
		// An endpoint the store left out for naming a backend it lacked
		// reads now: the state is read back, as it is not after other
		// commits (Run), so the endpoint is served.
		m, loaded, err := c.store.Load(ctx)
		if err == nil && loaded >= rev {
			c.reportUnreadable()
			c.adopt(m, loaded, meshspec.WholeState)
			return nil
		}
		if err != nil {
			c.log.Warn("reading back a commit that stores a backend a stored endpoint names failed; the endpoint waits for the next read", "err", err)
		}
	}
	c.adopt(next, rev, change.Touched())
	return nil
}

// storesWhatWasMissing reports whether change stores a backend that an
// endpoint the store's last read left out names. Called with mu held.
func (c *Controller) storesWhatWasMissing(change store.Change) bool {
	for _, u := range c.store.Unreadable() {
		if u.Backend != "" && slices.ContainsFunc(change.PutBackends, func(b meshspec.Backend) bool { return b.Name == u.Backend }) {
			return true
		}
	}
	return false
}

// afterFailedCommit finds out what a commit that failed did, so the answer
// says whether the change is stored: it settles the store and reads it back.
func (c *Controller) afterFailedCommit(ctx context.Context, err error, next *meshspec.Model) error {
	if errors.Is(err, store.ErrCommitted) {
		c.log.Warn("a change was committed but not fully applied; settling it", "err", err)
	}
	if serr := c.store.Settle(ctx); serr != nil {
		c.log.Warn("settling the store failed; the next leader settles it", "err", serr)
	}
	m, rev, lerr := c.store.Load(ctx)
	switch {
	case lerr != nil:
		return &Error{Kind: Unavailable, Msg: "the store did not answer: whether the change was stored is unknown; read the state before retrying", Err: errors.Join(err, lerr)}
	case store.Diff(m, next).Size() == 0:
		c.adopt(m, rev, meshspec.WholeState) // it was stored after all
		return nil
	case rev == c.rev:
		return &Error{Kind: Unavailable, Msg: "checkpoint failed; nothing changed", Err: err}
	}
	c.adopt(m, rev, meshspec.WholeState)
	return &Error{Kind: Unavailable, Msg: "checkpoint failed and the stored state moved on; nothing of this change is stored; retry", Err: err}
}
