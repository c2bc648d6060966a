package scoring

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestFilters: each filter's cases.
func TestFilters(t *testing.T) {
	limits := Limits{MaxInFlight: 2, QueueLimit: 3, TTFTBudget: time.Second}
	full := Server{At: now, Waiting: 3, HasWaiting: true}
	for _, c := range []struct {
		name   string
		filter Filter
		cand   Candidate
		known  bool
		keep   bool
	}{
		{"session: the conversation's replica", sessionFilter{}, Candidate{Session: true}, true, true},
		{"session: another replica", sessionFilter{}, Candidate{}, true, false},
		{"session: saturated", sessionFilter{}, Candidate{Session: true, Replica: Replica{InFlight: 2}}, true, false},
		{"session: saturated, limits unknown", sessionFilter{}, Candidate{Session: true, Replica: Replica{InFlight: 2}}, false, true},
		{"session: failing", sessionFilter{}, Candidate{Session: true, Replica: Replica{Failures: FailingAfter}}, true, false},
		{"free: under every limit", freeFilter{}, Candidate{Replica: Replica{InFlight: 1}}, true, true},
		{"free: max_concurrent_queries in flight", freeFilter{}, Candidate{Replica: Replica{InFlight: 2}}, true, false},
		{"free: its server's queue full", freeFilter{}, Candidate{Replica: Replica{Server: full}}, true, false},
		{"free: limits unknown", freeFilter{}, Candidate{Replica: Replica{InFlight: 9}}, false, true},
		{"room: its server's queue full, the count under the limit", roomFilter{}, Candidate{Replica: Replica{InFlight: 1, Server: full}}, true, true},
		{"room: the count at the limit", roomFilter{}, Candidate{Replica: Replica{InFlight: 2}}, true, false},
	} {
		if got := c.filter.Keep(c.cand, Ask{Limits: limits, Known: c.known, Now: now}); got != c.keep {
			t.Errorf("%s: %s keeps %v, want %v", c.name, c.filter.Name(), got, c.keep)
		}
	}
}

// TestScorers: each scorer's factor, and their weights.
func TestScorers(t *testing.T) {
	ask := Ask{Now: now, Typical: ms(50)}
	fresh := Server{At: now, KV: 0.5, HasKV: true, Waiting: 4, HasWaiting: true}
	for _, c := range []struct {
		scorer Scorer
		cand   Candidate
		want   float64
	}{
		{queueScorer{}, Candidate{Replica: Replica{InFlight: 2}}, 3},
		{queueScorer{}, Candidate{Replica: Replica{InFlight: 2, Server: fresh}}, 5},
		{ttfbScorer{}, Candidate{Replica: Replica{TTFB: ms(200)}}, 0.2},
		{ttfbScorer{}, Candidate{}, 0.05},
		{kvCacheScorer{}, Candidate{Replica: Replica{Server: fresh}}, 1.5},
		{kvCacheScorer{}, Candidate{Replica: Replica{Server: Server{At: now.Add(-Stale), KV: 0.5, HasKV: true}}}, 1},
		{prefixScorer{}, Candidate{Replica: Replica{PrefixHit: 1}}, 1 - PrefixWeight},
		{prefixScorer{}, Candidate{Replica: Replica{PrefixHit: 0.5}}, 1 - PrefixWeight/2},
		{modelScorer{}, Candidate{Replica: Replica{ModelMiss: 2}}, 1 + 2*ModelWeight},
		{modelScorer{}, Candidate{}, 1},
		{tokenLoadScorer{}, Candidate{Tokens: 100, Replica: Replica{QueuedTokens: 400, PrefillRate: 1000}}, 1}, // no budget
	} {
		if got := c.scorer.Factor(c.cand, ask); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s of %+v: %v, want %v", c.scorer.Name(), c.cand, got, c.want)
		}
	}
	c := Candidate{Replica: Replica{InFlight: 1, TTFB: ms(100), PrefixHit: 1}}
	base := Cost(c, ask)
	ask.Weights = Weights{"prefix": 0}
	if got := Cost(c, ask); math.Abs(got-base/(1-PrefixWeight)) > 1e-12 {
		t.Errorf("prefix weighing 0: cost %v, want %v, the prefix left out", got, base/(1-PrefixWeight))
	}
	ask.Weights = Weights{"queue": 2}
	if got := Cost(c, ask); math.Abs(got-base*2) > 1e-12 {
		t.Errorf("queue weighing 2: cost %v, want %v, its factor (2) counted twice", got, base*2)
	}
	budget := Ask{Now: now, Limits: Limits{TTFTBudget: 250 * time.Millisecond}}
	if got := (tokenLoadScorer{}).Factor(Candidate{Tokens: 100, Replica: Replica{QueuedTokens: 400, PrefillRate: 1000}}, budget); math.Abs(got-3) > 1e-12 {
		t.Errorf("token_load of 500 ms of prefill with a 250 ms budget: %v, want 3", got)
	}
	if got := (tokenLoadScorer{}).Factor(Candidate{Tokens: 100}, budget); got != 1 {
		t.Errorf("token_load with no prefill rate known: %v, want 1", got)
	}
	if got := ScorerNames(); len(got) != 6 || got[0] != "queue" || got[4] != "model" || got[5] != "token_load" {
		t.Errorf("scorer names %v", got)
	}
}

// TestCostIsPeakEWMA: with every weight 1 the pipeline's cost is Linkerd's
// peak-EWMA as the picker priced replicas before the pipeline, bit for
// bit, so the pipeline picks as it did.
func TestCostIsPeakEWMA(t *testing.T) {
	rng := rand.New(rand.NewPCG(63, 1))
	for range 1000 {
		r := Replica{InFlight: rng.IntN(10), TTFB: time.Duration(rng.IntN(500)) * time.Millisecond, PrefixHit: rng.Float64(), ModelMiss: rng.IntN(3),
			Server: Server{At: now.Add(-time.Duration(rng.IntN(3)) * time.Second), KV: rng.Float64(), HasKV: rng.IntN(2) == 0, Waiting: float64(rng.IntN(9)), HasWaiting: rng.IntN(2) == 0}}
		typical := ms(float64(rng.IntN(100) + 1))
		pending, kv := r.Pending(now), 0.0
		if s := r.Server; r.Fresh(now) && s.HasKV {
			kv = math.Min(math.Max(s.KV, 0), 1)
		}
		ttfb := r.TTFB
		if ttfb == 0 {
			ttfb = typical
		}
		want := (pending + 1) * ttfb.Seconds() * (1 + kv) * (1 - PrefixWeight*r.PrefixHit) * float64(1+ModelWeight*r.ModelMiss)
		if got := r.Cost(now, typical); got != want {
			t.Fatalf("%+v: cost %v, want %v", r, got, want)
		}
	}
}

// TestPassRecordsItsSteps: a pass's steps, pick and reason, for each way
// through the pipeline.
func TestPassRecordsItsSteps(t *testing.T) {
	limits := Limits{MaxInFlight: 4, MaxModels: 2}
	ask := Ask{Limits: limits, Known: true, Now: now, Typical: ms(10)}
	idle, busy := Replica{TTFB: ms(10)}, Replica{TTFB: ms(10), InFlight: 2}
	queued := Replica{TTFB: ms(10), InFlight: 2, QueuedTokens: 600, PrefillRate: 10000, PrefixHit: 0.5} // 90 ms of prefill with the request's
	rated := Replica{TTFB: ms(10), PrefillRate: 10000}                                                  // idle: 30 ms for the request's
	for _, c := range []struct {
		name  string
		cands []Candidate
		ask   func(Ask) Ask
		want  int
		why   string
		line  string
	}{
		{"the conversation's replica", []Candidate{{Replica: idle}, {Replica: busy, Session: true}}, nil, 1, WhySession,
			"ready 2 > session 1 > picked 1 (session)"},
		{"the cheapest free", []Candidate{{Replica: busy}, {Replica: idle}}, nil, 1, WhyFree,
			"ready 2 > free 2 > picked 1 (free)"},
		{"the prompt's home, busier", []Candidate{{Replica: idle}, {Replica: busy, Home: true}}, func(a Ask) Ask { a.Keyed, a.Placed = true, true; return a }, 1, WhyHome,
			"ready 2 > free 2 > picked 1 (home)"},
		{"a new prompt's place, busier: the cheapest", []Candidate{{Replica: idle}, {Replica: busy, Home: true}}, func(a Ask) Ask { a.Keyed = true; return a }, 0, WhyFree,
			"ready 2 > free 2 > picked 0 (free)"},
		{"the model's holder, busier", []Candidate{{Replica: Replica{TTFB: ms(10), ModelMiss: 1}}, {Replica: busy}}, func(a Ask) Ask { a.Model = true; return a }, 1, WhyFree,
			"ready 2 > free 2 > picked 1 (free)"},
		{"the model's holder over a faster one", []Candidate{{Replica: Replica{TTFB: ms(1), ModelMiss: 2}}, {Replica: Replica{TTFB: ms(100), InFlight: 1}}}, func(a Ask) Ask { a.Model = true; return a }, 1, WhyModel,
			"ready 2 > free 2 > picked 1 (model)"},
		{"the prompt's home, its queued prefill past the budget: released", []Candidate{{Replica: rated, Tokens: 300}, {Replica: queued, Home: true, Tokens: 300}},
			func(a Ask) Ask { a.Keyed, a.Placed, a.Limits.TTFTBudget = true, true, 50*time.Millisecond; return a }, 0, WhyFree,
			"ready 2 > free 2 > released home > picked 0 (free)"},
		{"the prompt's home, its queued prefill within the budget", []Candidate{{Replica: idle, Tokens: 300}, {Replica: queued, Home: true, Tokens: 300}},
			func(a Ask) Ask { a.Keyed, a.Placed, a.Limits.TTFTBudget = true, true, time.Second; return a }, 1, WhyHome,
			"ready 2 > free 2 > picked 1 (home)"},
		{"the conversation's replica past the budget: released", []Candidate{{Replica: rated, Tokens: 300}, {Replica: queued, Session: true, Tokens: 300}},
			func(a Ask) Ask { a.Limits.TTFTBudget = 50 * time.Millisecond; return a }, 0, WhyFree,
			"ready 2 > free 2 > released session > picked 0 (free)"},
		{"the prompt's home past the budget, but slower to prefill it elsewhere: kept", []Candidate{{Replica: rated, Tokens: 1500}, {Replica: queued, Home: true, Tokens: 300}},
			func(a Ask) Ask { a.Keyed, a.Placed, a.Limits.TTFTBudget = true, true, 50*time.Millisecond; return a }, 1, WhyHome,
			"ready 2 > free 2 > picked 1 (home)"},
		{"the prompt's home past the budget, the other with prefill queued too: kept", []Candidate{{Replica: Replica{TTFB: ms(10), QueuedTokens: 10, PrefillRate: 10000}, Tokens: 300}, {Replica: queued, Home: true, Tokens: 300}},
			func(a Ask) Ask { a.Keyed, a.Placed, a.Limits.TTFTBudget = true, true, 50*time.Millisecond; return a }, 1, WhyHome,
			"ready 2 > free 2 > picked 1 (home)"},
		{"released to the spare replica that prefills it soonest, not the cheapest", []Candidate{{Replica: rated, Tokens: 300}, {Replica: Replica{TTFB: ms(1), QueuedTokens: 10, PrefillRate: 10000}, Tokens: 300},
			{Replica: rated, Tokens: 100}, {Replica: queued, Home: true, Tokens: 300}},
			func(a Ask) Ask { a.Keyed, a.Placed, a.Limits.TTFTBudget = true, true, 50*time.Millisecond; return a }, 2, WhyFree,
			"ready 4 > free 4 > released home > picked 2 (free)"},
		{"every one saturated: room", []Candidate{{Replica: Replica{TTFB: ms(10), InFlight: 4}}, {Replica: Replica{TTFB: ms(10), InFlight: 3, Server: Server{At: now, KV: 1, HasKV: true}}}},
			func(a Ask) Ask { a.Limits.KVCacheLimit = 0.9; return a }, 1, WhyRoom, "ready 2 > free 0 > room 1 > picked 1 (room)"},
	} {
		a := ask
		if c.ask != nil {
			a = c.ask(a)
		}
		pass := Run(c.cands, a)
		if pass.Picked != c.want || pass.Why != c.why || pass.String() != c.line {
			t.Errorf("%s: picked %d (%s), %q; want %d (%s), %q", c.name, pass.Picked, pass.Why, pass, c.want, c.why, c.line)
		}
	}
}
