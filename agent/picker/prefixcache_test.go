package picker

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/agent/picker/prefix"
	"github.com/servemesh/servemesh/meshspec"
)

// longPrompt is a chat prompt of system's 40 blocks and a question.
func longPrompt(system string) []uint64 {
	return prefix.Blocks([]byte(`{"messages":[{"role":"system","content":"`+strings.Repeat(system, 40*prefix.BlockBytes)+`"},{"role":"user","content":"why?"}]}`), prefix.BlockBytes)
}

// TestAPromptGoesWhereItIsStillHeld: a replica's cache holds what fits
// in the tokens its backend sets (prefix_cache_tokens), the prompts it
// was sent last: a prompt whose home has since taken two others, which
// pushed it out, goes to the replica that took it later and still holds
// it. With the default size the home is expected to hold it still, and
// keeps it.
func TestAPromptGoesWhereItIsStillHeld(t *testing.T) {
	for _, tc := range []struct {
		tokens    int
		wantMoved bool
	}{{tokens: 0, wantMoved: false}, {tokens: 60 * prefix.TokensPerBlock, wantMoved: true}} {
		p, _ := testPicker(t, &meshspec.LoadAware{PrefixCacheTokens: tc.tokens})
		for _, r := range p.replicas {
			r.TTFB = 100 * time.Millisecond
		}
		home := pickNow(t, p, request{blocks: longPrompt("a")})
		p.done(home, 100*time.Millisecond, http.StatusOK)
		// What the picker sent since: the home took prompts b and c
		// (41 blocks each: a 60-block cache keeps c and part of b), and
		// another replica took a (its home saturated, say).
		p.mu.Lock()
		home.replica.cache.Add(longPrompt("b"))
		home.replica.cache.Add(longPrompt("c"))
		other := p.replicas["llama#000001"]
		if other == home.replica {
			other = p.replicas["llama#000002"]
		}
		other.cache.Add(longPrompt("a"))
		p.mu.Unlock()

		next := pickNow(t, p, request{blocks: longPrompt("a")})
		moved := next.replica != home.replica
		if moved != tc.wantMoved || (moved && next.replica != other) {
			t.Errorf("prefix_cache_tokens %d: the prompt went from its home %s to %s; want moved %t (to %s, which holds it)",
				tc.tokens, home.replica.tag, next.replica.tag, tc.wantMoved, other.tag)
		}
		if want := prefix.BlocksOfTokens(tc.tokens); tc.tokens > 0 && home.replica.cache.Capacity() != want {
			t.Errorf("the home's cache holds %d blocks, want %d (%d tokens)", home.replica.cache.Capacity(), want, tc.tokens)
		}
	}
}

// TestPickerTakesTheCacheSizeTheEngineReports: a replica whose server is
// vLLM (its own exposition, testdata/engines) is expected to hold what
// its KV cache does, 4,096 blocks of 16 tokens; a size the backend sets
// comes first.
func TestPickerTakesTheCacheSizeTheEngineReports(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("testdata", "engines", "vllm.prom"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(text) }))
	defer srv.Close()
	for _, tc := range []struct{ configured, want int }{{0, prefix.BlocksOfTokens(4096 * 16)}, {1600, 100}} {
		m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "llama", Config: meshspec.BackendConfig{MaxConcurrentQueries: 2,
			LoadAware: &meshspec.LoadAware{MetricsPath: "/metrics", PrefixCacheTokens: tc.configured}}}}}
		view := nodeview.New(m, "n1")
		p := New(func() *nodeview.View { return view })
		p.Track("llama#000001", "llama", strings.TrimPrefix(srv.URL, "http://"))
		p.SetReady("llama#000001", true)
		p.scrapeOnce(context.Background())
		c := pickNow(t, p, request{blocks: longPrompt("a")})
		if got := c.replica.cache.Capacity(); got != tc.want {
			t.Errorf("prefix_cache_tokens %d: the replica's cache is taken to hold %d blocks, want %d", tc.configured, got, tc.want)
		}
	}
}
