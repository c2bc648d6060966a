package scoring

import "time"

// Token load (llm-d's "sticky until saturated"), for a backend with a
// time-to-first-token budget (load_aware.ttft_budget_ms): the picker counts
// each replica's queued prefill, the uncached prompt tokens of the
// requests it sent there that have had no first byte yet
// (Replica.QueuedTokens), and knows the replica's prefill rate, measured
// from its own cold prefills (Replica.PrefillRate). A request's affinity
// target (its conversation's replica, its model's, its prompt's home)
// keeps it only while that queue and the request's own uncached tokens
// (Candidate.Tokens) would be prefilled within the budget (TokenSaturated),
// or no other free replica with no prefill queued (spare) would prefill it
// sooner (the whole prompt, where it holds none of it): past that, the
// affinity is released to the spare replica that would prefill it
// soonest. The token_load scorer counts the same wait in every
// candidate's cost. Without a budget, or before a rate is known, token
// load changes nothing.

// PrefillWait is how long c would take to prefill its queued tokens and
// the request's own, at its prefill rate (0: no rate known).
func (c Candidate) PrefillWait() time.Duration {
	if c.PrefillRate <= 0 {
		return 0
	}
	return time.Duration(float64(c.QueuedTokens+c.Tokens) / c.PrefillRate * float64(time.Second))
}

// TokenSaturated reports whether c, an affinity target, is past the
// budget: it has prefill queued and, with the request's, that would take
// longer than the budget. A replica with nothing queued takes a request
// however long its prompt, as any other would take as long.
func TokenSaturated(c Candidate, a Ask) bool {
	return a.Limits.TTFTBudget > 0 && c.QueuedTokens > 0 && c.PrefillWait() > a.Limits.TTFTBudget
}

// tokenLoadScorer is one plus its prefill wait (PrefillWait) over the
// budget: a replica whose queued prefill fills the budget costs twice an
// idle one. Neutral (1) without a budget or a rate.
type tokenLoadScorer struct{}

func (tokenLoadScorer) Name() string { return "token_load" }
func (tokenLoadScorer) Factor(c Candidate, a Ask) float64 {
	if a.Limits.TTFTBudget <= 0 {
		return 1
	}
	return 1 + c.PrefillWait().Seconds()/a.Limits.TTFTBudget.Seconds()
}

// ColdTokens is the fewest uncached prompt tokens a request sent to an
// idle replica must have for its time to first byte to measure the
// replica's prefill rate: below that, the answer's fixed costs outweigh
// its prefill.
const ColdTokens = 128

// PrefillRate is a replica's prefill rate after one more cold prefill of
// tokens that took ttfb (rate: its last, 0 if none), smoothed as times to
// first byte are (TTFBWeight).
func PrefillRate(rate float64, tokens int, ttfb time.Duration) float64 {
	if tokens < ColdTokens || ttfb <= 0 {
		return rate
	}
	sample := float64(tokens) / ttfb.Seconds()
	if rate <= 0 {
		return sample
	}
	return TTFBWeight*sample + (1-TTFBWeight)*rate
}

// TypicalPrefillRate stands in for the rate of a replica that has had no
// cold prefill yet: the slowest of the others' (a new replica is assumed
// no faster than the slowest, so its affinity is released no later than
// theirs), 0 when none has one.
func TypicalPrefillRate(replicas []Replica) float64 {
	slowest := 0.0
	for _, r := range replicas {
		if r.PrefillRate > 0 && (slowest == 0 || r.PrefillRate < slowest) {
			slowest = r.PrefillRate
		}
	}
	return slowest
}
