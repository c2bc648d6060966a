package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// NodeLister returns the nodes whose agents are alive.
type NodeLister func(ctx context.Context) ([]wire.NodeInfo, error)

type usage struct {
	cpus  float64
	mem   int
	count map[string]int // replicas per backend
	res   map[string]int // devices per resource
}

func newUsage() *usage { return &usage{count: map[string]int{}, res: map[string]int{}} }

// add counts one replica of b.
func (u *usage) add(b *meshspec.Backend) {
	u.cpus += b.Config.CPUs
	u.mem += b.Config.MemoryMB
	u.count[b.Name]++
	for name, n := range b.Config.Resources {
		u.res[name] += n
	}
}

// fits reports whether node n, used u, has room for one replica of b.
func (u *usage) fits(n wire.NodeInfo, b *meshspec.Backend) bool {
	if n.CPUs-u.cpus < b.Config.CPUs-1e-9 || n.MemoryMB-u.mem < b.Config.MemoryMB {
		return false
	}
	for name, want := range b.Config.Resources {
		if n.Resources[name]-u.res[name] < want {
			return false
		}
	}
	return true
}

// nodeUsage sums what every placement in m takes of each node.
func nodeUsage(m *meshspec.Model) map[string]*usage {
	out := map[string]*usage{}
	for _, b := range m.Served() { // a retiring backend's replicas hold theirs until they stop
		for _, p := range b.Placements {
			u := out[p.Node]
			if u == nil {
				u = newUsage()
				out[p.Node] = u
			}
			u.add(&b)
		}
	}
	return out
}

// schedule makes backend i's running placements number NumReplicas: it adds
// placements on the nodes with room, spreading them (fewest replicas of the
// backend first, then most free CPU), or marks the surplus draining, those
// whose replicas are not ready first (ready lists the ready tags; nil: all
// are). If not every replica fits, those that fit are placed and the error
// (a Conflict with a Shortfall) says what would fit them all: a user's
// operation then fails and changes nothing; the controller's own
// (autoscaling, reconciling) keep what fits and try again for the rest.
func schedule(m *meshspec.Model, i int, nodes []wire.NodeInfo, now time.Time, ready map[string]bool) error {
	b := &m.Backends[i]
	if !b.Managed() {
		return nil
	}
	spec := meshspec.SpecHash(b.Process)
	// Replicas of the current spec on nodes not drained; older ones, and
	// those of drained nodes, are replaced and drained in Reconcile.
	var running []int
	for j, p := range b.Placements {
		if p.State == meshspec.Running && p.Runs(spec) && !m.Drained(p.Node) {
			running = append(running, j)
		}
	}
	want := b.Config.NumReplicas
	switch {
	case len(running) > want:
		drainSurplus(b, running, want, now, ready)
	case len(running) < want:
		need := want - len(running)
		if len(nodes) == 0 {
			return errorf(Conflict, "cannot place %d replicas of backend %q: no node is connected (no agent's registration passes in Consul); start an agent on a node (servemesh agent), or check that its heartbeat reaches Consul",
				need, b.Name)
		}
		nodes, err := allowing(m, bounded(m, nodes), b.Process.Command)
		if err != nil {
			return err
		}
		if err := offering(nodes, b); err != nil {
			return err
		}
		added := place(m, b, nodes, need, now, spec)
		b.Placements = append(b.Placements, added...)
		if len(added) < need {
			e := shortOfNodes(m, b.Name, nodes, want, need, len(added), len(running)+len(added))
			e.Shortfall = need - len(added)
			return e
		}
	}
	return nil
}

// shortOfNodes says why only added of need new replicas of backend found
// a node: every node that may run it is cordoned or drained, or free
// resources ran out (naming the nodes cordoned or drained, if some are).
func shortOfNodes(m *meshspec.Model, backend string, nodes []wire.NodeInfo, want, need, added, total int) *Error {
	var held []string
	for _, n := range nodes {
		if !m.Schedulable(n.ID) {
			held = append(held, n.ID)
		}
	}
	if len(held) == len(nodes) {
		return errorf(Conflict, "cannot scale backend %q to %d replicas: every node that may run it is cordoned or drained (%s); uncordon one (servemesh node uncordon NODE), or add nodes",
			backend, want, strings.Join(held, ", "))
	}
	e := errorf(Conflict, "cannot scale backend %q to %d replicas: servemesh tried to add %d replicas but the nodes' free resources only allow %d to be added; scale to %d replicas, lower the backend's cpus, memory_mb or resources, or add nodes",
		backend, want, need, added, total)
	if len(held) > 0 {
		e.Msg += fmt.Sprintf(" (cordoned or drained, taking none: %s)", strings.Join(held, ", "))
	}
	return e
}

// drainSurplus marks running placements beyond want draining: those whose
// replicas are not ready first (a scale-down right after a scale-up must not
// drain the replicas that serve and keep the ones still starting), then
// from the nodes holding the most replicas of the backend.
func drainSurplus(b *meshspec.Backend, running []int, want int, now time.Time, ready map[string]bool) {
	per := map[string]int{}
	for _, j := range running {
		per[b.Placements[j].Node]++
	}
	notReady := func(j int) bool { return ready != nil && !ready[b.Placements[j].Tag] }
	sort.SliceStable(running, func(x, y int) bool {
		if nx, ny := notReady(running[x]), notReady(running[y]); nx != ny {
			return nx
		}
		return per[b.Placements[running[x]].Node] > per[b.Placements[running[y]].Node]
	})
	for _, j := range running[:len(running)-want] {
		b.Placements[j].State = meshspec.Draining
		b.Placements[j].Since = now.Unix()
	}
}

// place chooses nodes with room for up to need new replicas of b, spreading
// them (fewest replicas of b first, then most free CPU), and returns their
// placements; fewer than need when the nodes are full.
func place(m *meshspec.Model, b *meshspec.Backend, nodes []wire.NodeInfo, need int, now time.Time, spec string) []meshspec.Placement {
	used := nodeUsage(m)
	var added []meshspec.Placement
	for range need {
		best := -1
		for k, n := range nodes {
			u := used[n.ID]
			if u == nil {
				u = newUsage()
				used[n.ID] = u
			}
			if !u.fits(n, b) || !m.Schedulable(n.ID) {
				continue
			}
			if best < 0 || better(n, u, nodes[best], used[nodes[best].ID], b.Name) {
				best = k
			}
		}
		if best < 0 {
			break
		}
		n := nodes[best]
		used[n.ID].add(b)
		added = append(added, meshspec.Placement{Tag: newTag(b.Name, b.Placements, added), Node: n.ID, State: meshspec.Running, Since: now.Unix(), Spec: spec})
	}
	return added
}

// offering refuses a backend asking for a resource that none of nodes
// offers at all (more would never fit), naming it and the fix.
func offering(nodes []wire.NodeInfo, b *meshspec.Backend) error {
	for _, name := range meshspec.SortedKeys(b.Config.Resources) {
		want, most := b.Config.Resources[name], 0
		for _, n := range nodes {
			most = max(most, n.Resources[name])
		}
		if want > most {
			return errorf(Conflict, "backend %q asks for %d %s per replica, and no node that may run it offers that many (the most: %d); start an agent with --resource %s=%d, or lower config.resources.%s",
				b.Name, want, name, most, name, want, name)
		}
	}
	return nil
}

// bounded is nodes as the operator's node policies in m bound them (see
// meshspec.NodePolicy): each figure the smaller of the agent's claim and the
// policy's, and only the commands both allow.
func bounded(m *meshspec.Model, nodes []wire.NodeInfo) []wire.NodeInfo {
	out := make([]wire.NodeInfo, 0, len(nodes))
	for _, n := range nodes {
		if spec, _ := m.NodeSpecOf(n.ID); spec.Policy != nil {
			n = spec.Policy.Bound(n)
		}
		out = append(out, n)
	}
	return out
}

// allowing returns the nodes whose agents, and whose policies in m, allow
// command, or an error naming the command and the nodes when none do.
func allowing(m *meshspec.Model, nodes []wire.NodeInfo, command string) ([]wire.NodeInfo, error) {
	var out []wire.NodeInfo
	var ids, refusing []string
	for _, n := range nodes {
		ids = append(ids, n.ID)
		spec, _ := m.NodeSpecOf(n.ID)
		switch {
		case !n.Allows(command):
		case spec.Policy != nil && !spec.Policy.Allows(command):
			refusing = append(refusing, n.ID)
		default:
			out = append(out, n)
		}
	}
	switch {
	case len(out) > 0 || len(nodes) == 0:
		return out, nil
	case len(refusing) > 0:
		return nil, errorf(Conflict, "no node allows command %q: the agents of %s do, and their node policies do not; add it with servemesh node policy NODE --allow-command %q",
			command, strings.Join(refusing, ", "), command)
	}
	return nil, errorf(Conflict, "no node allows command %q (nodes: %s); start their agents with --allow-command %q (or a pattern that matches it)",
		command, strings.Join(ids, ", "), command)
}

func better(n wire.NodeInfo, u *usage, best wire.NodeInfo, bu *usage, backend string) bool {
	if u.count[backend] != bu.count[backend] {
		return u.count[backend] < bu.count[backend]
	}
	if free, bestFree := n.CPUs-u.cpus, best.CPUs-bu.cpus; free != bestFree {
		return free > bestFree
	}
	return n.ID < best.ID
}

// randRead draws random bytes; tests replace it.
var randRead = rand.Read

// newTag draws a replica tag for backend that none of its placements (nor
// those being added) has: 24 random bits, drawn again on a collision.
func newTag(backend string, placed ...[]meshspec.Placement) string {
	for {
		var b [3]byte
		_, _ = randRead(b[:])
		tag := backend + "#" + hex.EncodeToString(b[:])
		taken := false
		for _, ps := range placed {
			taken = taken || slices.ContainsFunc(ps, func(p meshspec.Placement) bool { return p.Tag == tag })
		}
		if !taken {
			return tag
		}
	}
}

// nodes lists live nodes, or none if the controller has no lister.
func (c *Controller) nodes(ctx context.Context) ([]wire.NodeInfo, error) {
	if c.listNodes == nil {
		return nil, nil
	}
	nodes, err := c.listNodes(ctx)
	if err != nil {
		return nil, &Error{Kind: Unavailable, Msg: "listing nodes failed; nothing changed", Err: err}
	}
	return nodes, nil
}

// Reconcile finishes what placements ask for, as the leader: it removes
// draining placements whose drain period is over, drains the replicas of
// nodes that have been gone for ReplaceAfter, and places missing replicas.
// It is what recovery runs after a crash, too.
func (c *Controller) Reconcile(ctx context.Context) error {
	nodes, err := c.nodes(ctx)
	if err != nil {
		return err
	}
	now := c.now()
	alive := map[string]bool{}
	for _, n := range nodes {
		alive[n.ID] = true
	}
	_, err = c.mutate(ctx, "reconcile", func(m *meshspec.Model) error {
		for id := range alive {
			delete(c.missingSince, id) // under mu, as mutate runs this
		}
		for i := range m.Backends {
			b := &m.Backends[i]
			if !b.Managed() {
				continue
			}
			kept := b.Placements[:0]
			for _, p := range b.Placements {
				if p.State == meshspec.Running && !alive[p.Node] {
					first, seen := c.missingSince[p.Node]
					if !seen {
						c.missingSince[p.Node] = now
					} else if now.Sub(first) >= c.replaceAfter {
						c.log.Warn("node gone; replacing its replica", "node", p.Node, "replica", p.Tag, "gone_for", now.Sub(first).Round(time.Second))
						continue // its replica is dead: forget it, place a new one below
					}
				}
				if p.State == meshspec.Draining && c.drained(b, p, now) {
					continue
				}
				kept = append(kept, p)
			}
			b.Placements = kept
			c.rollOut(m, b, now)
			err := schedule(m, i, nodes, now, c.readyTags(b.Name))
			if msg := fmt.Sprint(err); err != nil && c.lastPlaceErr[b.Name] != msg {
				c.log.Warn("reconcile: cannot place every replica yet; will keep trying", "backend", b.Name, "err", err)
				c.lastPlaceErr[b.Name] = msg
			} else if err == nil {
				delete(c.lastPlaceErr, b.Name)
			}
		}
		c.pruneRetiring(m, now)
		for name := range c.lastPlaceErr {
			if findBackend(m, name) < 0 {
				delete(c.lastPlaceErr, name) // deleted meanwhile
			}
		}
		problems := maps.Clone(c.lastPlaceErr)
		c.placeProblems.Store(&problems)
		return nil
	})
	return err
}

// rollOut drains the replicas of an older process spec, and those of
// drained nodes, once the backend has NumReplicas healthy replicas of the
// current spec elsewhere, so neither a new spec nor a node's drain ever
// leaves the backend without serving replicas.
func (c *Controller) rollOut(m *meshspec.Model, b *meshspec.Backend, now time.Time) {
	spec := meshspec.SpecHash(b.Process)
	var old []int
	var fresh []string
	for j, p := range b.Placements {
		switch {
		case p.State != meshspec.Running:
		case p.Runs(spec) && !m.Drained(p.Node):
			fresh = append(fresh, p.Tag)
		default:
			old = append(old, j)
		}
	}
	if len(old) == 0 {
		return
	}
	healthy := len(fresh)
	if c.healthy != nil {
		passing := c.healthy(b.Name)
		healthy = 0
		for _, tag := range fresh {
			if passing[tag] {
				healthy++
			}
		}
	}
	if healthy < b.Config.NumReplicas {
		return // not yet: the old replicas keep serving
	}
	for _, j := range old {
		b.Placements[j].State, b.Placements[j].Since = meshspec.Draining, now.Unix()
	}
	c.log.Info("replaced replicas of an older process spec or a drained node; draining them", "backend", b.Name, "old", len(old), "new", len(fresh))
}

// readyTags are the tags of backend's replicas that pass their health
// checks, or nil when the controller is not told (every one counts as
// ready).
func (c *Controller) readyTags(backend string) map[string]bool {
	if c.healthy == nil {
		return nil
	}
	return c.healthy(backend)
}

// drainMargin is extra time after the graceful shutdown timeout before a
// draining placement is dropped, so the agent has stopped the replica by
// then.
const drainMargin = 2 * time.Second

// drained reports whether draining placement p of b is done with: its
// replica has deregistered (its agent stops it once the drain grace has
// passed and its requests in flight have ended, then deregisters it), or
// the backend's graceful shutdown timeout has passed. Until then the
// placement holds its node's resources. Its clock is the stored Since, so
// a controller fail-over does not restart it.
func (c *Controller) drained(b *meshspec.Backend, p meshspec.Placement, now time.Time) bool {
	draining := now.Sub(time.Unix(p.Since, 0))
	if draining >= b.Config.EffectiveGracefulShutdown()+drainMargin {
		return true
	}
	if draining < c.drainGrace || c.registered == nil {
		return false
	}
	tags, known := c.registered(wire.BackendService(b.Name))
	return known && !tags[p.Tag]
}

// ReconcileLoop runs Reconcile every interval until ctx ends.
func (c *Controller) ReconcileLoop(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := c.Reconcile(ctx); err != nil && KindOf(err) != NotLeader && ctx.Err() == nil {
			c.log.Warn("reconcile failed; will retry", "err", fmt.Sprint(err))
		}
	}
}
