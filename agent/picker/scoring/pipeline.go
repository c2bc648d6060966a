package scoring

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// A request's pick is one pass through a pipeline, in the shape of the
// Gateway API Inference Extension's scheduler: filters keep the candidates
// the request may go to, scorers each give every candidate a weighted
// score, and a picker takes one. Here:
//
//  1. session (filter, preferred): the replica that served the request's
//     conversation, while it is neither saturated nor failing, takes it,
//     unless its queued prefill releases it (releaseTo).
//  2. free (filter, required): the replicas that are not saturated.
//  3. scorers: queue, ttfb, kv_cache, prefix, model and token_load
//     (Scorers), each a
//     factor of a candidate's cost (1 neutral, lower better), raised to
//     its weight and multiplied: a weighted sum of their logarithms. With
//     every weight 1 the cost is Linkerd's peak-EWMA (Replica.Cost).
//  4. sticky (picker): the cheapest, unless the request's affinity target
//     (the replica holding its model, else its prompt's home) is not
//     saturated nor failing, not too busy beside it (KeepsHome), and with
//     a TTFT budget, not past it in queued prefill (TokenSaturated: the
//     affinity is released to the free replica with no prefill queued that
//     would prefill the request soonest, and the pass records it).
//  5. room (filter, when no replica is free, for a request of priority 0
//     or more): those with requests in flight under
//     max_concurrent_queries; the cheapest takes it (its server queues
//     it). Otherwise the pass picks none: the picker's flow control has
//     the request wait, or sheds it.
//
// The pass is pure: agent/picker gathers what it knows of the request and
// each replica (Candidate, Ask), runs it, and does what the pick implies
// (counts the request in flight, learns where the prompt went). Pass
// records each step, for the request's span.

// Candidate is one ready replica of the backend, as a request's pass sees
// it: its figures, with PrefixHit and ModelMiss set for the request, and
// whether it served the request's conversation or is its prompt's home.
type Candidate struct {
	Replica
	// Session: it served the request's conversation.
	Session bool
	// Home: the request's prompt is placed on it (agent/picker/placement).
	Home bool
	// Tokens are the request's prompt tokens it is not expected to hold
	// in its prefix cache: what it would prefill.
	Tokens int
}

// Ask is what a pass knows of the request and its backend.
type Ask struct {
	// Priority below 0 is sheddable: such a request never takes a replica
	// that is not free.
	Priority int
	// Model: the request names a model the backend's replicas load on
	// demand (the candidates' ModelMiss is set).
	Model bool
	// Keyed: the request's prompt has an affinity key (a candidate may be
	// its Home); Placed: the key is placed already, not new here.
	Keyed, Placed bool
	// Limits saturate the replicas, when Known (the backend is in the
	// desired state).
	Limits Limits
	Known  bool
	// Now and Typical (Typical of the backend's replicas) price them.
	Now     time.Time
	Typical time.Duration
	// Weights are the backend's scorers' (load_aware.weights).
	Weights Weights
}

// Weights are the scorers' weights by name; a scorer not named weighs 1,
// one weighing 0 is left out.
type Weights map[string]float64

// Of is the weight of the scorer named name.
func (w Weights) Of(name string) float64 {
	if v, ok := w[name]; ok {
		return v
	}
	return 1
}

// Why a pass picked its candidate.
const (
	WhySession = "session" // the conversation's replica
	WhyModel   = "model"   // the replica holding the request's model
	WhyHome    = "home"    // the prompt's home
	WhyFree    = "free"    // the cheapest free replica
	WhyRoom    = "room"    // none free: the cheapest with room in its queue
)

// Step is what one step of a pass kept: how many candidates, or for the
// picker, which one.
type Step struct {
	Name string
	Kept int
}

// Pass is one request's way through the pipeline.
type Pass struct {
	Steps []Step
	// Costs are the candidates' weighted costs, by index (0: not scored).
	Costs []float64
	// Picked is the candidate picked (-1: none) and Why, why.
	Picked int
	Why    string
	// Released names the affinity target (WhySession, WhyModel, WhyHome)
	// that would have taken the request but for its queued prefill
	// (TokenSaturated); "": none.
	Released string
}

// String is the pass in one line, as the request's span records it:
// "ready 3 > free 2 > scored (queue ttfb kv_cache prefix model) > sticky
// r1 (home)".
func (p Pass) String() string {
	var b strings.Builder
	for i, s := range p.Steps {
		if i > 0 {
			b.WriteString(" > ")
		}
		fmt.Fprintf(&b, "%s %d", s.Name, s.Kept)
	}
	if p.Released != "" {
		fmt.Fprintf(&b, " > released %s", p.Released)
	}
	if p.Picked >= 0 {
		fmt.Fprintf(&b, " > picked %d (%s)", p.Picked, p.Why)
	} else {
		b.WriteString(" > none")
	}
	return b.String()
}

// Filter keeps the candidates a request may go to at one step of a pass.
type Filter interface {
	Name() string
	Keep(c Candidate, a Ask) bool
}

// sessionFilter keeps the replica that served the request's conversation while
// it is not saturated (with limits known) nor failing; Run then lets it
// release the request past its token budget (releaseTo).
type sessionFilter struct{}

func (sessionFilter) Name() string { return "session" }
func (sessionFilter) Keep(c Candidate, a Ask) bool {
	return c.Session && (!a.Known || !c.Saturated(a.Limits, a.Now)) && !c.Failing()
}

// freeFilter keeps the replicas that are not saturated; with no limits known
// (the backend is not in the desired state yet), every one.
type freeFilter struct{}

func (freeFilter) Name() string                 { return "free" }
func (freeFilter) Keep(c Candidate, a Ask) bool { return !a.Known || !c.Saturated(a.Limits, a.Now) }

// roomFilter keeps the replicas whose requests in flight, by the node's own
// count, are under max_concurrent_queries, though their servers' figures
// may saturate them: their servers queue the request, as without the
// picker.
type roomFilter struct{}

func (roomFilter) Name() string                 { return "room" }
func (roomFilter) Keep(c Candidate, a Ask) bool { return c.InFlight < a.Limits.MaxInFlight }

// Scorer is one factor of a candidate's cost: a multiplier, 1 neutral,
// lower better.
type Scorer interface {
	Name() string
	Factor(c Candidate, a Ask) float64
}

// queueScorer is its requests pending plus one (Replica.Pending).
type queueScorer struct{}

func (queueScorer) Name() string                      { return "queue" }
func (queueScorer) Factor(c Candidate, a Ask) float64 { return c.Pending(a.Now) + 1 }

// ttfbScorer is its smoothed time to first byte in seconds (the typical one if
// it has none yet).
type ttfbScorer struct{}

func (ttfbScorer) Name() string { return "ttfb" }
func (ttfbScorer) Factor(c Candidate, a Ask) float64 {
	ttfb := c.TTFB
	if ttfb == 0 {
		ttfb = a.Typical
	}
	return ttfb.Seconds()
}

// kvCacheScorer is one plus the share of its KV cache its server's fresh
// figures say is used: a full cache doubles its cost.
type kvCacheScorer struct{}

func (kvCacheScorer) Name() string { return "kv_cache" }
func (kvCacheScorer) Factor(c Candidate, a Ask) float64 {
	if s := c.Server; c.Fresh(a.Now) && s.HasKV {
		return 1 + math.Min(math.Max(s.KV, 0), 1)
	}
	return 1
}

// prefixScorer lowers the cost of a replica expected to hold the request's
// prompt in its prefix cache: a whole prompt held, by PrefixWeight.
type prefixScorer struct{}

func (prefixScorer) Name() string { return "prefix" }
func (prefixScorer) Factor(c Candidate, _ Ask) float64 {
	return 1 - PrefixWeight*math.Min(math.Max(c.PrefixHit, 0), 1)
}

// modelScorer raises the cost of a replica that must load the request's model:
// by ModelWeight for each ModelMiss.
type modelScorer struct{}

func (modelScorer) Name() string { return "model" }
func (modelScorer) Factor(c Candidate, _ Ask) float64 {
	return float64(1 + ModelWeight*max(c.ModelMiss, 0))
}

// Scorers are the pipeline's scorers, in the order their factors are
// multiplied.
var Scorers = []Scorer{queueScorer{}, ttfbScorer{}, kvCacheScorer{}, prefixScorer{}, modelScorer{}, tokenLoadScorer{}}

// ScorerNames are the names of Scorers, which load_aware.weights may
// weigh.
func ScorerNames() []string {
	out := make([]string, len(Scorers))
	for i, s := range Scorers {
		out[i] = s.Name()
	}
	return out
}

// Cost is c's cost for a: its scorers' factors, each raised to its weight,
// multiplied.
func Cost(c Candidate, a Ask) float64 {
	cost := 1.0
	for _, s := range Scorers {
		switch w := a.Weights.Of(s.Name()); w {
		case 0:
		case 1:
			cost *= s.Factor(c, a)
		default:
			cost *= math.Pow(s.Factor(c, a), w)
		}
	}
	return cost
}

// Run is one request's pass over cands, the backend's ready replicas in a
// stable order (among equals the first wins).
func Run(cands []Candidate, a Ask) Pass {
	p := Pass{Picked: -1, Costs: make([]float64, len(cands))}
	all := make([]int, len(cands))
	for i := range cands {
		all[i] = i
	}
	p.step("ready", all)
	free := keep(cands, all, a, freeFilter{})
	if kept := keep(cands, all, a, sessionFilter{}); len(kept) > 0 {
		to := releaseTo(cands, free, kept[0], a)
		if to < 0 {
			p.step(sessionFilter{}.Name(), kept)
			p.Picked, p.Why = kept[0], WhySession
			return p
		}
		p.step(freeFilter{}.Name(), free)
		p.cheapest(cands, free, a)
		p.Picked, p.Why, p.Released = to, WhyFree, WhySession
		return p
	}
	p.step(freeFilter{}.Name(), free)
	if len(free) > 0 {
		best := p.cheapest(cands, free, a)
		p.Picked, p.Why, p.Released = sticky(cands, all, free, best, a)
		return p
	}
	if a.Priority < 0 {
		return p
	}
	room := keep(cands, all, a, roomFilter{})
	p.step(roomFilter{}.Name(), room)
	if len(room) > 0 {
		p.Picked, p.Why = p.cheapest(cands, room, a), WhyRoom
	}
	return p
}

func (p *Pass) step(name string, kept []int) {
	p.Steps = append(p.Steps, Step{Name: name, Kept: len(kept)})
}

// keep are those of idx that f keeps.
func keep(cands []Candidate, idx []int, a Ask, f Filter) []int {
	var out []int
	for _, i := range idx {
		if f.Keep(cands[i], a) {
			out = append(out, i)
		}
	}
	return out
}

// cheapest scores idx and returns the cheapest, the first among equals.
func (p *Pass) cheapest(cands []Candidate, idx []int, a Ask) int {
	best := -1
	for _, i := range idx {
		p.Costs[i] = Cost(cands[i], a)
		if best < 0 || p.Costs[i] < p.Costs[best] {
			best = i
		}
	}
	return best
}

// sticky is the picker: the cheapest of the free candidates (best), unless
// the request's affinity target keeps it: the least busy free replica
// holding its model (not failing), else its prompt's home (holder), each
// while KeepsHome beside the cheapest and it does not release the
// request (releaseTo: then the request goes where that says). released
// names the target that would have kept it but for its queued prefill.
func sticky(cands []Candidate, all, free []int, best int, a Ask) (pick int, why, released string) {
	if a.Model && a.Limits.MaxModels > 0 {
		if j := modelHolder(cands, free, best, a); j >= 0 && j != best {
			to := releaseTo(cands, free, j, a)
			if to < 0 {
				return j, WhyModel, ""
			}
			return to, WhyFree, WhyModel
		}
	}
	if a.Keyed {
		if j := promptHome(cands, all, best, a); j != best {
			to := releaseTo(cands, free, j, a)
			if to < 0 {
				return j, WhyHome, ""
			}
			return to, WhyFree, WhyHome
		}
	}
	return best, WhyFree, ""
}

// releaseTo is where affinity target j lets the request go, -1 if it keeps
// it: j is past its budget (TokenSaturated), and of the other free
// candidates with no prefill queued (spare: a release takes a cold prefill,
// which a busy replica pays for with its own requests' time, and past
// the knee with everyone's) the one that would prefill the request
// soonest, if sooner than j (the tokens of the request it does not hold:
// a release that only waits longer elsewhere helps no one).
func releaseTo(cands []Candidate, free []int, j int, a Ask) int {
	if !TokenSaturated(cands[j], a) {
		return -1
	}
	to, wait := -1, cands[j].PrefillWait()
	for _, k := range free {
		if c := cands[k]; k != j && c.QueuedTokens == 0 && c.PrefillRate > 0 && c.PrefillWait() < wait {
			to, wait = k, c.PrefillWait()
		}
	}
	return to
}

// modelHolder is the least busy of the free candidates that hold the
// request's model (ModelMiss 0) and are not failing, while it KeepsHome
// beside the cheapest; -1 if none does. By requests pending, not the
// cost: a model's replica keeps it as a prompt's home keeps the prompt,
// since a time to first byte swings with an engine's other work, and a
// load costs more than any of those swings.
func modelHolder(cands []Candidate, free []int, cheapest int, a Ask) int {
	best := -1
	for _, i := range free {
		c := cands[i]
		if c.ModelMiss != 0 || c.Failing() {
			continue
		}
		if best < 0 || c.Pending(a.Now) < cands[best].Pending(a.Now) {
			best = i
		}
	}
	if best < 0 || !KeepsHome(cands[best].Replica, cands[cheapest].Replica, a.Now) {
		return -1
	}
	return best
}

// promptHome is the candidate that takes a prompt, the cheapest free one
// being cheapest: its home, or the one expected to hold more of it
// (holder), if not saturated nor failing and not too busy (KeepsHome);
// else the cheapest. A prompt new here has nothing cached at its place,
// so that place takes it only while no busier than the cheapest.
func promptHome(cands []Candidate, all []int, cheapest int, a Ask) int {
	home := -1
	for _, i := range all {
		if cands[i].Home {
			home = i
		}
	}
	j := holder(cands, home)
	if j < 0 || (a.Known && cands[j].Saturated(a.Limits, a.Now)) || cands[j].Failing() || !KeepsHome(cands[j].Replica, cands[cheapest].Replica, a.Now) {
		return cheapest
	}
	if !a.Placed && cands[j].Pending(a.Now) > cands[cheapest].Pending(a.Now) {
		return cheapest
	}
	return j
}

// holder is which candidate is a prompt's home, its place among them
// being home (-1: none): the one expected to hold most of the prompt, if
// it holds more than home does (the home's cache let it go for others',
// or a conversation's later turns went elsewhere); else home.
func holder(cands []Candidate, home int) int {
	best, most := home, 0.0
	if home >= 0 {
		most = cands[home].PrefixHit
	}
	for i, c := range cands {
		if c.PrefixHit > most {
			best, most = i, c.PrefixHit
		}
	}
	return best
}
