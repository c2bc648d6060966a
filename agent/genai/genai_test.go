package genai

import (
	"fmt"
	"io"
	"log/slog"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdata "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/servemesh/servemesh/wire"
)

func entry(t *testing.T, cluster, route string, usage map[string]any) *accesslogdata.HTTPAccessLogEntry {
	t.Helper()
	fields, err := structpb.NewStruct(usage)
	if err != nil {
		t.Fatal(err)
	}
	return &accesslogdata.HTTPAccessLogEntry{CommonProperties: &accesslogdata.AccessLogCommon{UpstreamCluster: cluster, RouteName: route,
		Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{wire.UsageMetadata: fields}}}}
}

// shadowed adds to e what the rate limit service answered: the
// descriptors a quota in shadow mode would have refused.
func shadowed(e *accesslogdata.HTTPAccessLogEntry, violations []any) *accesslogdata.HTTPAccessLogEntry {
	answer := map[string]any{"quotaModeEnabled": true}
	if violations != nil {
		answer[wire.ShadowedKey] = violations
	}
	fields, _ := structpb.NewStruct(answer)
	e.CommonProperties.Metadata.FilterMetadata[wire.RateLimitFilterMetadata] = fields
	return e
}

func TestAnswerOf(t *testing.T) {
	for _, c := range []struct {
		name  string
		e     *accesslogdata.HTTPAccessLogEntry
		want  Answer
		valid bool
	}{
		{"streamed", entry(t, "llm", "chat/match-0", map[string]any{wire.UsageTTFTKey: 120.0, wire.UsageInterTokenKey: 25.5,
			wire.UsageInputTokensKey: 12.0, wire.UsageOutputTokensKey: 40.0, wire.UsageModelKey: "tiny"}),
			Answer{Endpoint: "chat", Backend: "llm", Model: "tiny", TTFTMs: 120, InterTokenMs: 25.5, Input: 12, Output: 40}, true},
		{"whole answer, a figure as text", entry(t, "llm", "chat", map[string]any{wire.UsageTTFTKey: "300"}),
			Answer{Endpoint: "chat", Backend: "llm", TTFTMs: 300, InterTokenMs: -1}, true},
		{"not read", entry(t, "llm", "chat", map[string]any{wire.UsageTokensKey: "7"}), Answer{}, false},
		{"no backend reached", entry(t, "", "chat", map[string]any{wire.UsageTTFTKey: 1.0}), Answer{}, false},
		{"servemesh's own cluster", entry(t, "_servemesh_activator", "chat", map[string]any{wire.UsageTTFTKey: 1.0}), Answer{}, false},
		{"a negative time", entry(t, "llm", "chat", map[string]any{wire.UsageTTFTKey: -5.0}), Answer{}, false},
		{"over a quota in shadow mode", shadowed(entry(t, "llm", "chat", map[string]any{wire.UsageTTFTKey: 9.0}), []any{0.0}),
			Answer{Endpoint: "chat", Backend: "llm", TTFTMs: 9, InterTokenMs: -1, Shadowed: true}, true},
		{"within a quota in shadow mode", shadowed(entry(t, "llm", "chat", map[string]any{wire.UsageTTFTKey: 9.0}), nil),
			Answer{Endpoint: "chat", Backend: "llm", TTFTMs: 9, InterTokenMs: -1}, true},
	} {
		got, ok := AnswerOf(c.e)
		if ok != c.valid || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.valid)
		}
	}
}

func TestLoadsAreCumulativeByBound(t *testing.T) {
	r := New(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	for _, ms := range []float64{0.5, 10, 10, 50, 1e9} {
		r.Record(Answer{Backend: "llm", TTFTMs: ms, InterTokenMs: ms / 10})
	}
	r.Record(Answer{Backend: "llm", TTFTMs: 5, InterTokenMs: -1}) // not streamed
	l := r.Loads()["llm"]
	at := func(counts []uint64, ms float64) uint64 { return counts[bucket(ms)] }
	if got := at(l.TTFT, 1); got != 1 {
		t.Errorf("answers within 1 ms: %d, want 1", got)
	}
	if got := at(l.TTFT, 10); got != 4 {
		t.Errorf("answers within 10 ms: %d, want 4", got)
	}
	if got := l.TTFT[len(l.TTFT)-1]; got != 5 {
		t.Errorf("answers within the last bound: %d, want 5 (one beyond every bound)", got)
	}
	if got := l.InterToken[len(l.InterToken)-1]; got != 4 {
		t.Errorf("streamed answers within the last bound: %d, want 4 (one not streamed, one beyond)", got)
	}
	if len(l.TTFT) != len(wire.GenAIBoundsMs) || len(l.InterToken) != len(wire.GenAIBoundsMs) {
		t.Errorf("%d and %d counts, want one a bound (%d)", len(l.TTFT), len(l.InterToken), len(wire.GenAIBoundsMs))
	}
}

// A replica names whatever model it likes: a backend's labels stop at
// MaxModels, the rest counted as one.
func TestModelsAreBounded(t *testing.T) {
	r := New(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	for i := range MaxModels + 5 {
		r.Record(Answer{Backend: "llm", Model: fmt.Sprintf("m%d", i), TTFTMs: 1, InterTokenMs: -1})
	}
	r.Record(Answer{Backend: "llm", Model: "m0", TTFTMs: 1, InterTokenMs: -1})
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := len(r.models["llm"]); got != MaxModels {
		t.Errorf("%d model labels, want %d", got, MaxModels)
	}
	if got := r.modelLabel("llm", "m0"); got != "m0" {
		t.Errorf("a model labelled before is %q, want itself", got)
	}
	if got := r.modelLabel("llm", "new"); got != OtherModel {
		t.Errorf("a model past the bound is %q, want %q", got, OtherModel)
	}
}
