package picker

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/agent/picker/placement"
	"github.com/servemesh/servemesh/agent/picker/prefix"
	"github.com/servemesh/servemesh/agent/picker/scoring"
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
// request (priority below 0) is refused (429); the others go to the
// cheapest with requests in flight under max_concurrent_queries (its
// server queues them, as before the picker) or, when every one has that
// many in flight, wait on the node for one, by priority, tenants taking
// turns (flow.go).
//
// For the calling nodes, which pick a node before this picks a replica,
// the picker adds an ORCA load report to each answer (Report): requests
// per second, and utilization: those over the node's weighted capacity,
// the sum over its replicas of max_concurrent_queries over their smoothed
// time to first byte, squared (bounded: see scoring.NodeReport). Client-side
// weighted round robin weighs
// nodes by rps/utilization, that capacity: a node's requests a second,
// discounted once more by how long they take, so that answers come from
// the faster nodes while they have room (by throughput alone, a node whose
// one replica is three times slower would still get a seventh of the
// requests beside two fast ones: with the discount, a nineteenth); as the
// fast ones fill, their time to first byte grows and the weights move
// back.
type Picker struct {
	desired func() *nodeview.View
	now     func() time.Time

	mu       sync.Mutex
	replicas map[string]*replicaLoad // by tag
	rates    map[string]*rate        // completions, by backend
	sessions *sessions               // conversations' replicas
	queues   map[string]*flowQueue   // requests waiting, by backend
	// placements are, for the backends this node calls with prompt
	// affinity, which of their nodes each affinity key goes to.
	placements map[string]*placement.Table
	// spreads are, for the backends with replicas here, which replica
	// each prompt's prefix went to (its first AffinityBlocks blocks).
	spreads map[string]*placement.Table
	// restored are the replicas' indexes and models a checkpoint held,
	// by tag, until the agent adopts them (Resume); changes counts the
	// changes of what a checkpoint holds (checkpoint.go).
	restored map[string]savedReplica
	changes  uint64
}

// replicaLoad is what the picker knows of one replica: which it is, and
// the figures its policy (scoring) reads.
type replicaLoad struct {
	tag, backend, addr string
	ready              bool
	scoring.Replica
	// cache is the prompts' blocks the picker sent it lately: its prefix
	// cache, as far as the picker can tell, bounded by what the backend
	// sets or the server reports it holds (reportedCacheTokens, 0: none;
	// cacheBlocks); models, the models it sent it.
	cache               *prefix.Index
	reportedCacheTokens int
	models              *models
	// prefillSpec is the backend's spec (specKey) its PrefillRate was
	// measured under.
	prefillSpec uint64
}

// cacheBlocks is how many blocks r's prefix cache holds: the tokens its
// backend sets (configured), else those its server reports, else
// prefix.DefaultIndexBlocks.
func (r *replicaLoad) cacheBlocks(configured int) int {
	switch {
	case configured > 0:
		return prefix.BlocksOfTokens(configured)
	case r.reportedCacheTokens > 0:
		return prefix.BlocksOfTokens(r.reportedCacheTokens)
	}
	return prefix.DefaultIndexBlocks
}

// New returns a picker for the backends of desired, the node's view of the
// latest desired state (nil: none yet).
func New(desired func() *nodeview.View) *Picker {
	return &Picker{desired: desired, now: time.Now, replicas: map[string]*replicaLoad{}, rates: map[string]*rate{}, sessions: newSessions(), queues: map[string]*flowQueue{}, placements: map[string]*placement.Table{}, spreads: map[string]*placement.Table{}}
}

// Track starts following a replica the agent runs, not ready yet.
func (p *Picker) Track(tag, backend, addr string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replicas[tag] = &replicaLoad{tag: tag, backend: backend, addr: addr, cache: prefix.NewIndex(prefix.DefaultIndexBlocks), models: newModels()}
	p.changed()
}

// SetReady says whether the replica may take new requests.
func (p *Picker) SetReady(tag string, ready bool) {
	if p == nil {
		return
	}
	p.mu.Lock()
	r, ok := p.replicas[tag]
	if ok {
		r.ready = ready
	}
	p.mu.Unlock()
	if ok && ready {
		p.Dispatch(r.backend)
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
	p.changed()
}

// choice is a pick: the replica (nil: none, Envoy picks) or that the
// request is shed; why it was picked or shed (for its answer, and its
// span); whether the replica is expected to load the request's model for
// it.
type choice struct {
	replica *replicaLoad
	shed    bool
	// unservable: no replica the request may go to (its subset hint) is
	// ready: answered 503.
	unservable bool
	why        string
	loadsModel bool
	// pass is the request's way through the policy's pipeline.
	pass scoring.Pass
	// prompted: the request's prompt was read; prefixHit is how much of
	// it the replica was expected to hold.
	prompted  bool
	prefixHit float64
	// tokens are its uncached prompt tokens, queued on the replica until
	// its first byte; cold: the replica had nothing in flight, so its
	// time to first byte measures the replica's prefill rate.
	tokens int
	cold   bool
}

// Why a request was shed.
const (
	shedSaturated = "saturated"  // sheddable, every replica saturated
	shedQueueFull = "queue full" // no room to wait, others' priority higher
	shedTimedOut  = "timed out"  // waited its queue timeout
	shedLate      = "late"       // its deadline cannot be met (refuse_late)
)

// Why a replica was picked, or none.
const (
	pickedSession = "its conversation's replica"
	pickedHome    = "its prompt's home"
	pickedModel   = "the replica holding its model"
	pickedFree    = "the cheapest free replica"
	pickedRoom    = "every replica saturated: the cheapest with room in its queue"
	pickedNone    = "no ready replica here: Envoy's own choice"
	// pickedNoneInSubset: none of those the request's subset hint names.
	pickedNoneInSubset = "no ready replica of those the subset hint names"
)

// request is what the picker reads of a request: its priority (below 0:
// sheddable) and tenant, its prompt's blocks (prefix.Blocks; none: no
// prompt read), its conversation ("": none) and its model.
type request struct {
	priority int
	tenant   string
	blocks   []uint64
	session  string
	model    string // "": none, or its replicas do not multiplex models
	// deadline is when its first token is due (wire.TTFTObjectiveHeader);
	// zero: none.
	deadline time.Time
	// subset are the replicas (IP:port) it may go to, as the Endpoint
	// Picker Protocol's subset hint names them; nil: any.
	subset map[string]bool
}

// pick chooses the replica of backend that takes a request (place), if one
// is free and no request waits before it. Otherwise a request of priority
// 0 or more waits for one (the waiter returned: wait for it), and one
// below is shed.
func (p *Picker) pick(backend string, req request) (choice, *waiter) {
	pol, flow := p.backendSettings(backend)
	p.mu.Lock()
	defer p.mu.Unlock()
	if pol.refuseLate && p.late(backend, req) {
		return choice{shed: true, why: shedLate}, nil
	}
	q := p.queue(backend)
	if q.len() == 0 {
		if c, ok := p.place(backend, req, pol); ok {
			return c, nil
		}
	}
	if req.priority < 0 {
		return choice{shed: true, why: shedSaturated}, nil
	}
	w := &waiter{req: req, backend: backend, picked: make(chan choice, 1)}
	if q.len() >= flow.EffectiveMaxQueued() {
		v := q.victim(w)
		if v == nil {
			return choice{shed: true, why: shedQueueFull}, nil
		}
		q.remove(v)
		v.picked <- choice{shed: true, why: shedQueueFull}
	}
	q.push(w)
	return choice{}, w
}

// place picks the replica of backend that takes req if one is free, or,
// for a request of priority 0 or more, has room in its queue: one pass
// through the policy's pipeline (scoring.Run) over the ready replicas,
// given the conversation's replica, how much of the prompt each is
// expected to hold (expectPrompt), what the request's model costs each,
// and the prompt's home (placement.Table). It counts the request in
// flight on the replica picked until done; the replica is then expected to
// hold the prompt, its model and the conversation, and the prompt's key
// goes there. With no ready replica, the choice is none (Envoy picks); with
// none picked, the request waits or is shed (false). Called with mu held.
func (p *Picker) place(backend string, req request, pol policy) (choice, bool) {
	ready, loads := p.ready(backend)
	if req.subset != nil {
		ready, loads = within(ready, loads, req.subset)
		if len(ready) == 0 {
			return choice{unservable: true, why: pickedNoneInSubset}, true
		}
	}
	if len(ready) == 0 {
		return choice{why: pickedNone}, true
	}
	now := p.now()
	ask := scoring.Ask{Priority: req.priority, Model: req.model != "" && pol.limits.MaxModels > 0, Limits: pol.limits,
		Known: pol.known, Now: now, Typical: p.typicalTTFB(backend), Weights: pol.weights}
	p.expectPrompt(req.blocks, ready, loads, pol.limits.CacheTokens)
	sessionTag := ""
	if req.session != "" {
		sessionTag = p.sessions.replica(backend, req.session)
	}
	cands := make([]scoring.Candidate, len(ready))
	tokens, typicalRate := len(req.blocks)*prefix.TokensPerBlock, 0.0
	if pol.limits.TTFTBudget > 0 {
		typicalRate = p.typicalPrefillRate(backend) // only token load reads rates
	}
	for i, r := range ready {
		cands[i] = scoring.Candidate{Replica: loads[i], Session: sessionTag != "" && r.tag == sessionTag,
			Tokens: int(math.Round(float64(tokens) * (1 - loads[i].PrefixHit)))}
		if cands[i].PrefillRate == 0 {
			cands[i].PrefillRate = typicalRate
		}
		if ask.Model {
			cands[i].ModelMiss = r.models.miss(req.model, pol.limits.MaxModels)
		}
	}
	key, keyed := affinityKey(req.blocks)
	if keyed {
		spread, nodes := p.spread(backend), replicaNodes(ready)
		home := spread.Home(key, nodes, now)
		ask.Keyed, ask.Placed = true, spread.Placed(key, nodes)
		for i, r := range ready {
			cands[i].Home = r.tag == home
		}
	}
	pass := scoring.Run(cands, ask)
	if pass.Picked < 0 {
		return choice{pass: pass}, false
	}
	r, picked := ready[pass.Picked], cands[pass.Picked]
	p.changed()
	c := choice{replica: r, pass: pass, prompted: len(req.blocks) > 0, prefixHit: picked.PrefixHit,
		tokens: picked.Tokens, cold: r.InFlight == 0}
	r.InFlight++
	r.QueuedTokens += picked.Tokens
	r.cache.Add(req.blocks)
	if req.session != "" {
		p.sessions.served(backend, req.session, r.tag)
	}
	if pass.Why == scoring.WhySession {
		c.why = pickedSession
		return c, true
	}
	if keyed {
		p.spread(backend).Assign(key, r.tag, now)
	}
	if ask.Model {
		r.models.use(req.model, pol.limits.MaxModels)
	}
	c.why, c.loadsModel = pickedWhy[pass.Why], picked.ModelMiss > 0
	return c, true
}

// pickedWhy is what each of the pipeline's reasons reads as in an answer
// and a span.
var pickedWhy = map[string]string{scoring.WhySession: pickedSession, scoring.WhyModel: pickedModel,
	scoring.WhyHome: pickedHome, scoring.WhyFree: pickedFree, scoring.WhyRoom: pickedRoom}

// expectPrompt sets how much of a prompt of blocks each ready replica is
// expected to hold (loads' PrefixHit): what the picker sent it lately
// that its cache holds (cacheBlocks, of the tokens the backend sets:
// configured).
func (p *Picker) expectPrompt(blocks []uint64, ready []*replicaLoad, loads []scoring.Replica, configured int) {
	if len(blocks) == 0 {
		return
	}
	for i, r := range ready {
		if c := r.cacheBlocks(configured); c != r.cache.Capacity() {
			r.cache.Resize(c)
		}
		loads[i].PrefixHit = float64(r.cache.Match(blocks)) / float64(len(blocks))
	}
}

// ready are backend's ready replicas by tag (for a stable choice among
// equals), and their figures.
// within are those of ready (and their loads) in subset.
func within(ready []*replicaLoad, loads []scoring.Replica, subset map[string]bool) ([]*replicaLoad, []scoring.Replica) {
	var in []*replicaLoad
	var inLoads []scoring.Replica
	for i, r := range ready {
		if subset[r.addr] {
			in, inLoads = append(in, r), append(inLoads, loads[i])
		}
	}
	return in, inLoads
}

func (p *Picker) ready(backend string) ([]*replicaLoad, []scoring.Replica) {
	var out []*replicaLoad
	var loads []scoring.Replica
	for _, r := range p.sorted(backend) {
		if r.ready {
			out, loads = append(out, r), append(loads, r.Replica)
		}
	}
	return out, loads
}

// done ends a request picked (c), answered with status (0: no answer)
// after ttfb. A 5xx answer counts as a slow one (scoring.FailedTTFB): one
// that failed at once is no sign of a fast replica, and a replica whose
// server fails every request at once would otherwise take ever more of
// them. Another answer's time to first byte joins the replica's smoothed
// one, unless the replica had to load its model first (the load's time is
// ModelMiss's to price: counted as the replica's pace, it would push the
// model's next requests to one that must drop another model for it).
func (p *Picker) done(c choice, ttfb time.Duration, status int) {
	r := c.replica
	pol, _ := p.backendSettings(r.backend)
	p.mu.Lock()
	defer p.mu.Unlock()
	r.InFlight--
	r.QueuedTokens = max(r.QueuedTokens-c.tokens, 0)
	if c.cold && status > 0 && status < 500 && !c.loadsModel {
		p.measurePrefill(r, c.tokens, ttfb)
	}
	if ttfb > 0 {
		switch {
		case status >= 500:
			r.Failures++
			r.TTFB = scoring.Smooth(r.TTFB, scoring.FailedTTFB(r.Replica, p.typicalTTFB(r.backend)))
		case !c.loadsModel:
			r.Failures = 0
			r.TTFB = scoring.Smooth(r.TTFB, ttfb)
		default:
			r.Failures = 0
		}
		p.rate(r.backend).add(p.now())
	}
	p.dispatch(r.backend, pol)
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

// typicalTTFB is scoring.Typical of every replica of backend here, ready
// or not.
func (p *Picker) typicalTTFB(backend string) time.Duration {
	var all []scoring.Replica
	for _, r := range p.replicas {
		if r.backend == backend {
			all = append(all, r.Replica)
		}
	}
	return scoring.Typical(all)
}

// policy is what the pipeline reads of a backend's settings: what
// saturates its replicas, its scorers' weights, and whether the desired
// state has the backend (known; else nothing saturates them).
type policy struct {
	limits  scoring.Limits
	weights scoring.Weights
	known   bool
	// refuseLate: a request that cannot meet its deadline is refused
	// (load_aware.refuse_late).
	refuseLate bool
}

// backendSettings are backend's policy and its load_aware settings (zero
// without), from one lookup of the desired state.
func (p *Picker) backendSettings(backend string) (policy, meshspec.LoadAware) {
	b, ok := p.desired().Backend(backend)
	if !ok {
		return policy{}, meshspec.LoadAware{}
	}
	pol, flow := policy{limits: scoring.Limits{MaxInFlight: b.Config.EffectiveMaxConcurrentQueries()}, known: true}, meshspec.LoadAware{}
	if la := b.Config.LoadAware; la != nil {
		flow = *la
		pol.weights, pol.refuseLate = la.Weights, la.RefuseLate
		pol.limits.MaxModels = la.MaxModelsPerReplica
		pol.limits.CacheTokens = la.PrefixCacheTokens
		pol.limits.QueueLimit = la.QueueLimit
		pol.limits.TTFTBudget = time.Duration(la.TTFTBudgetMs) * time.Millisecond
		if la.KVCacheMetric != "" {
			pol.limits.KVCacheLimit = la.EffectiveKVCacheLimit()
		}
	}
	return pol, flow
}

// Report is the node's ORCA load report for backend, in the header
// format Envoy reads (wire.LoadReportHeader): its requests per second and
// its utilization, those over its weighted capacity (see Picker); and, as
// named metrics, the requests in flight and, where servers report them,
// the most waiting and the highest KV-cache use. A saturated replica
// counts for a tenth of its capacity (scoring.SaturatedShare), so callers send
// a node whose every replica is saturated a tenth of its share, not none:
// its answers keep its report fresh.
func (p *Picker) Report(backend string) string {
	pol, _ := p.backendSettings(backend)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	_, loads := p.ready(backend)
	return scoring.NodeReport(loads, pol.limits, pol.known, p.rate(backend).perSecond(now), now, p.typicalTTFB(backend)).Header()
}

func (p *Picker) rate(backend string) *rate {
	return entryOf(p.rates, backend, func() *rate { return &rate{} })
}

// entryOf is m's entry for key, made by newT when it has none.
func entryOf[T any](m map[string]*T, key string, newT func() *T) *T {
	v, ok := m[key]
	if !ok {
		v = newT()
		m[key] = v
	}
	return v
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
