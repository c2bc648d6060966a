package rollout

import (
	"time"

	"github.com/servemesh/servemesh/wire"
)

// counts are one backend's counters over a window, summed over nodes.
type counts struct {
	requests, errors uint64
	latency          []uint64 // cumulative, at wire.LatencyBoundsMs
	// ttft and interToken are the GenAI histograms (cumulative, at
	// wire.GenAIBoundsMs), for model traffic.
	ttft, interToken []uint64
}

// timed is how many answers the latency histogram holds.
func (c counts) timed() uint64 { return total(c.latency) }

// window holds, per node, the counters a stage's window started from:
// each node's first sample seen in it. Envoy's counters only grow while it
// runs, so a window's figures are the latest sample less the first; a
// node whose counters went back (its Envoy restarted) starts again from 0.
type window struct {
	key     windowKey
	started time.Time                              // when this controller began watching it
	base    map[string]map[string]wire.BackendLoad // node -> backend -> first sample
	// genai is the same for the GenAI histograms, which the node's agent
	// keeps (they go back when it restarts, not when Envoy does).
	genai map[string]map[string]wire.GenAILoad
}

// windowKey names a stage's run: a new stage, or the same one resumed,
// is a new window.
type windowKey struct {
	stage   int
	sinceMs int64
}

func newWindow(key windowKey) *window {
	return &window{key: key, base: map[string]map[string]wire.BackendLoad{}, genai: map[string]map[string]wire.GenAILoad{}}
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
			out[i].addGenAI(w.genaiBase(node, b, l.GenAI[b]), l.GenAI[b])
		}
	}
	return out
}

// genaiBase is the GenAI histograms of backend on node the window counts
// from: the first seen in it, or none once they went back (the node's
// agent restarted).
func (w *window) genaiBase(node, backend string, now wire.GenAILoad) wire.GenAILoad {
	base := w.genai[node]
	if base == nil {
		base = map[string]wire.GenAILoad{}
		w.genai[node] = base
	}
	then, seen := base[backend]
	switch {
	case !seen:
		then = now
	case total(now.TTFT) < total(then.TTFT) || total(now.InterToken) < total(then.InterToken):
		then = wire.GenAILoad{}
	}
	base[backend] = then
	return then
}

// total is how many answers a cumulative histogram holds.
func total(cumulative []uint64) uint64 {
	if len(cumulative) == 0 {
		return 0
	}
	return cumulative[len(cumulative)-1]
}

// addGenAI adds the GenAI histograms of now over then.
func (c *counts) addGenAI(then, now wire.GenAILoad) {
	c.ttft = addHistogram(c.ttft, then.TTFT, now.TTFT, len(wire.GenAIBoundsMs))
	c.interToken = addHistogram(c.interToken, then.InterToken, now.InterToken, len(wire.GenAIBoundsMs))
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
	c.latency = addHistogram(c.latency, then.Latency, now.Latency, len(wire.LatencyBoundsMs))
}

// addHistogram adds to sum (cumulative counts at n bounds) those of now
// over then; now of another length (none yet, or another release's
// bounds) adds nothing.
func addHistogram(sum, then, now []uint64, n int) []uint64 {
	if len(now) != n {
		return sum
	}
	if sum == nil {
		sum = make([]uint64, n)
	}
	for i, v := range now {
		var was uint64
		if len(then) == len(now) {
			was = then[i]
		}
		if v >= was {
			sum[i] += v - was
		}
	}
	// Keep the counts cumulative whatever rounding the subtraction did.
	for i := 1; i < len(sum); i++ {
		sum[i] = max(sum[i], sum[i-1])
	}
	return sum
}
