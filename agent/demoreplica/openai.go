package demoreplica

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// The stand-in model server answers in OpenAI's chat completion shape
// (what vLLM serves): an id, choices and usage, or, for a request with
// "stream": true, server-sent events of chunks, the last one's usage
// (with stream_options.include_usage), then [DONE]. Its tokens are made
// up deterministically: a prompt is (its body's bytes + 3) / 4 tokens
// (PromptTokens), an answer max_tokens (default DefaultCompletionTokens).

// DefaultCompletionTokens is an answer's tokens when the request gives
// no max_tokens.
const DefaultCompletionTokens = 16

// PromptTokens is the prompt tokens the stand-in counts for a request
// body.
func PromptTokens(body []byte) int { return (len(body) + 3) / 4 }

// Usage is an answer's token counts, as OpenAI's.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Choice is one of an answer's choices: a whole message, or a streamed
// chunk's delta.
type Choice struct {
	Index        int      `json:"index"`
	Message      *Message `json:"message,omitempty"`
	Delta        *Message `json:"delta,omitempty"`
	FinishReason *string  `json:"finish_reason"`
}

// Message is a choice's text.
type Message struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

// chatRequest is what the stand-in reads of a request body.
type chatRequest struct {
	Model         string `json:"model"`
	MaxTokens     int    `json:"max_tokens"`
	Stream        bool   `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

var answerIDs atomic.Uint64

// usageOf is the usage of an answer to body.
func usageOf(req chatRequest, body []byte) Usage {
	completion := req.MaxTokens
	if completion <= 0 {
		completion = DefaultCompletionTokens
	}
	prompt := PromptTokens(body)
	return Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// openAIAnswer fills a's OpenAI fields.
func openAIAnswer(a *ModelAnswer, u Usage) {
	stop := "stop"
	a.ID, a.Object, a.Created = "chatcmpl-"+strconv.FormatUint(answerIDs.Add(1), 10), "chat.completion", time.Now().Unix()
	a.Choices = []Choice{{Message: &Message{Role: "assistant", Content: fmt.Sprintf("answer of %s from %s", a.Model, a.Backend)}, FinishReason: &stop}}
	a.Usage = &u
}

// streamAnswer writes a's answer as server-sent events: a chunk a token,
// flushed as it goes, the last one with usage if asked, then [DONE].
func streamAnswer(w http.ResponseWriter, a ModelAnswer, req chatRequest, u Usage, interval time.Duration) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	flusher, _ := w.(http.Flusher)
	id, created := "chatcmpl-"+strconv.FormatUint(answerIDs.Add(1), 10), time.Now().Unix()
	send := func(v any) {
		b, _ := json.Marshal(v)
		_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	type chunk struct {
		ID      string   `json:"id"`
		Object  string   `json:"object"`
		Created int64    `json:"created"`
		Model   string   `json:"model"`
		Backend string   `json:"backend"`
		Choices []Choice `json:"choices"`
		Usage   *Usage   `json:"usage,omitempty"`
	}
	for i := range u.CompletionTokens {
		if i > 0 && interval > 0 {
			time.Sleep(interval)
		}
		c := chunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: a.Model, Backend: a.Backend,
			Choices: []Choice{{Delta: &Message{Content: "token" + strconv.Itoa(i) + " "}}}}
		if i == u.CompletionTokens-1 {
			stop := "stop"
			c.Choices[0].FinishReason = &stop
		}
		send(c)
	}
	if req.StreamOptions.IncludeUsage {
		send(chunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: a.Model, Backend: a.Backend, Choices: []Choice{}, Usage: &u})
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
}
