// Package scoring is the picker's policy, pure: from what is known of each
// replica of a backend on a node (its requests in flight, its smoothed
// time to first byte, what its server last reported), which one takes a
// request, whether the request is shed, and what the node reports of its
// capacity to calling nodes. No state, no clock, no I/O: the picker
// (agent/picker) holds the figures and asks. A request's pick is one pass
// through a pipeline of filters, weighted scorers and a picker
// (pipeline.go, which draws it); this file holds the figures' own rules
// (saturation, smoothing, failures, the node's load report). It is off the
// flow of docs/architecture.md, a part of step 9's picker.
package scoring

import (
	"fmt"
	"math"
	"time"
)

// Server is what a replica's server last said of its load (its metrics),
// and when.
type Server struct {
	At                     time.Time
	Waiting, Running, KV   float64
	HasWaiting, HasRunning bool
	HasKV                  bool
}

// Replica is what the picker knows of one ready replica.
type Replica struct {
	InFlight int
	TTFB     time.Duration // smoothed; 0: none yet
	Server   Server
	// PrefixHit is the share of the request's prompt the replica is
	// expected to hold in its prefix cache (0 to 1; agent/picker/prefix):
	// it is set for the request being picked.
	PrefixHit float64
	// ModelMiss is what the request's model costs the replica, for a
	// backend whose replicas load models on demand: 0 loaded, 1 loaded
	// into room it has, 2 loaded in place of another (ModelWeight).
	ModelMiss int
	// Failures is how many of its last answers in a row were 5xx.
	Failures int
	// QueuedTokens are the uncached prompt tokens of the requests the
	// node sent it that have had no first byte yet: its prefill queue;
	// PrefillRate is how many tokens a second it prefills (0: not known
	// yet). See tokens.go.
	QueuedTokens int
	PrefillRate  float64
}

// FailurePenalty is how much slower than its smoothed time to first byte
// (or the typical one, if more) a replica's 5xx answer counts: each
// failure nearly doubles its smoothed time (TTFBWeight), so a replica
// that keeps failing gets ever fewer requests, and wins its share back as
// its answers come again.
const FailurePenalty = 4

// FailedTTFB is the time to first byte a 5xx answer of r counts as.
func FailedTTFB(r Replica, typical time.Duration) time.Duration {
	return FailurePenalty * max(r.TTFB, typical)
}

// FailingAfter is how many 5xx answers in a row make a replica failing:
// it is no longer a prompt's home or a conversation's replica (one
// failure may be the request's own; two in a row are the replica's).
const FailingAfter = 2

// Failing reports whether r's last FailingAfter answers failed.
func (r Replica) Failing() bool { return r.Failures >= FailingAfter }

// ModelWeight is how much a model the replica must load adds to its cost,
// per ModelMiss: among replicas that do not hold the request's model, one
// with room for it is picked while its requests pending stay under nine
// fifths of those of one that must drop another. A replica that holds the
// model is kept by ModelHolder, by requests pending alone.
const ModelWeight = 4

// PrefixWeight is how much a cached prompt lowers a replica's cost: a
// whole prompt cached makes it cost 1 - PrefixWeight of what it would, so
// a replica holding the prefix is picked while its requests pending are
// under four times those of one that does not (llm-d's prefix scorer
// outweighs its load scorers too); past that, load wins, which is the
// fall back to load alone when the fleet is imbalanced.
const PrefixWeight = 0.75

// Limits are what saturate a backend's replicas: its
// max_concurrent_queries and its load_aware queue and KV-cache limits.
type Limits struct {
	MaxInFlight int
	// QueueLimit, if positive, saturates a replica whose server reports
	// that many requests waiting.
	QueueLimit int
	// KVCacheLimit, if positive, saturates a replica whose server reports
	// that much of its KV cache used (0 to 1).
	KVCacheLimit float64
	// MaxModels, if positive, is how many models one replica holds.
	MaxModels int
	// CacheTokens, if positive, is how many tokens one replica's prefix
	// cache holds, as its backend sets it (else as its server says).
	CacheTokens int
	// TTFTBudget, if positive, is the prefill an affinity target may
	// have queued and still keep a request (TokenSaturated).
	TTFTBudget time.Duration
}

// Stale is how old a server's figures may be and still count.
const Stale = 2 * time.Second

// TTFBWeight is how much each new time to first byte moves the smoothed
// one.
const TTFBWeight = 0.3

// Smooth is the smoothed time to first byte after one more answer's.
func Smooth(smoothed, ttfb time.Duration) time.Duration {
	if smoothed == 0 {
		return ttfb
	}
	return time.Duration(TTFBWeight*float64(ttfb) + (1-TTFBWeight)*float64(smoothed))
}

// Fresh reports whether r's server figures count at now.
func (r Replica) Fresh(now time.Time) bool { return now.Sub(r.Server.At) < Stale }

// Saturated reports whether r may take no more requests without waiting:
// its requests in flight reach the limit (Envoy queues the rest), or its
// server's fresh figures put its queue or its KV cache at theirs.
func (r Replica) Saturated(l Limits, now time.Time) bool {
	if r.InFlight >= l.MaxInFlight {
		return true
	}
	s := r.Server
	return r.Fresh(now) && ((l.QueueLimit > 0 && s.HasWaiting && s.Waiting >= float64(l.QueueLimit)) ||
		(l.KVCacheLimit > 0 && s.HasKV && s.KV >= l.KVCacheLimit))
}

// Cost is r's expected time to answer one more request, Linkerd's
// peak-EWMA: its time to first byte (typical, if it has none yet) times
// its requests pending plus one, where pending is what the node has in
// flight to it or, if its server says more (running and waiting), that;
// a full KV cache doubles it, the request's prompt in its prefix cache
// lowers it (PrefixWeight), a model to load raises it (ModelWeight). It
// is the pipeline's cost with every scorer weighing 1 (Cost).
func (r Replica) Cost(now time.Time, typical time.Duration) float64 {
	return Cost(Candidate{Replica: r}, Ask{Now: now, Typical: typical})
}

// Pending is r's requests pending: what the node has in flight to it or,
// if its server's fresh figures say more (running and waiting), that.
func (r Replica) Pending(now time.Time) float64 {
	pending := float64(r.InFlight)
	if s := r.Server; r.Fresh(now) && (s.HasWaiting || s.HasRunning) {
		pending = math.Max(pending, s.Waiting+s.Running)
	}
	return pending
}

// HomeLoad is how much busier than the cheapest replica a prompt's home
// (the replica that holds it, or where it was placed: agent/picker's
// placement) may be and still take it: four times its requests pending
// (plus one), as a prompt held in cache weighs against load
// (PrefixWeight). Requests pending, not the cost: a replica's time to
// first byte counts the full prefills of the prompts it took first,
// which is what a home is for.
const HomeLoad = 4

// KeepsHome reports whether a prompt's home, not saturated, takes it
// rather than the cheapest replica: while its requests pending (plus
// one) are at most HomeLoad times the cheapest's.
func KeepsHome(home, cheapest Replica, now time.Time) bool {
	return home.Pending(now)+1 <= HomeLoad*(cheapest.Pending(now)+1)
}

// Typical stands in for the time to first byte of a replica that has
// answered nothing yet: the fastest of the others' (not one whose last
// answer failed: it sets no pace), so it is tried soon; a millisecond
// when none has answered.
func Typical(replicas []Replica) time.Duration {
	var best time.Duration
	for _, r := range replicas {
		if r.TTFB > 0 && r.Failures == 0 && (best == 0 || r.TTFB < best) {
			best = r.TTFB
		}
	}
	if best == 0 {
		return time.Millisecond
	}
	return best
}

// reportKnee and reportFloor bound what a replica's time to first byte,
// which the replica controls, does to its node's weight: above the knee a
// slower replica counts for less by its time squared (the discount that
// sends answers to faster nodes); below it only by its time (what it can
// serve); and no time counts as less than the floor. So a replica that
// answers at once counts for at most 10 times one answering in 10 ms
// (before, a forged fast answer grew its node's weight quadratically
// without bound).
const (
	reportKnee  = 10 * time.Millisecond
	reportFloor = time.Millisecond
)

// SaturatedShare is the share of its capacity a saturated replica counts
// for in its node's load report: callers send a node whose every replica
// is saturated a tenth of its share, not none, so its answers keep its
// report fresh.
const SaturatedShare = 0.1

// minUtilization keeps a report valid (Envoy ignores a utilization of 0).
const minUtilization = 1e-6

// replicaSeconds is the denominator of a replica's capacity in its node's
// report: its time to first byte times the larger of it and reportKnee,
// in seconds squared.
func replicaSeconds(ttfb time.Duration) float64 {
	ttfb = max(ttfb, reportFloor)
	return ttfb.Seconds() * max(ttfb, reportKnee).Seconds()
}

// Report is a node's load for one backend, as calling nodes weigh it.
type Report struct {
	// RPS is the backend's answers per second on the node; Utilization
	// those over the node's weighted capacity (1: no ready replica).
	RPS, Utilization float64
	// InFlight, Waiting and KV are named metrics: the requests in flight,
	// the most waiting and the highest KV-cache use its servers report.
	InFlight    int
	Waiting, KV float64
}

// NodeReport is the node's report for a backend whose ready replicas are
// ready, at rps answers a second: its capacity is the sum over them of
// max_concurrent_queries over replicaSeconds of their time to first byte,
// a saturated one counting for SaturatedShare (typical: as for Choose).
func NodeReport(ready []Replica, l Limits, known bool, rps float64, now time.Time, typical time.Duration) Report {
	out := Report{RPS: rps, Utilization: 1}
	capacity := 0.0
	for _, r := range ready {
		ttfb := r.TTFB
		if ttfb == 0 {
			ttfb = typical
		}
		share := 1.0
		if known && r.Saturated(l, now) {
			share = SaturatedShare
		}
		capacity += share * float64(max(l.MaxInFlight, 1)) / replicaSeconds(ttfb)
		out.InFlight += r.InFlight
		if r.Fresh(now) {
			out.Waiting, out.KV = math.Max(out.Waiting, r.Server.Waiting), math.Max(out.KV, r.Server.KV)
		}
	}
	if capacity > 0 {
		out.Utilization = math.Max(rps/capacity, minUtilization)
	}
	return out
}

// Header is the report in the ORCA text format Envoy reads
// (wire.LoadReportHeader).
func (r Report) Header() string {
	return fmt.Sprintf("TEXT application_utilization=%.6g,rps_fractional=%.6g,named_metrics.in_flight=%d,named_metrics.waiting=%.6g,named_metrics.kv_cache=%.6g",
		r.Utilization, r.RPS, r.InFlight, r.Waiting, r.KV)
}
