package catalog

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/consulwatch"
	"github.com/servemesh/servemesh/wire"
)

// Instance is one registered instance of a service.
type Instance struct {
	ID      string
	Address string // host:port
	Tag     string // replica tag, for servemesh-run replicas
	Passing bool
	// Expired says that the instance is not passing only because its TTL
	// checks expired after a ready beat (wire.ReplicaReadyOutput): it
	// answered when last heard of, and its agent, its node or Consul has
	// stalled since. Which one, nobody can tell from here.
	Expired bool
	// Node and Inbound are the servemesh node running the replica and, with
	// mesh mTLS, its inbound listener (IP:port), as the registration claims
	// them (its meta); for an agent's registration of its node, Node is the
	// node's id.
	Node, Inbound string
	// ConsulNode is the Consul node the instance is registered on: a
	// node's token may register only there.
	ConsulNode string
	// Note is what its failing checks say (their output), empty while it
	// passes: why a replica is not ready, as its agent saw it.
	Note string
	// Restarts are how many times its agent restarted the replica's
	// process after it exited.
	Restarts int
}

// Watcher follows the instances of a set of services with a bounded number
// of connections to Consul, whatever the number of services: one blocking
// query on the health state of every check tells which services changed,
// and at most Fetchers requests at a time read those services' instances.
// Every service is also read again each Resync, for instances registered
// without a check.
type Watcher struct {
	client  *api.Client
	log     *slog.Logger
	changed chan struct{}
	kick    chan struct{}
	// Fetchers bounds concurrent instance reads; Resync is the period of a
	// full read. Set them before Run; 4 and 30s when zero.
	Fetchers int
	Resync   time.Duration
	sem      chan struct{} // one token per read in progress, shared by every fetch

	mu        sync.Mutex
	want      map[string]bool
	instances map[string][]Instance
	digests   map[string]string // service -> digest of its checks when last read
	// changed are the services whose instances changed since TakeChanged
	// last took them.
	changedSet map[string]bool
	nodes      string // digest of the node-level checks
}

// NewWatcher returns a watcher of no services; Sync chooses them, Run
// watches.
func NewWatcher(client *api.Client, log *slog.Logger) *Watcher {
	return &Watcher{client: client, log: log, changed: make(chan struct{}, 1), kick: make(chan struct{}, 1),
		want: map[string]bool{}, instances: map[string][]Instance{}, digests: map[string]string{}, changedSet: map[string]bool{}}
}

// Changed receives a value after any watched service's instances changed;
// changes that arrive before it is read are coalesced into one.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

// PassingTags returns the replica tags of service whose checks pass.
func (w *Watcher) PassingTags(service string) map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]bool{}
	for _, in := range w.instances[service] {
		if in.Passing && in.Tag != "" {
			out[in.Tag] = true
		}
	}
	return out
}

// RegisteredTags returns the replica tags of service's instances, passing
// or not, and whether the service has been read.
func (w *Watcher) RegisteredTags(service string) (map[string]bool, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, known := w.digests[service] // set by every read, instances or none
	out := map[string]bool{}
	for _, in := range w.instances[service] {
		if in.Tag != "" {
			out[in.Tag] = true
		}
	}
	return out, known
}

// Snapshot returns a copy of every watched service's instances.
func (w *Watcher) Snapshot() map[string][]Instance {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string][]Instance, len(w.instances))
	for s, is := range w.instances {
		out[s] = slices.Clone(is)
	}
	return out
}

// Instances returns a copy of the instances of services that are watched.
func (w *Watcher) Instances(services []string) map[string][]Instance {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string][]Instance, len(services))
	for _, s := range services {
		if is, ok := w.instances[s]; ok {
			out[s] = slices.Clone(is)
		}
	}
	return out
}

// TakeChanged returns the services whose instances changed since it last
// returned, and forgets them: the change a signal on Changed announced,
// carried to its one reader.
func (w *Watcher) TakeChanged() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := slices.Sorted(maps.Keys(w.changedSet))
	clear(w.changedSet)
	return out
}

// Sync watches exactly services from now on; new ones are read at once.
func (w *Watcher) Sync(services []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	want := make(map[string]bool, len(services))
	added := false
	for _, s := range services {
		want[s] = true
		added = added || !w.want[s]
	}
	for s := range w.want {
		if !want[s] {
			delete(w.instances, s)
			delete(w.digests, s)
		}
	}
	w.want = want
	if added {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// Run watches until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	if w.Fetchers == 0 {
		w.Fetchers = 4
	}
	if w.Resync == 0 {
		w.Resync = 30 * time.Second
	}
	w.sem = make(chan struct{}, w.Fetchers)
	var resync sync.WaitGroup
	defer resync.Wait()
	resync.Go(func() { w.resyncLoop(ctx) })
	return consulwatch.Loop(ctx, w.log, "the catalog's health", func(ctx context.Context, index uint64) (uint64, error) {
		checks, meta, err := w.client.Health().State(api.HealthAny,
			(&api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx))
		if err != nil {
			return 0, err
		}
		w.fetch(ctx, w.changedServices(checks))
		return meta.LastIndex, nil
	})
}

// resyncLoop reads new services at once (Sync) and every service each Resync.
func (w *Watcher) resyncLoop(ctx context.Context) {
	tick := time.NewTicker(w.Resync)
	defer tick.Stop()
	for {
		all := false
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-tick.C:
			all = true
		}
		w.mu.Lock()
		var services []string
		for s := range w.want {
			if all || w.digests[s] == "" {
				services = append(services, s)
			}
		}
		w.mu.Unlock()
		w.fetch(ctx, services)
	}
}

// changedServices returns the watched services whose checks differ from
// when they were last read: all of them when a node-level check changed.
func (w *Watcher) changedServices(checks api.HealthChecks) []string {
	per := map[string][]string{}
	var nodeChecks []string
	for _, c := range checks {
		entry := fmt.Sprintf("%s/%s/%s/%d", c.Node, c.CheckID, c.Status, c.ModifyIndex)
		if c.ServiceName == "" {
			nodeChecks = append(nodeChecks, entry)
		} else {
			per[c.ServiceName] = append(per[c.ServiceName], entry)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	nodes := digest(nodeChecks)
	all := nodes != w.nodes
	w.nodes = nodes
	var out []string
	for s := range w.want {
		if all || digest(per[s]) != w.digests[s] {
			out = append(out, s)
		}
	}
	return out
}

func digest(entries []string) string {
	sort.Strings(entries)
	h := sha256.New()
	for _, e := range entries {
		fmt.Fprintln(h, e)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// fetch reads services' instances, at most Fetchers at a time over every
// fetch in progress, and signals Changed once if any differ.
func (w *Watcher) fetch(ctx context.Context, services []string) {
	if len(services) == 0 {
		return
	}
	sem := w.sem
	var wg sync.WaitGroup
	var mu sync.Mutex
	changed := false
	for _, s := range services {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if w.read(ctx, s) {
				mu.Lock()
				changed = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if changed && ctx.Err() == nil {
		select {
		case w.changed <- struct{}{}:
		default: // a change is already pending
		}
	}
}

// read reads one service's instances and reports whether they changed.
func (w *Watcher) read(ctx context.Context, service string) bool {
	entries, _, err := w.client.Health().Service(service, "", false, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("reading a service's instances failed; the next change or resync retries", "service", service, "err", err)
		}
		return false
	}
	next := make([]Instance, 0, len(entries))
	var checks []string
	for _, e := range entries {
		addr := e.Service.Address
		if addr == "" {
			addr = e.Node.Address
		}
		next = append(next, Instance{ID: e.Service.ID, Address: net.JoinHostPort(addr, strconv.Itoa(e.Service.Port)),
			Tag: e.Service.Meta[wire.MetaReplicaTag], Passing: e.Checks.AggregatedStatus() == api.HealthPassing, Expired: expired(e.Checks),
			Node: cmp.Or(e.Service.Meta[wire.MetaReplicaNode], e.Service.Meta[wire.MetaNodeID]), Inbound: e.Service.Meta[wire.MetaReplicaInbound],
			ConsulNode: e.Node.Node, Note: note(e.Checks), Restarts: restarts(e.Service.Meta)})
		for _, c := range e.Checks {
			if c.ServiceName != "" {
				checks = append(checks, fmt.Sprintf("%s/%s/%s/%d", c.Node, c.CheckID, c.Status, c.ModifyIndex))
			}
		}
	}
	slices.SortFunc(next, func(a, b Instance) int { return cmpString(a.ID, b.ID) })
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.want[service] {
		return false
	}
	w.digests[service] = digest(checks)
	if slices.Equal(w.instances[service], next) {
		return false
	}
	w.instances[service] = next
	w.changedSet[service] = true
	return true
}

// restarts reads a replica's restart count from its registration's meta
// (0 when absent or not a count).
func restarts(meta map[string]string) int {
	n, err := strconv.Atoi(meta[wire.MetaReplicaRestarts])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// maxNote bounds an instance's Note.
const maxNote = 2048

// note is what an instance's failing checks say: their output, then their
// notes (where an agent says why a replica's process exited, see
// wire.MaxExitNote); empty while it passes.
func note(checks api.HealthChecks) string {
	var out []string
	for _, c := range checks {
		if c.Status == api.HealthPassing {
			continue
		}
		for _, s := range []string{c.Output, c.Notes} {
			if s != "" {
				out = append(out, s)
			}
		}
	}
	note := strings.Join(out, "; ")
	if len(note) > maxNote {
		note = note[:maxNote] + "..."
	}
	return note
}

// expiredAfterReady is the output Consul gives a TTL check that expired
// after an agent's ready beat.
const expiredAfterReady = "TTL expired (last output before timeout follows): " + wire.ReplicaReadyOutput

// expired reports whether checks fail, and every one that does is a TTL
// check that expired after a ready beat.
func expired(checks api.HealthChecks) bool {
	failing := 0
	for _, c := range checks {
		if c.Status == api.HealthPassing {
			continue
		}
		if c.Type != "ttl" || c.Output != expiredAfterReady {
			return false
		}
		failing++
	}
	return failing > 0
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
