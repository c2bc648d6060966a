package picker

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/agent/picker/prefix"
	"github.com/servemesh/servemesh/agent/picker/scoring"
	"github.com/servemesh/servemesh/meshspec"
)

// tokenPicker follows three ready replicas of backend llama (8 in flight
// each) with a TTFT budget of budgetMs (0: none); view swaps the
// desired state.
func tokenPicker(t *testing.T, budgetMs int) (p *Picker, view func(userConfig string)) {
	t.Helper()
	var v *nodeview.View
	view = func(userConfig string) {
		m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "llama", Process: &meshspec.ProcessSpec{Command: "/bin/engine"},
			Config: meshspec.BackendConfig{MaxConcurrentQueries: 8, UserConfig: meshspec.UserConfig(userConfig), LoadAware: &meshspec.LoadAware{TTFTBudgetMs: budgetMs}}}}}
		v = nodeview.New(m, "n1")
	}
	view(`{}`)
	p = New(func() *nodeview.View { return v })
	now := time.Unix(1_000_000, 0)
	p.now = func() time.Time { return now }
	for i, tag := range []string{"llama#000001", "llama#000002", "llama#000003"} {
		p.Track(tag, "llama", fmt.Sprintf("127.0.0.1:900%d", i+1))
		p.SetReady(tag, true)
	}
	return p, view
}

// sharedPrompt is a prompt of a shared system prompt (8 blocks) and a
// question of its own (40 blocks): 768 tokens, 640 of them its own.
func sharedPrompt(question string) []uint64 {
	body := `{"messages":[{"role":"system","content":"` + strings.Repeat("s", 8*prefix.BlockBytes) +
		`"},{"role":"user","content":"` + strings.Repeat(question, 40*prefix.BlockBytes/len(question)) + `"}]}`
	return prefix.Blocks([]byte(body), prefix.BlockBytes)
}

// TestTokenLoadReleasesAPromptsHomePastItsBudget: llm-d's sticky until
// saturated. The prompt's home keeps its requests while its queued
// prefill, at the rate its cold prefill showed, stays within the budget;
// the request that would pass it goes elsewhere, and once the queue
// drains the home takes them again. Without a budget the home keeps it.
func TestTokenLoadReleasesAPromptsHomePastItsBudget(t *testing.T) {
	for _, budgetMs := range []int{100, 0} {
		p, _ := tokenPicker(t, budgetMs)
		first := pickNow(t, p, request{blocks: sharedPrompt("q1")})
		if !first.cold || first.tokens < 700 {
			t.Fatalf("the first request: cold %v, %d uncached tokens; want cold, every token uncached", first.cold, first.tokens)
		}
		p.done(first, 100*time.Millisecond, http.StatusOK) // about 7,700 tokens a second
		home := first.replica
		if rate := home.PrefillRate; rate < 7000 || rate > 8000 {
			t.Fatalf("the home's prefill rate after a cold prefill of %d tokens in 100 ms: %v", first.tokens, rate)
		}
		second := pickNow(t, p, request{blocks: sharedPrompt("q2")})
		if second.replica != home || home.QueuedTokens != second.tokens || second.tokens >= first.tokens {
			t.Fatalf("the second request: %s with %d tokens (home %s, queued %d); want home, its shared part cached", second.replica.tag, second.tokens, home.tag, home.QueuedTokens)
		}
		third := pickNow(t, p, request{blocks: sharedPrompt("q3")}) // 2 × 640 tokens: about 170 ms of prefill
		if budgetMs == 0 {
			if third.replica != home {
				t.Fatalf("without a budget the third request went to %s, not its home %s", third.replica.tag, home.tag)
			}
			continue
		}
		if third.replica == home || third.pass.Released != scoring.WhyHome || !strings.Contains(third.pass.String(), "released home") {
			t.Fatalf("the third request went to %s (home %s), pass %q; want elsewhere, the home released", third.replica.tag, home.tag, third.pass)
		}
		p.done(second, 80*time.Millisecond, http.StatusOK)
		if home.QueuedTokens != 0 {
			t.Fatalf("the home's queue after its answer: %d tokens, want 0", home.QueuedTokens)
		}
		if fourth := pickNow(t, p, request{blocks: sharedPrompt("q4")}); fourth.replica != home {
			t.Fatalf("with its queue drained the fourth request went to %s, not its home %s", fourth.replica.tag, home.tag)
		}
	}
}

// TestPrefillRateIsMeasuredAgainAfterASpecChange: a cold prefill after
// the backend's user_config changed measures the rate afresh; a warm one
// (the replica busy) or a short one measures nothing.
func TestPrefillRateIsMeasuredAgainAfterASpecChange(t *testing.T) {
	p, view := tokenPicker(t, 10000)
	c := pickNow(t, p, request{blocks: sharedPrompt("q1")})
	p.done(c, 100*time.Millisecond, http.StatusOK)
	r, before := c.replica, c.replica.PrefillRate
	busy := pickNow(t, p, request{blocks: sharedPrompt("q2")})
	warm := pickNow(t, p, request{blocks: sharedPrompt("q3")})
	if busy.replica != r || warm.replica != r || warm.cold {
		t.Fatalf("two requests of the prompt: %s and %s (cold %v); want both at its home %s, the second not cold", busy.replica.tag, warm.replica.tag, warm.cold, r.tag)
	}
	p.done(warm, 10*time.Second, http.StatusOK)
	if r.PrefillRate != before {
		t.Fatalf("the rate moved from %v to %v on a prefill beside another", before, r.PrefillRate)
	}
	p.done(busy, 100*time.Millisecond, http.StatusOK)
	short := pickNow(t, p, request{blocks: prefix.Blocks([]byte("hello"), prefix.BlockBytes)})
	before = short.replica.PrefillRate
	p.done(short, 10*time.Second, http.StatusOK)
	if !short.cold || short.replica.PrefillRate != before {
		t.Fatalf("a cold prompt of %d tokens (cold %v) moved %s's rate from %v to %v", short.tokens, short.cold, short.replica.tag, before, short.replica.PrefillRate)
	}
	view(`{"engine":"faster"}`)
	again := pickNow(t, p, request{blocks: sharedPrompt("q4")})
	if again.replica != r || !again.cold {
		t.Fatalf("the prompt's next request went to %s (cold %v), not its idle home %s", again.replica.tag, again.cold, r.tag)
	}
	p.done(again, 10*time.Millisecond, http.StatusOK)
	if got, want := r.PrefillRate, float64(again.tokens)/0.01; got != want {
		t.Fatalf("after the spec changed the rate is %v, want %v: its first cold prefill's alone", got, want)
	}
}
