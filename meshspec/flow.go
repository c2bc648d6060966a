package meshspec

import (
	"math"
	"strings"

	"github.com/servemesh/servemesh/wire"
)

// Flow control: what happens to a request of a load-aware backend when
// every replica on the node it reaches is saturated (the Gateway API
// Inference Extension's flow control, on every node's picker).
//
//   - Each request has an integer priority: its endpoint's Priority, or
//     lower if the request asks (PriorityHeader); never higher than the
//     endpoint allows, whatever it says.
//   - A request of priority 0 or more goes to a replica with fewer than
//     max_concurrent_queries in flight (its server queues it), else waits
//     on the node for one, at most the backend's QueueTimeoutS; the highest priority waiting goes
//     first, and within a priority the tenants (the backend's
//     TenantHeader) take turns, so that one tenant's burst cannot starve
//     another of the same priority.
//   - A request of a priority below 0 (sheddable) never waits: it is
//     answered 429 with Retry-After. When the queue is full the lowest
//     priority is refused first.
//
// Criticality maps onto it: critical is priority 0, sheddable -1.

// Headers of flow control.
const (
	// PriorityHeader carries the priority a request asks for, an integer;
	// it counts only up to what its endpoint allows.
	PriorityHeader = wire.PriorityHeader
	// PriorityLimitHeader carries what the request's endpoint allows, set
	// by the route on every request (a client's own is replaced).
	PriorityLimitHeader = wire.PriorityLimitHeader
)

// Bounds of flow control.
const (
	// MaxPriority bounds an endpoint's priority, both ways.
	MaxPriority = 1000
	// DefaultMaxQueued and MaxQueuedLimit: how many requests of one
	// backend may wait on one node, by default and at most.
	DefaultMaxQueued = 1000
	MaxQueuedLimit   = 100000
	// DefaultQueueTimeoutS and MaxQueueTimeoutS: how long a request may
	// wait for a replica, by default and at most (seconds).
	DefaultQueueTimeoutS = 10
	MaxQueueTimeoutS     = 60
)

// EffectiveMaxQueued is how many requests may wait on one node.
func (l LoadAware) EffectiveMaxQueued() int {
	if l.MaxQueued == 0 {
		return DefaultMaxQueued
	}
	return l.MaxQueued
}

// EffectiveQueueTimeoutS is how long a request may wait, in seconds.
func (l LoadAware) EffectiveQueueTimeoutS() float64 {
	if l.QueueTimeoutS == 0 {
		return DefaultQueueTimeoutS
	}
	return l.QueueTimeoutS
}

// EffectivePriority is the priority of the endpoint's requests when they
// ask for none, and the most they may ask for: Priority, or by
// criticality (critical 0, sheddable -1).
func (e Endpoint) EffectivePriority() int {
	switch {
	case e.Priority != 0:
		return e.Priority
	case e.EffectiveCriticality() == Sheddable:
		return -1
	}
	return 0
}

// validateFlowControl checks a backend's flow control.
func validateFlowControl(p *problems, field string, f LoadAware) {
	if h := f.TenantHeader; h != "" && (!headerName.MatchString(h) || strings.HasPrefix(h, "x-servemesh-")) {
		p.add(field+".tenant_header", "%.80q is not a header of the clients' own; name a lower-case header such as x-tenant-id", h)
	}
	if f.MaxQueued < 0 || f.MaxQueued > MaxQueuedLimit {
		p.add(field+".max_queued", "is %d; set how many requests may wait on a node, from 1 to %d, or leave it out for %d", f.MaxQueued, MaxQueuedLimit, DefaultMaxQueued)
	}
	if t := f.QueueTimeoutS; math.IsNaN(t) || t < 0 || t > MaxQueueTimeoutS {
		p.add(field+".queue_timeout_s", "is %v; set how long a request may wait for a replica, up to %d seconds, or leave it out for %d", t, MaxQueueTimeoutS, DefaultQueueTimeoutS)
	}
}

// validatePriority checks an endpoint's priority against its criticality.
func validatePriority(p *problems, field string, e Endpoint) {
	switch {
	case e.Priority < -MaxPriority || e.Priority > MaxPriority:
		p.add(field+".priority", "is %d; set an integer from %d to %d (below 0: sheddable)", e.Priority, -MaxPriority, MaxPriority)
	case e.Priority > 0 && e.Criticality == Sheddable:
		p.add(field+".priority", "is %d, but criticality is sheddable, which is a priority below 0; give a negative priority or remove criticality", e.Priority)
	case e.Priority < 0 && e.Criticality == Critical:
		p.add(field+".priority", "is %d, which is sheddable, but criticality is critical; give a priority of 0 or more or remove criticality", e.Priority)
	}
}
