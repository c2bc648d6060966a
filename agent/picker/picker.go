package picker

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/servemesh/servemesh/meshspec"
)

// Picker is the node's endpoint picker for load-aware backends (the
// Gateway API Inference Extension's endpoint picker, on every node): the
// node's inbound listener asks it, per request, which of the node's
// replicas of the backend takes it (server.go serves Envoy's
// ext_proc protocol for that). Every request to a replica crosses its
// node's inbound listener, so the picker's count of each replica's
// requests in flight is exact, whichever node sent them.
//
// A replica's cost is Linkerd's peak-EWMA: its smoothed time to first byte
// times its requests pending plus one, where pending is what the node has
// in flight to it or, if the server's metrics say more (its running and
// waiting requests), that; a full KV cache doubles it. The cheapest
// replica that is not saturated takes the request. A replica is saturated
// when its requests in flight reach max_concurrent_queries (Envoy queues
// the rest), its server's queue reaches queue_limit, or its KV cache
// kv_cache_limit. When every ready replica is saturated, a sheddable
// request is refused (429) and a critical one goes to the cheapest.
//
// For the calling nodes, which pick a node before this picks a replica,
// the picker adds an ORCA load report to each answer (Report): requests
// per second, and utilization: those over the node's weighted capacity,
// the sum over its replicas of max_concurrent_queries over their smoothed
// time to first byte, squared (bounded: see reportKnee). Client-side
// weighted round robin weighs
// nodes by rps/utilization, that capacity: a node's requests a second,
// discounted once more by how long they take, so that answers come from
// the faster nodes while they have room (by throughput alone, a node whose
// one replica is three times slower would still get a seventh of the
// requests beside two fast ones: with the discount, a nineteenth); as the
// fast ones fill, their time to first byte grows and the weights move
// back.
type Picker struct {
	desired func() *meshspec.Model
	now     func() time.Time

	mu       sync.Mutex
	replicas map[string]*replicaLoad // by tag
	rates    map[string]*rate        // completions, by backend
}

// replicaLoad is what the picker knows of one replica.
type replicaLoad struct {
	tag, backend, addr string
	ready              bool
	inFlight           int
	ttfb               time.Duration // smoothed; 0: none yet
	server             serverLoad
}

// serverLoad is what a replica's server last said of its load (its
// metrics), and when.
type serverLoad struct {
	at                     time.Time
	waiting, running, kv   float64
	hasWaiting, hasRunning bool
	hasKV                  bool
}

// ttfbWeight is how much each new time to first byte moves the smoothed
// one.
const ttfbWeight = 0.3

// serverLoadStale is how old a server's figures may be and still count.
const serverLoadStale = 2 * time.Second

// New returns a picker for the backends of desired (nil: none yet).
func New(desired func() *meshspec.Model) *Picker {
	return &Picker{desired: desired, now: time.Now, replicas: map[string]*replicaLoad{}, rates: map[string]*rate{}}
}

// Track starts following a replica the agent runs, not ready yet.
func (p *Picker) Track(tag, backend, addr string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replicas[tag] = &replicaLoad{tag: tag, backend: backend, addr: addr}
}

// SetReady says whether the replica may take new requests.
func (p *Picker) SetReady(tag string, ready bool) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.replicas[tag]; ok {
		r.ready = ready
	}
}

// Forget stops following a replica.
func (p *Picker) Forget(tag string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.replicas, tag)
}

// choice is a pick: the replica (nil: none, Envoy picks) or that the
// request is shed.
type choice struct {
	replica *replicaLoad
	shed    bool
}

// pick chooses the replica of backend that takes a request, and counts it
// in flight there until done.
func (p *Picker) pick(backend string, sheddable bool) choice {
	cfg, ok := p.backendConfig(backend)
	p.mu.Lock()
	defer p.mu.Unlock()
	var best *replicaLoad
	bestCost, bestFree := math.Inf(1), false
	now, typical := p.now(), p.typicalTTFB(backend)
	for _, r := range p.sorted(backend) {
		if !r.ready {
			continue
		}
		free := !ok || !r.saturated(cfg, now)
		cost := r.cost(now, typical)
		if best == nil || (free && !bestFree) || (free == bestFree && cost < bestCost) {
			best, bestCost, bestFree = r, cost, free
		}
	}
	switch {
	case best == nil:
		return choice{}
	case !bestFree && sheddable:
		return choice{shed: true}
	}
	best.inFlight++
	return choice{replica: best}
}

// done ends a request picked for r: its time to first byte (0: it got
// none) joins r's smoothed one.
func (p *Picker) done(r *replicaLoad, ttfb time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r.inFlight--
	if ttfb <= 0 {
		return
	}
	if r.ttfb == 0 {
		r.ttfb = ttfb
	} else {
		r.ttfb = time.Duration(ttfbWeight*float64(ttfb) + (1-ttfbWeight)*float64(r.ttfb))
	}
	p.rate(r.backend).add(p.now())
}

// sorted are backend's replicas by tag (for a stable choice among equals).
func (p *Picker) sorted(backend string) []*replicaLoad {
	var out []*replicaLoad
	for _, r := range p.replicas {
		if r.backend == backend {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].tag < out[j].tag })
	return out
}

// typicalTTFB stands in for the time to first byte of a replica that has
// answered nothing yet: the fastest of its backend's, so it is tried soon.
func (p *Picker) typicalTTFB(backend string) time.Duration {
	var best time.Duration
	for _, r := range p.replicas {
		if r.backend == backend && r.ttfb > 0 && (best == 0 || r.ttfb < best) {
			best = r.ttfb
		}
	}
	if best == 0 {
		return time.Millisecond
	}
	return best
}

// backendConfig is backend's load-aware setting and concurrency, if the
// desired state has it.
func (p *Picker) backendConfig(backend string) (loadConfig, bool) {
	m := p.desired()
	if m == nil {
		return loadConfig{}, false
	}
	b, ok := m.Backend(backend)
	if !ok {
		return loadConfig{}, false
	}
	cfg := loadConfig{maxInFlight: b.Config.EffectiveMaxConcurrentQueries()}
	if b.Config.LoadAware != nil {
		cfg.LoadAware = *b.Config.LoadAware
	}
	return cfg, true
}

// loadConfig is what saturates a backend's replicas.
type loadConfig struct {
	meshspec.LoadAware
	maxInFlight int
}

// saturated reports whether r may take no more requests without waiting.
func (r *replicaLoad) saturated(cfg loadConfig, now time.Time) bool {
	if r.inFlight >= cfg.maxInFlight {
		return true
	}
	s, fresh := r.server, now.Sub(r.server.at) < serverLoadStale
	return fresh && ((cfg.QueueLimit > 0 && s.hasWaiting && s.waiting >= float64(cfg.QueueLimit)) ||
		(cfg.KVCacheMetric != "" && s.hasKV && s.kv >= cfg.EffectiveKVCacheLimit()))
}

// cost is r's expected time to answer one more request (peak-EWMA).
func (r *replicaLoad) cost(now time.Time, typical time.Duration) float64 {
	pending := float64(r.inFlight)
	kv := 0.0
	if s := r.server; now.Sub(s.at) < serverLoadStale {
		if s.hasWaiting || s.hasRunning {
			pending = math.Max(pending, s.waiting+s.running)
		}
		if s.hasKV {
			kv = math.Min(math.Max(s.kv, 0), 1)
		}
	}
	ttfb := r.ttfb
	if ttfb == 0 {
		ttfb = typical
	}
	return (pending + 1) * ttfb.Seconds() * (1 + kv)
}

// Report is the node's ORCA load report for backend, in the header
// format Envoy reads (wire.LoadReportHeader): its requests per second and
// its utilization, those over its weighted capacity (see Picker); and, as
// named metrics, the requests in flight and, where servers report them,
// the most waiting and the highest KV-cache use. A saturated replica
// counts for a tenth of its capacity (saturatedShare), so callers send
// a node whose every replica is saturated a tenth of its share, not none:
// its answers keep its report fresh.
func (p *Picker) Report(backend string) string {
	cfg, known := p.backendConfig(backend)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	rps := p.rate(backend).perSecond(now)
	capacity, inFlight, waiting, kv := 0.0, 0, 0.0, 0.0
	typical := p.typicalTTFB(backend)
	for _, r := range p.sorted(backend) {
		if !r.ready {
			continue
		}
		ttfb := r.ttfb
		if ttfb == 0 {
			ttfb = typical
		}
		share := 1.0
		if known && r.saturated(cfg, now) {
			share = saturatedShare
		}
		capacity += share * float64(max(cfg.maxInFlight, 1)) / replicaSeconds(ttfb)
		inFlight += r.inFlight
		if now.Sub(r.server.at) < serverLoadStale {
			waiting, kv = math.Max(waiting, r.server.waiting), math.Max(kv, r.server.kv)
		}
	}
	utilization := 1.0 // no ready replica: full
	if capacity > 0 {
		utilization = math.Max(rps/capacity, minUtilization)
	}
	return fmt.Sprintf("TEXT application_utilization=%.6g,rps_fractional=%.6g,named_metrics.in_flight=%d,named_metrics.waiting=%.6g,named_metrics.kv_cache=%.6g",
		utilization, rps, inFlight, waiting, kv)
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

// replicaSeconds is the denominator of a replica's capacity in its node's
// report: its time to first byte times the larger of it and reportKnee,
// in seconds squared.
func replicaSeconds(ttfb time.Duration) float64 {
	ttfb = max(ttfb, reportFloor)
	return ttfb.Seconds() * max(ttfb, reportKnee).Seconds()
}

// saturatedShare is the share of its capacity a saturated replica counts
// for in its node's load report.
const saturatedShare = 0.1

// minUtilization keeps a report valid (Envoy ignores a utilization of 0).
const minUtilization = 1e-6

func (p *Picker) rate(backend string) *rate {
	r, ok := p.rates[backend]
	if !ok {
		r = &rate{}
		p.rates[backend] = r
	}
	return r
}

// rate counts events over the last rateBuckets × rateBucket.
type rate struct {
	counts [rateBuckets]int
	starts [rateBuckets]time.Time
}

const (
	rateBuckets = 8
	rateBucket  = 250 * time.Millisecond
)

func (r *rate) bucket(now time.Time) int {
	start := now.Truncate(rateBucket)
	i := int(start.UnixNano()/int64(rateBucket)) % rateBuckets
	if !r.starts[i].Equal(start) {
		r.starts[i], r.counts[i] = start, 0
	}
	return i
}

func (r *rate) add(now time.Time) { r.counts[r.bucket(now)]++ }

// perSecond is the rate over the window's full buckets and the current
// one's elapsed part.
func (r *rate) perSecond(now time.Time) float64 {
	r.bucket(now)
	n, oldest := 0, now.Add(-rateBuckets*rateBucket)
	for i, c := range r.counts {
		if r.starts[i].After(oldest) {
			n += c
		}
	}
	window := now.Sub(now.Truncate(rateBucket)) + (rateBuckets-1)*rateBucket
	return float64(n) / window.Seconds()
}
