package picker

import (
	"slices"
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
}

// choice is a pick: the replica (nil: none, Envoy picks) or that the
// request is shed; why it was picked or shed (for its answer, and its
// span); whether the replica is expected to load the request's model for
// it.
type choice struct {
	replica    *replicaLoad
	shed       bool
	why        string
	loadsModel bool
}

// Why a request was shed.
const (
	shedSaturated = "saturated"  // sheddable, every replica saturated
	shedQueueFull = "queue full" // no room to wait, others' priority higher
	shedTimedOut  = "timed out"  // waited its queue timeout
)

// Why a replica was picked, or none.
const (
	pickedSession = "its conversation's replica"
	pickedHome    = "its prompt's home"
	pickedModel   = "the replica holding its model"
	pickedFree    = "the cheapest free replica"
	pickedRoom    = "every replica saturated: the cheapest with room in its queue"
	pickedNone    = "no ready replica here: Envoy's own choice"
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
}

// pick chooses the replica of backend that takes a request (place), if one
// is free and no request waits before it. Otherwise a request of priority
// 0 or more waits for one (the waiter returned: wait for it), and one
// below is shed.
func (p *Picker) pick(backend string, req request) (choice, *waiter) {
	limits, flow, known := p.backendSettings(backend)
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.queue(backend)
	if q.len() == 0 {
		if c, ok := p.place(backend, req, limits, known); ok {
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

// place picks the replica of backend that takes req if one is free: the
// one that served its conversation while that one is ready and not
// saturated, else the policy's choice (scoring.ChooseFree) given how much
// of the prompt each replica is expected to hold, kept on a replica
// holding the request's model (scoring.ModelHolder) or on its prompt's
// home; with every replica
// saturated, a request of priority 0 or more still goes to the cheapest
// whose requests in flight are under max_concurrent_queries
// (scoring.ChooseWithRoom: its server queues it). It counts the request
// in flight there until done; the replica is then expected to hold the
// prompt, and the conversation. With no ready replica, the choice is
// none (Envoy picks). Called with mu held.
func (p *Picker) place(backend string, req request, limits scoring.Limits, known bool) (choice, bool) {
	ready, loads := p.ready(backend)
	if len(ready) == 0 {
		return choice{why: pickedNone}, true
	}
	if c, ok := p.sessionReplica(backend, req, ready, limits, known); ok {
		return c, true
	}
	now, typical := p.now(), p.typicalTTFB(backend)
	p.expectPrompt(req.blocks, ready, loads, limits.CacheTokens)
	if req.model != "" && limits.MaxModels > 0 {
		for i, r := range ready {
			loads[i].ModelMiss = r.models.miss(req.model, limits.MaxModels)
		}
	}
	i, why := scoring.ChooseFree(loads, limits, known, now, typical), pickedFree
	if req.model != "" && limits.MaxModels > 0 && i >= 0 {
		if j := scoring.ModelHolder(loads, i, limits, known, now); j >= 0 && j != i {
			i, why = j, pickedModel
		}
	}
	key, keyed := affinityKey(req.blocks)
	if keyed && i >= 0 && why != pickedModel {
		if home := p.promptHome(backend, key, ready, loads, i, limits, known, now); home != i {
			i, why = home, pickedHome
		}
	}
	if i < 0 && req.priority >= 0 {
		i, why = scoring.ChooseWithRoom(loads, limits, now, typical), pickedRoom
	}
	if i < 0 {
		return choice{}, false
	}
	if keyed {
		p.spread(backend).Assign(key, ready[i].tag, now)
	}
	ready[i].InFlight++
	ready[i].cache.Add(req.blocks)
	loadsModel := loads[i].ModelMiss > 0
	if req.model != "" && limits.MaxModels > 0 {
		ready[i].models.use(req.model, limits.MaxModels)
	}
	if req.session != "" {
		p.sessions.served(backend, req.session, ready[i].tag)
	}
	return choice{replica: ready[i], why: why, loadsModel: loadsModel}, true
}

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

// promptHome is the replica that takes a prompt of key, the cheapest
// being ready[cheapest]: its home (placement.Table: where its requests
// went, or for a prompt new here its place among the replicas, as many
// prompts on each; or a replica that holds more of it, holder), if
// ready, not saturated and not too busy (scoring.KeepsHome); else the
// cheapest. A prompt new here has nothing
// cached at its place, so that place takes it only while no busier than
// the cheapest. Called with mu held.
func (p *Picker) promptHome(backend, key string, ready []*replicaLoad, loads []scoring.Replica, cheapest int, limits scoring.Limits, known bool, now time.Time) int {
	spread, replicas := p.spread(backend), replicaNodes(ready)
	home := spread.Home(key, replicas, now)
	j := holder(loads, slices.IndexFunc(ready, func(r *replicaLoad) bool { return r.tag == home }))
	if j < 0 || (known && loads[j].Saturated(limits, now)) || loads[j].Failing() || !scoring.KeepsHome(loads[j], loads[cheapest], now) {
		return cheapest
	}
	if !spread.Placed(key, replicas) && loads[j].Pending(now) > loads[cheapest].Pending(now) {
		return cheapest
	}
	return j
}

// holder is which of ready (their loads) is a prompt's home, its place
// among them being home (-1: none ready): the one expected to hold most of
// the prompt, if it holds more than home does (the home's cache let it go
// for others', or a conversation's later turns went elsewhere); else home.
func holder(loads []scoring.Replica, home int) int {
	best, most := home, 0.0
	if home >= 0 {
		most = loads[home].PrefixHit
	}
	for i, l := range loads {
		if l.PrefixHit > most {
			best, most = i, l.PrefixHit
		}
	}
	return best
}

// sessionReplica is the pick of the replica that served req's
// conversation, if it is among ready and not saturated. Called with mu
// held.
func (p *Picker) sessionReplica(backend string, req request, ready []*replicaLoad, limits scoring.Limits, known bool) (choice, bool) {
	if req.session == "" {
		return choice{}, false
	}
	tag := p.sessions.replica(backend, req.session)
	for _, r := range ready {
		if r.tag == tag && (!known || !r.Saturated(limits, p.now())) && !r.Failing() {
			r.InFlight++
			r.cache.Add(req.blocks)
			p.sessions.served(backend, req.session, tag)
			return choice{replica: r, why: pickedSession}, true
		}
	}
	return choice{}, false
}

// ready are backend's ready replicas by tag (for a stable choice among
// equals), and their figures.
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
	limits, known := p.backendLimits(r.backend)
	p.mu.Lock()
	defer p.mu.Unlock()
	r.InFlight--
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
	p.dispatch(r.backend, limits, known)
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

// backendLimits are what saturate backend's replicas, if the desired state
// has the backend.
func (p *Picker) backendLimits(backend string) (scoring.Limits, bool) {
	l, _, ok := p.backendSettings(backend)
	return l, ok
}

// backendSettings are backend's limits (backendLimits) and its load_aware
// settings (zero without), from one lookup of the desired state.
func (p *Picker) backendSettings(backend string) (scoring.Limits, meshspec.LoadAware, bool) {
	b, ok := p.desired().Backend(backend)
	if !ok {
		return scoring.Limits{}, meshspec.LoadAware{}, false
	}
	l, flow := scoring.Limits{MaxInFlight: b.Config.EffectiveMaxConcurrentQueries()}, meshspec.LoadAware{}
	if la := b.Config.LoadAware; la != nil {
		flow = *la
		l.MaxModels = la.MaxModelsPerReplica
		l.CacheTokens = la.PrefixCacheTokens
		l.QueueLimit = la.QueueLimit
		if la.KVCacheMetric != "" {
			l.KVCacheLimit = la.EffectiveKVCacheLimit()
		}
	}
	return l, flow, true
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
	limits, known := p.backendLimits(backend)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	_, loads := p.ready(backend)
	return scoring.NodeReport(loads, limits, known, p.rate(backend).perSecond(now), now, p.typicalTTFB(backend)).Header()
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
