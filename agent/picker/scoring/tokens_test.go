package scoring

import (
	"math"
	"testing"
	"time"
)

func TestTokenSaturated(t *testing.T) {
	for _, c := range []struct {
		name   string
		cand   Candidate
		budget time.Duration
		want   bool
	}{
		{"past the budget", Candidate{Tokens: 600, Replica: Replica{QueuedTokens: 600, PrefillRate: 1000}}, time.Second, true},
		{"at the budget", Candidate{Tokens: 400, Replica: Replica{QueuedTokens: 600, PrefillRate: 1000}}, time.Second, false},
		{"nothing queued: any prompt is taken", Candidate{Tokens: 5000, Replica: Replica{PrefillRate: 1000}}, time.Second, false},
		{"no rate known", Candidate{Tokens: 600, Replica: Replica{QueuedTokens: 600}}, time.Second, false},
		{"no budget", Candidate{Tokens: 600, Replica: Replica{QueuedTokens: 600, PrefillRate: 1000}}, 0, false},
	} {
		if got := TokenSaturated(c.cand, Ask{Limits: Limits{TTFTBudget: c.budget}}); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPrefillRate(t *testing.T) {
	for _, c := range []struct {
		name   string
		rate   float64
		tokens int
		ttfb   time.Duration
		want   float64
	}{
		{"a first cold prefill", 0, 1000, 100 * time.Millisecond, 10000},
		{"another, smoothed", 10000, 500, 100 * time.Millisecond, TTFBWeight*5000 + (1-TTFBWeight)*10000},
		{"too few tokens to tell", 10000, ColdTokens - 1, time.Millisecond, 10000},
		{"no time", 10000, 1000, 0, 10000},
	} {
		if got := PrefillRate(c.rate, c.tokens, c.ttfb); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestTypicalPrefillRateIsTheSlowestKnown(t *testing.T) {
	if got := TypicalPrefillRate([]Replica{{}, {PrefillRate: 3000}, {PrefillRate: 2000}}); got != 2000 {
		t.Errorf("typical %v, want 2000", got)
	}
	if got := TypicalPrefillRate([]Replica{{}}); got != 0 {
		t.Errorf("typical with none known %v, want 0", got)
	}
}

func TestPrefillWait(t *testing.T) {
	c := Candidate{Tokens: 250, Replica: Replica{QueuedTokens: 750, PrefillRate: 4000}}
	if got := c.PrefillWait(); got != 250*time.Millisecond {
		t.Errorf("wait %s, want 250ms", got)
	}
}
