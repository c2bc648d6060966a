package rollout

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// histogram returns cumulative counts at wire.LatencyBoundsMs of n answers
// that each took ms.
func histogram(n uint64, ms float64) []uint64 {
	out := make([]uint64, len(wire.LatencyBoundsMs))
	for i, b := range wire.LatencyBoundsMs {
		if ms <= b {
			out[i] = n
		}
	}
	return out
}

func TestQuantile(t *testing.T) {
	bounds := []float64{1, 2, 4}
	for _, tc := range []struct {
		q    float64
		cum  []uint64
		want float64
	}{
		{0.5, []uint64{0, 0, 0}, 0},
		{0.5, []uint64{10, 10, 10}, 0.5},
		{0.99, []uint64{50, 100, 100}, 1.98},
		{0.9, []uint64{0, 0, 10}, 3.8},
	} {
		if got := Quantile(tc.q, bounds, tc.cum); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Quantile(%v, %v) = %v, want %v", tc.q, tc.cum, got, tc.want)
		}
	}
}

func sample(requests, errors uint64, ms float64) Sample {
	return sampleOf(counts{requests: requests, errors: errors, latency: histogram(requests, ms)}, 99)
}

// TestJudge: a failed check decides once the candidate has the minimum
// sample; a pass waits for the stage's duration and minimum of requests;
// the relative checks compare with the primary only once it has a sample.
func TestJudge(t *testing.T) {
	step := meshspec.RolloutStage{Kind: meshspec.StageTraffic, Share: 0.1, DurationS: 10, MinRequests: 100}
	checks := meshspec.RolloutChecks{MaxErrorRateIncrease: 0.005}
	good, slow := sample(1000, 0, 4), sample(1000, 0, 40)
	for _, tc := range []struct {
		name        string
		elapsed     time.Duration
		cand, prim  Sample
		checks      meshspec.RolloutChecks
		decided, ok bool
		reason      string
	}{
		{"too few answers", time.Minute, sample(19, 19, 4), good, checks, false, false, ""},
		{"errors above the bound", time.Second, sample(100, 5, 4), good, checks, true, false, "error rate 5.00% (5 of 100) above the 1.00% allowed"},
		{"errors above the primary's", time.Second, sample(1000, 8, 4), good, checks, true, false, "above the primary's 0.00% by more than the 0.50 points"},
		{"as many errors as the primary", time.Minute, sample(1000, 8, 4), sample(1000, 8, 4), checks, true, true, "within the checks"},
		{"slow", time.Second, slow, good, checks, true, false, "p99 latency 49.8 ms, more than 2 times the primary's 5.0 ms"},
		{"slow but within the tolerance", time.Minute, sample(1000, 0, 5), sample(1000, 0, 2), checks, true, true, ""},
		{"slow with no primary to compare", time.Minute, slow, sample(5, 0, 4), checks, true, true,
			"; the primary answered 5 requests, too few to compare with: only the checks of the candidate's own figures applied"},
		{"slow above the absolute bound", time.Second, slow, slow, meshspec.RolloutChecks{MaxLatencyMs: 25}, true, false, "above the 25.0 ms allowed"},
		{"good but too early", 5 * time.Second, good, good, checks, false, false, ""},
		{"good but too few for the stage", time.Minute, sample(50, 0, 4), good, checks, false, false, ""},
		{"good", time.Minute, good, good, checks, true, true, "within the checks over 1000 answers in 1m0s"},
	} {
		v, decided := Judge(step, tc.checks, tc.elapsed, tc.cand, tc.prim)
		if decided != tc.decided || (decided && v.Passed != tc.ok) || !strings.Contains(v.Reason, tc.reason) {
			t.Errorf("%s: decided=%v passed=%v reason %q", tc.name, decided, v.Passed, v.Reason)
		}
		if decided && (v.Stage != "traffic 10%" || v.Candidate != tc.cand.RolloutFigures) {
			t.Errorf("%s: verdict %+v", tc.name, v)
		}
	}
}

// TestAStageWithoutThePrimaryComparesWithAnEarlierOne: at a stage that
// sends the candidate every request the primary answers none, and its
// relative checks compared with nothing, so a slow candidate passed the
// 100% stage (issue 40). The candidate is compared with the primary's
// figures at the last stage judged on enough of them, and the verdict
// says so; with none, it says the relative checks could not apply.
func TestAStageWithoutThePrimaryComparesWithAnEarlierOne(t *testing.T) {
	full := meshspec.RolloutStage{Kind: meshspec.StageTraffic, Share: 1, DurationS: 10, MinRequests: 100}
	checks := meshspec.RolloutChecks{MaxErrorRateIncrease: 0.005}
	slow, none := sample(1000, 0, 40), sample(0, 0, 0)
	earlier := []meshspec.RolloutVerdict{
		{Stage: "traffic 25%", Passed: true, Primary: sample(3000, 0, 4).RolloutFigures},
		{Stage: "traffic 50%", Passed: true, Primary: sample(2000, 0, 4).RolloutFigures},
	}
	base := baseline(none, earlier, checks.Effective().MinSample)
	if base.From != "traffic 50%" || base.Requests != 2000 || base.Timed != 2000 {
		t.Fatalf("baseline: %+v", base)
	}
	v, decided := Judge(full, checks, time.Minute, slow, base)
	if !decided || v.Passed || !strings.Contains(v.Reason, "more than 2 times the primary's 5.0 ms") {
		t.Errorf("a slow candidate at 100%%: decided=%v passed=%v reason %q", decided, v.Passed, v.Reason)
	}
	v, decided = Judge(full, checks, time.Minute, sample(1000, 0, 4), base)
	if !decided || !v.Passed || !strings.HasSuffix(v.Reason, "compared with the primary's figures at stage traffic 50% (it answers too few requests at this one)") {
		t.Errorf("a good candidate at 100%%: decided=%v passed=%v reason %q", decided, v.Passed, v.Reason)
	}
	// The primary's own figures, when it has enough, are the baseline.
	if own := sample(500, 0, 4); baseline(own, earlier, 20).From != "" {
		t.Error("a primary with enough answers was compared by an earlier stage")
	}
	// A failed verdict's figures are no baseline, nor are too few.
	if got := baseline(none, []meshspec.RolloutVerdict{{Stage: "traffic 5%", Primary: sample(900, 0, 4).RolloutFigures},
		{Stage: "traffic 10%", Passed: true, Primary: sample(3, 0, 4).RolloutFigures}}, 20); got.From != "" {
		t.Errorf("baseline from a failed or thin stage: %+v", got)
	}
}

// TestWindowCountsFromTheStageOn: each node's first sample in a window is
// its start; a node whose Envoy restarted counts from 0 again.
func TestWindowCountsFromTheStageOn(t *testing.T) {
	w := newWindow(windowKey{stage: 1})
	load := func(requests, errors uint64) wire.Load {
		return wire.Load{Backends: map[string]wire.BackendLoad{"v2": {Requests: requests, Errors: errors, Latency: histogram(requests, 3)}}}
	}
	c := w.observe(map[string]wire.Load{"n1": load(500, 50), "n2": load(100, 0)}, "v2", "v1")
	if c[0].requests != 0 || c[1].requests != 0 {
		t.Fatalf("first sample: %+v", c)
	}
	c = w.observe(map[string]wire.Load{"n1": load(600, 55), "n2": load(30, 3)}, "v2", "v1")
	s := sampleOf(c[0], 99)
	if s.Requests != 130 || s.Errors != 8 || s.Timed != 130 || s.LatencyMs <= 2 || s.LatencyMs > 3 {
		t.Fatalf("window: %+v", s)
	}
	// Requests in flight are not answers yet: neither counted nor failed.
	inFlight := load(610, 55)
	l := inFlight.Backends["v2"]
	l.Active = 10
	inFlight.Backends["v2"] = l
	c = w.observe(map[string]wire.Load{"n1": inFlight, "n2": load(30, 3)}, "v2", "v1")
	if s := sampleOf(c[0], 99); s.Requests != 130 || s.Errors != 8 {
		t.Fatalf("window with 10 in flight: %+v", s)
	}
}

// genaiLoad is n answers of one backend, each with a time to first token
// of ttftMs and tokens interMs apart, as an agent reports them.
func genaiLoad(n uint64, ttftMs, interMs float64) wire.GenAILoad {
	at := func(ms float64) []uint64 {
		out := make([]uint64, len(wire.GenAIBoundsMs))
		for i, b := range wire.GenAIBoundsMs {
			if b >= ms {
				out[i] = n
			}
		}
		return out
	}
	return wire.GenAILoad{TTFT: at(ttftMs), InterToken: at(interMs)}
}

// TestTokenChecks: a candidate of model traffic is judged on its time to
// first token and between tokens at p95 against the primary's, from the
// GenAI histograms the nodes report over the stage's window; an agent
// that restarted (its histograms went back) counts again from nothing.
func TestTokenChecks(t *testing.T) {
	step := meshspec.RolloutStage{Kind: meshspec.StageTraffic, Share: 0.1, DurationS: 10, MinRequests: 10}
	checks := meshspec.RolloutChecks{MaxTTFTRatio: 1.5, MaxInterTokenRatio: 1.1}
	judge := func(cand, prim wire.GenAILoad) meshspec.RolloutVerdict {
		w := newWindow(windowKey{stage: 1})
		load := func(c, p wire.GenAILoad) wire.Load {
			b := wire.BackendLoad{Requests: 1000, Latency: histogram(1000, 3)}
			return wire.Load{Backends: map[string]wire.BackendLoad{"v2": b, "v1": b}, GenAI: map[string]wire.GenAILoad{"v2": c, "v1": p}}
		}
		w.observe(map[string]wire.Load{"n1": load(wire.GenAILoad{}, wire.GenAILoad{})}, "v2", "v1")
		more := load(cand, prim)
		for _, b := range []string{"v2", "v1"} {
			l := more.Backends[b]
			l.Requests, l.Latency = 2000, histogram(2000, 3)
			more.Backends[b] = l
		}
		c := w.observe(map[string]wire.Load{"n1": more}, "v2", "v1")
		v, decided := Judge(step, checks, time.Minute, sampleOf(c[0], 99), sampleOf(c[1], 99))
		if !decided {
			t.Fatalf("no verdict over 1000 answers each")
		}
		return v
	}
	for _, tc := range []struct {
		name       string
		cand, prim wire.GenAILoad
		pass       bool
		reason     string
	}{
		{"as fast", genaiLoad(100, 200, 50), genaiLoad(100, 200, 50), true, "within the checks"},
		{"tokens 20% slower", genaiLoad(100, 200, 60), genaiLoad(100, 200, 50), false, "time between tokens p95"},
		{"first token twice as slow", genaiLoad(100, 400, 50), genaiLoad(100, 200, 50), false, "time to first token p95"},
		{"first token a little slower", genaiLoad(100, 260, 50), genaiLoad(100, 200, 50), true, "within the checks"},
		{"too few streamed answers to compare", genaiLoad(10, 200, 90), genaiLoad(100, 200, 50), true, "within the checks"},
	} {
		v := judge(tc.cand, tc.prim)
		if v.Passed != tc.pass || !strings.Contains(v.Reason, tc.reason) {
			t.Errorf("%s: passed=%v %q; want passed=%v, saying %q", tc.name, v.Passed, v.Reason, tc.pass, tc.reason)
		}
	}
	// An agent that restarted reports fewer answers than the window began
	// from: the window counts its answers from nothing again.
	w := newWindow(windowKey{stage: 1})
	w.observe(map[string]wire.Load{"n1": {GenAI: map[string]wire.GenAILoad{"v2": genaiLoad(500, 100, 10)}}}, "v2")
	c := w.observe(map[string]wire.Load{"n1": {GenAI: map[string]wire.GenAILoad{"v2": genaiLoad(30, 100, 10)}}}, "v2")
	if s := sampleOf(c[0], 99); s.FirstTokens != 30 || s.Streamed != 30 {
		t.Errorf("after the agent restarted: %d and %d answers, want the 30 since", s.FirstTokens, s.Streamed)
	}
}
