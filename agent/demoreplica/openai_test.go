package demoreplica

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestModelServerAnswersInOpenAIsShape: an answer has an id, a choice and
// its usage (the prompt's bytes / 4, max_tokens); a streamed one is
// server-sent chunks, a token each, the last with usage when asked, then
// [DONE].
func TestModelServerAnswersInOpenAIsShape(t *testing.T) {
	s := httptest.NewServer(&ModelServer{Backend: "llm", Name: "r1", Slots: 4})
	defer s.Close()
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`
	resp, err := post(s.URL+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	var a ModelAnswer
	err = json.NewDecoder(resp.Body).Decode(&a)
	_ = resp.Body.Close()
	want := Usage{PromptTokens: PromptTokens([]byte(body)), CompletionTokens: 5, TotalTokens: PromptTokens([]byte(body)) + 5}
	if err != nil || !strings.HasPrefix(a.ID, "chatcmpl-") || a.Object != "chat.completion" || len(a.Choices) != 1 || a.Choices[0].Message == nil ||
		a.Usage == nil || *a.Usage != want || a.Model != "m" {
		t.Fatalf("answer %+v (%v); want OpenAI's shape with usage %+v", a, err, want)
	}
	streamed := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":3}`
	resp, err = post(s.URL+"/v1/chat/completions", streamed)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var events []string
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range strings.Split(strings.TrimSpace(string(raw)), "\n\n") {
		events = append(events, strings.TrimPrefix(e, "data: "))
	}
	if resp.Header.Get("Content-Type") != "text/event-stream" || len(events) != 5 || events[4] != "[DONE]" {
		t.Fatalf("streamed answer (%s): %q; want 3 chunks, usage, [DONE]", resp.Header.Get("Content-Type"), events)
	}
	var last struct{ Usage *Usage }
	if err := json.Unmarshal([]byte(events[3]), &last); err != nil || last.Usage == nil || last.Usage.CompletionTokens != 3 ||
		last.Usage.TotalTokens != PromptTokens([]byte(streamed))+3 {
		t.Fatalf("the last chunk %s: want its usage", events[3])
	}
}

func post(url, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}
