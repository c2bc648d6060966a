package rollout

import (
	"fmt"
	"time"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Sample is one backend's figures over a stage's window, with how many
// answers its latency was measured on.
type Sample struct {
	meshspec.RolloutFigures
	// Timed is how many answers the latency histogram holds in the window
	// (Envoy flushes it every second, so it trails Requests a little).
	Timed uint64 `json:"timed"`
	// Percentile is the percentile LatencyMs is at: the checks' own, or a
	// lower one where the candidate has too few answers for it
	// (judgedPercentile).
	Percentile float64 `json:"percentile,omitempty"`
	// FirstTokens and Streamed are how many answers the GenAI histograms
	// hold (TTFTMs's and InterTokenMs's).
	FirstTokens uint64 `json:"first_tokens,omitempty"`
	Streamed    uint64 `json:"streamed,omitempty"`
	// From names the stage whose window the figures are of, where they
	// are not the current one's: the primary's of an earlier stage
	// (baseline).
	From string `json:"from,omitempty"`
}

// slowestIgnored is how many of a window's slowest answers never set its
// percentile alone. A p99 over 60 answers is the slowest of them: one
// answer that waited on a busy machine or a first connection would fail
// a candidate that is as fast as its primary.
const slowestIgnored = 3

// judgedPercentile is the percentile a window of timed answers is judged
// at: p, or, where fewer than slowestIgnored answers would lie above p,
// the highest percentile that leaves slowestIgnored above it. A
// candidate slow in most of its answers still fails at once; its tail is
// judged at p once it has answered enough (300 for p99).
func judgedPercentile(p float64, timed uint64) float64 {
	if timed == 0 {
		return p
	}
	return min(p, 100*(1-float64(slowestIgnored)/float64(timed)))
}

// baseline is what the candidate is compared with: the primary's figures
// over the stage's window or, where the primary answers too few requests
// there to count (a stage that sends the candidate everything), its
// figures at the last stage judged on enough of them.
func baseline(prim Sample, verdicts []meshspec.RolloutVerdict, minSample int) Sample {
	if prim.Requests >= uint64(minSample) {
		return prim
	}
	for i := len(verdicts) - 1; i >= 0; i-- {
		if v := verdicts[i]; v.Passed && v.Primary.Requests >= uint64(minSample) {
			earlier := Sample{RolloutFigures: v.Primary, From: v.Stage}
			if v.Primary.LatencyMs > 0 {
				earlier.Timed = v.Primary.Requests
			}
			return earlier
		}
	}
	return prim
}

// sampleOf turns one backend's counts over a window into figures, the
// latency at percentile p.
func sampleOf(c counts, p float64) Sample {
	s := Sample{RolloutFigures: meshspec.RolloutFigures{Requests: c.requests, Errors: c.errors}, Percentile: p}
	if c.requests > 0 {
		s.ErrorRate = float64(c.errors) / float64(c.requests)
	}
	if len(c.latency) > 0 {
		s.Timed = c.timed()
		s.LatencyMs = Quantile(p/100, wire.LatencyBoundsMs, c.latency)
	}
	s.FirstTokens, s.Streamed = total(c.ttft), total(c.interToken)
	s.TTFTMs = Quantile(float64(meshspec.TokenPercentile)/100, wire.GenAIBoundsMs, c.ttft)
	s.InterTokenMs = Quantile(float64(meshspec.TokenPercentile)/100, wire.GenAIBoundsMs, c.interToken)
	return s
}

// Quantile estimates the q-quantile (0 < q < 1) of a histogram given as
// cumulative counts at bounds, interpolating linearly within the bucket
// it falls in, as Prometheus's histogram_quantile does; 0 when empty.
func Quantile(q float64, bounds []float64, cumulative []uint64) float64 {
	n := len(cumulative)
	if n == 0 || n != len(bounds) || cumulative[n-1] == 0 {
		return 0
	}
	rank := q * float64(cumulative[n-1])
	for i, c := range cumulative {
		if float64(c) < rank {
			continue
		}
		lower, below := 0.0, 0.0
		if i > 0 {
			lower, below = bounds[i-1], float64(cumulative[i-1])
		}
		if float64(c) == below {
			return bounds[i]
		}
		return lower + (bounds[i]-lower)*(rank-below)/(float64(c)-below)
	}
	return bounds[n-1]
}

// Judge decides a stage from the candidate's and the primary's samples
// over its window, elapsed into the stage. A verdict needs checks.MinSample
// answers of the candidate; a failed check decides at once, a pass needs
// the stage's duration and min_requests too. The primary is compared
// with only once it has MinSample answers of its own.
func Judge(stage meshspec.RolloutStage, checks meshspec.RolloutChecks, elapsed time.Duration, cand, prim Sample) (meshspec.RolloutVerdict, bool) {
	c := checks.Effective()
	v := meshspec.RolloutVerdict{Stage: stage.Name(), Candidate: cand.RolloutFigures, Primary: prim.RolloutFigures}
	if cand.Requests < uint64(c.MinSample) {
		return v, false
	}
	if reason := failedCheck(c, cand, prim); reason != "" {
		v.Reason = reason
		return v, true
	}
	if elapsed < time.Duration(stage.DurationS*float64(time.Second)) || cand.Requests < uint64(stage.MinRequests) || cand.Timed < uint64(c.MinSample) {
		return v, false
	}
	v.Passed = true
	v.Reason = fmt.Sprintf("within the checks over %d answers in %s", cand.Requests, elapsed.Round(time.Second))
	switch {
	case prim.From != "":
		v.Reason += fmt.Sprintf(", compared with the primary's figures at stage %s (it answers too few requests at this one)", prim.From)
	case prim.Requests < uint64(c.MinSample) && c.Relative():
		v.Reason += fmt.Sprintf("; the primary answered %d requests, too few to compare with: only the checks of the candidate's own figures applied", prim.Requests)
	}
	return v, true
}

// failedCheck says which check the candidate fails, "" if none.
func failedCheck(c meshspec.RolloutChecks, cand, prim Sample) string {
	primCounts := prim.Requests >= uint64(c.MinSample)
	switch {
	case cand.ErrorRate > c.MaxErrorRate:
		return fmt.Sprintf("error rate %.2f%% (%d of %d) above the %.2f%% allowed", 100*cand.ErrorRate, cand.Errors, cand.Requests, 100*c.MaxErrorRate)
	case c.MaxErrorRateIncrease > 0 && primCounts && cand.ErrorRate > prim.ErrorRate+c.MaxErrorRateIncrease:
		return fmt.Sprintf("error rate %.2f%% above the primary's %.2f%% by more than the %.2f points allowed", 100*cand.ErrorRate, 100*prim.ErrorRate, 100*c.MaxErrorRateIncrease)
	}
	if reason := failedTokenCheck(c, cand, prim); reason != "" {
		return reason
	}
	if cand.Timed < uint64(c.MinSample) {
		return ""
	}
	p := fmt.Sprintf("p%g", c.LatencyPercentile)
	if cand.Percentile != 0 && cand.Percentile < c.LatencyPercentile {
		p = fmt.Sprintf("p%.1f (%d answers, too few for p%g)", cand.Percentile, cand.Timed, c.LatencyPercentile)
	}
	switch {
	case c.MaxLatencyMs > 0 && cand.LatencyMs > c.MaxLatencyMs:
		return fmt.Sprintf("%s latency %.1f ms above the %.1f ms allowed", p, cand.LatencyMs, c.MaxLatencyMs)
	case prim.Timed >= uint64(c.MinSample) && cand.LatencyMs > prim.LatencyMs*c.MaxLatencyRatio && cand.LatencyMs-prim.LatencyMs > c.LatencyToleranceMs:
		return fmt.Sprintf("%s latency %.1f ms, more than %g times the primary's %.1f ms", p, cand.LatencyMs, c.MaxLatencyRatio, prim.LatencyMs)
	}
	return ""
}

// failedTokenCheck says which GenAI check the candidate fails, "" if
// none: each compares p95s once both sides have MinSample answers of it.
func failedTokenCheck(c meshspec.RolloutChecks, cand, prim Sample) string {
	enough := func(a, b uint64) bool { return a >= uint64(c.MinSample) && b >= uint64(c.MinSample) }
	switch {
	case c.MaxTTFTRatio > 0 && enough(cand.FirstTokens, prim.FirstTokens) && cand.TTFTMs > prim.TTFTMs*c.MaxTTFTRatio:
		return fmt.Sprintf("time to first token p%d %.1f ms, more than %g times the primary's %.1f ms", meshspec.TokenPercentile, cand.TTFTMs, c.MaxTTFTRatio, prim.TTFTMs)
	case c.MaxInterTokenRatio > 0 && enough(cand.Streamed, prim.Streamed) && cand.InterTokenMs > prim.InterTokenMs*c.MaxInterTokenRatio:
		return fmt.Sprintf("time between tokens p%d %.1f ms, more than %g times the primary's %.1f ms", meshspec.TokenPercentile, cand.InterTokenMs, c.MaxInterTokenRatio, prim.InterTokenMs)
	}
	return ""
}
