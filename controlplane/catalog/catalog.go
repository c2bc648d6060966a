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

	"github.com/servemesh/servemesh/controlplane/model"
)

// MetaReplicaTag is the service-instance meta key holding a replica's tag.
const MetaReplicaTag = "replica_tag"

// MetaNode is the service-instance meta key holding a replica's node.
const MetaNode = "servemesh_node"

// Instance is one registered instance of a service.
type Instance struct {
	ID      string
	Address string // IP:port
	Tag     string // replica tag, for servemesh-run replicas
	Passing bool
}

// Watcher follows the health of a set of services.
type Watcher struct {
	client   *api.Client
	log      *slog.Logger
	onChange func()

	mu        sync.Mutex
	instances map[string][]Instance
	cancels   map[string]context.CancelFunc
}

// NewWatcher returns a watcher; onChange is called after any service's
// instances change.
func NewWatcher(client *api.Client, log *slog.Logger, onChange func()) *Watcher {
	return &Watcher{client: client, log: log, onChange: onChange,
		instances: map[string][]Instance{}, cancels: map[string]context.CancelFunc{}}
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
				Tag:     e.Service.Meta[MetaReplicaTag],
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
			w.onChange()
		}
	}
}

// Services returns the Consul services a model's backends read replicas from.
func Services(m *model.Model) []string {
	var out []string
	for _, b := range m.Backends {
		switch {
		case b.Process != nil:
			out = append(out, b.Name)
		case b.External != nil:
			out = append(out, b.External.Service)
		}
	}
	return out
}

// DataPlaneView returns m with every backend's replicas listed plainly, as
// the translator reads them: process backends get their placed replicas
// that Consul knows, external ones their service's instances.
func DataPlaneView(m *model.Model, instances map[string][]Instance) *model.Model {
	out := model.Clone(m)
	for i := range out.Backends {
		b := &out.Backends[i]
		switch {
		case b.Process != nil:
			placed := map[string]model.PlacementState{}
			for _, p := range b.Placements {
				placed[p.Tag] = p.State
			}
			for _, in := range instances[b.Name] {
				state, ok := placed[in.Tag]
				if !ok {
					continue // not (or no longer) placed: not ours to serve
				}
				b.Replicas = append(b.Replicas, model.Replica{Address: in.Address, Health: health(in.Passing, state)})
			}
		case b.External != nil:
			for _, in := range instances[b.External.Service] {
				b.Replicas = append(b.Replicas, model.Replica{Address: in.Address, Health: health(in.Passing, model.Running)})
			}
		}
		// What only the controller and agents use goes: the view is plain
		// replicas, as in a config file.
		b.Process, b.External, b.Placements, b.Config.Autoscaling = nil, nil, nil, nil
		b.Replicas = dedupe(b.Replicas)
	}
	return out
}

func health(passing bool, state model.PlacementState) model.Health {
	switch {
	case state == model.Draining:
		return model.HealthDraining
	case passing:
		return model.HealthHealthy
	default:
		return model.HealthUnhealthy
	}
}

// dedupe keeps the first replica per address (two registrations of one
// address would fail validation).
func dedupe(rs []model.Replica) []model.Replica {
	seen := map[string]bool{}
	out := rs[:0]
	for _, r := range rs {
		if !seen[r.Address] {
			seen[r.Address] = true
			out = append(out, r)
		}
	}
	return out
}
