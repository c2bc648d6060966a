package wire

import "math"

// GenAI signals (xds/translate's usage.go, agent/genai): on the routes of
// an endpoint that serves model traffic, the calling node's Envoy reads
// each answer as it passes (the answer reader, a Lua filter that neither
// buffers nor delays it) into dynamic metadata (UsageMetadata): its
// tokens as the answer states them, the model it names, the time to its
// first byte and, when it streams, the mean time between its tokens. The
// node's access log service sends the agent, on GenAISocket in the
// Envoy's folder (cluster GenAICluster), the entry of every answer so
// read; the agent keeps the histograms (OpenTelemetry's gen_ai.server.*
// signals, per endpoint, backend and model) and reports them per backend
// in its Load (Load.GenAI), where rollouts judge a candidate by them. The
// request's span carries them as gen_ai.* attributes.
const (
	GenAISocket  = "genai.sock"
	GenAICluster = "_servemesh_genai"
	// GenAILogName is the access log service's log name for the entries.
	GenAILogName = "servemesh.genai"

	// Keys under UsageMetadata besides UsageTokensKey: the time the
	// request started (ms, the reader's own), the answer's model, input
	// and output tokens, time to first byte (ms) and mean time between
	// tokens (ms, a streamed answer of two tokens or more only).
	UsageStartKey        = "start_ms"
	UsageModelKey        = "model"
	UsageInputTokensKey  = "input_tokens"
	UsageOutputTokensKey = "output_tokens"
	UsageTTFTKey         = "ttft_ms"
	UsageInterTokenKey   = "inter_token_ms"
	// UsageCostKey is an answer's weighted cost, where its endpoint's
	// token quota weighs its tokens (charged instead of UsageTokensKey).
	UsageCostKey = "cost"
)

// A token quota in shadow mode (meshspec.TokenQuota.Shadow) refuses
// nothing: the node's rate limit service answers that a request passes
// and, in its answer's metadata, which of its descriptors it would have
// refused (ShadowedKey, a list), which Envoy's rate limit filter keeps in
// the request's dynamic metadata (RateLimitFilterMetadata); the node's
// agent counts those requests from the access log service's entries.
const (
	RateLimitFilterMetadata = "envoy.filters.http.ratelimit"
	ShadowedKey             = "quotaModeViolations"
)

// The spans' attributes of the GenAI signals (OpenTelemetry's semantic
// conventions for generative AI).
const (
	TagGenAIModel        = "gen_ai.request.model"
	TagGenAIInputTokens  = "gen_ai.usage.input_tokens"
	TagGenAIOutputTokens = "gen_ai.usage.output_tokens"
)

// GenAIBoundsMs are the bounds of the GenAI histograms a Load reports:
// about 8% apart from 1 ms to 10 minutes, so a percentile read from them
// (interpolated within its bucket) is within a few percent, fine enough
// to tell a candidate whose tokens come 20% slower.
var GenAIBoundsMs = genAIBounds()

func genAIBounds() []float64 {
	var out []float64
	for v := 1.0; v <= 600000; v *= 1.08 {
		b := math.Round(v*10) / 10
		if len(out) == 0 || b > out[len(out)-1] {
			out = append(out, b)
		}
	}
	return out
}

// GenAILoad is one backend's GenAI histograms on one node, since its
// agent started: the answers whose time to first byte, and whose mean
// time between tokens, were at most each of GenAIBoundsMs (cumulative,
// one count a bound).
type GenAILoad struct {
	TTFT       []uint64 `json:"ttft"`
	InterToken []uint64 `json:"inter_token"`
}
