package rollout

import (
	"time"

	"github.com/servemesh/servemesh/wire"
)

// counts are one backend's counters over a window, summed over nodes.
type counts struct {
	requests, errors uint64
	latency          []uint64 // cumulative, at wire.LatencyBoundsMs
}

// timed is how many answers the latency histogram holds.
func (c counts) timed() uint64 {
	if len(c.latency) == 0 {
		return 0
	}
	return c.latency[len(c.latency)-1]
}

// window holds, per node, the counters a stage's window started from:
// each node's first sample seen in it. Envoy's counters only grow while it
// runs, so a window's figures are the latest sample less the first; a
// node whose counters went back (its Envoy restarted) starts again from 0.
type window struct {
	key     windowKey
	started time.Time                              // when this controller began watching it
	base    map[string]map[string]wire.BackendLoad // node -> backend -> first sample
}

// windowKey names a stage's run: a new stage, or the same one resumed,
// is a new window.
type windowKey struct {
	stage   int
	sinceMs int64
}

func newWindow(key windowKey) *window {
	return &window{key: key, base: map[string]map[string]wire.BackendLoad{}}
}

// observe takes the nodes' latest loads and returns the counts of each of
// backends over the window so far.
func (w *window) observe(loads map[string]wire.Load, backends ...string) []counts {
	out := make([]counts, len(backends))
	for node, l := range loads {
		base := w.base[node]
		if base == nil {
			base = map[string]wire.BackendLoad{}
			w.base[node] = base
		}
		for i, b := range backends {
			now := l.Backends[b]
			then, seen := base[b]
			switch {
			case !seen:
				then = now // counted from here on
			case now.Requests < then.Requests || now.Errors < then.Errors:
				then = wire.BackendLoad{} // Envoy restarted
			case len(then.Latency) == 0:
				then.Latency = now.Latency // histograms flushed for the first time: timed from here on
			}
			base[b] = then
			out[i].add(now, then)
		}
	}
	return out
}

// add adds the counters of now over then. Requests are those answered:
// Envoy counts a request when it sends it and its error when it ends, so
// the ones in flight at either sample are left out of the rate.
func (c *counts) add(now, then wire.BackendLoad) {
	answered := func(b wire.BackendLoad) uint64 { return b.Requests - min(b.Active, b.Requests) }
	requests := uint64(0)
	if a, b := answered(now), answered(then); a > b {
		requests = a - b
	}
	c.requests += requests
	c.errors += min(now.Errors-then.Errors, requests)
	if len(now.Latency) != len(wire.LatencyBoundsMs) {
		return
	}
	if c.latency == nil {
		c.latency = make([]uint64, len(now.Latency))
	}
	for i, v := range now.Latency {
		var was uint64
		if len(then.Latency) == len(now.Latency) {
			was = then.Latency[i]
		}
		if v >= was {
			c.latency[i] += v - was
		}
	}
	// Keep the counts cumulative whatever rounding the subtraction did.
	for i := 1; i < len(c.latency); i++ {
		c.latency[i] = max(c.latency[i], c.latency[i-1])
	}
}
