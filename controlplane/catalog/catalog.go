package catalog

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/wire"
)

// Instance is one registered instance of a service.
type Instance struct {
	ID      string
	Address string // IP:port
	Tag     string // replica tag, for servemesh-run replicas
	Passing bool
}

// Watcher follows the health of a set of services.
type Watcher struct {
	client  *api.Client
	log     *slog.Logger
	changed chan struct{}

	mu        sync.Mutex
	instances map[string][]Instance
	cancels   map[string]context.CancelFunc
}

// NewWatcher returns a watcher of no services; Sync chooses them.
func NewWatcher(client *api.Client, log *slog.Logger) *Watcher {
	return &Watcher{client: client, log: log, changed: make(chan struct{}, 1),
		instances: map[string][]Instance{}, cancels: map[string]context.CancelFunc{}}
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

// Sync watches exactly services from now on.
func (w *Watcher) Sync(ctx context.Context, services []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	want := map[string]bool{}
	for _, s := range services {
		want[s] = true
		if _, ok := w.cancels[s]; !ok {
			wctx, cancel := context.WithCancel(ctx)
			w.cancels[s] = cancel
			go w.watch(wctx, s)
		}
	}
	for s, cancel := range w.cancels {
		if !want[s] {
			cancel()
			delete(w.cancels, s)
			delete(w.instances, s)
		}
	}
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

func (w *Watcher) watch(ctx context.Context, service string) {
	var index uint64
	for ctx.Err() == nil {
		entries, meta, err := w.client.Health().Service(service, "", false,
			(&api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx))
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("catalog watch failed; retrying", "service", service, "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			continue
		}
		if meta.LastIndex < index {
			index = 0
		} else {
			index = meta.LastIndex
		}
		next := make([]Instance, 0, len(entries))
		for _, e := range entries {
			addr := e.Service.Address
			if addr == "" {
				addr = e.Node.Address
			}
			next = append(next, Instance{
				ID:      e.Service.ID,
				Address: net.JoinHostPort(addr, strconv.Itoa(e.Service.Port)),
				Tag:     e.Service.Meta[wire.MetaReplicaTag],
				Passing: e.Checks.AggregatedStatus() == api.HealthPassing,
			})
		}
		slices.SortFunc(next, func(a, b Instance) int {
			if a.ID < b.ID {
				return -1
			}
			if a.ID > b.ID {
				return 1
			}
			return 0
		})
		w.mu.Lock()
		changed := !slices.Equal(w.instances[service], next)
		if _, still := w.cancels[service]; still && changed {
			w.instances[service] = next
		}
		w.mu.Unlock()
		if changed && ctx.Err() == nil {
			select {
			case w.changed <- struct{}{}:
			default: // a change is already pending
			}
		}
	}
}
