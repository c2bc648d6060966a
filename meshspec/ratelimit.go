package meshspec

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/servemesh/servemesh/wire"
)

// RateLimit bounds an endpoint's requests. Local is enforced by each
// node's Envoy, apart from the other nodes (an endpoint that clients
// reach through N nodes evenly takes up to N times its figure in all),
// per route: the requests that enter the mesh there (its public listener)
// and those that leave a replica there (its mesh listener) count apart,
// as do an endpoint's idempotent methods and its others (a route each)
// and each match rule's requests.
//
// Global is shared by every node: each node's Envoy asks its node's rate
// limit service (Envoy's, envoyproxy/ratelimit, run by the agent), which
// counts in a store every node shares (Redis), so N a second is N across
// the mesh. An endpoint may have both: a request then passes each.
//
// Tokens is a quota of model tokens, shared like Global: counted from the
// usage the model servers answer with, charged when an answer ends and
// checked before the next request.
type RateLimit struct {
	// Local is a bucket on each node.
	Local *LocalRateLimit `json:"local,omitempty"`
	// Global is a count every node shares.
	Global *GlobalRateLimit `json:"global,omitempty"`
	// Tokens is a quota of model tokens every node shares.
	Tokens *TokenQuota `json:"tokens,omitempty"`
}

// LocalRateLimit is a token bucket on each node (Envoy's local rate
// limit): RequestsPerSecond tokens a second, up to Burst saved (default
// RequestsPerSecond). With Header, each value of that request header (a
// tenant, an API key) has a bucket of its own, up to MaxRateLimitKeys
// values a node at once (the least recently seen forgotten); requests
// without it share one. A request over it gets 429 with Retry-After and
// the x-ratelimit-* headers.
type LocalRateLimit struct {
	// RequestsPerSecond is the bucket's refill.
	RequestsPerSecond int `json:"requests_per_second"`
	// Burst is what it saves up (default RequestsPerSecond).
	Burst int `json:"burst,omitempty"`
	// Header, if set, gives each of its values a bucket of its own.
	Header string `json:"header,omitempty"`
}

// GlobalRateLimit lets Requests a Unit (a fixed window: second, the
// default, minute, hour or day) through every node together. With Header,
// each value of that request header (a tenant, an API key) has its own
// count; with ClientAddress, each client address (the public listener's
// peer; on a mesh listener, the calling replica's node); requests without
// the header share the endpoint's count. FailureMode is what a node does
// while its rate limit service cannot answer (down, or its store is):
// "open" (the default) lets requests through, "closed" refuses them (500).
// A request over it gets 429 with Retry-After and the x-ratelimit-*
// headers.
type GlobalRateLimit struct {
	// Requests are let through a Unit.
	Requests int `json:"requests"`
	// Unit is the window: second (the default), minute, hour or day.
	Unit string `json:"unit,omitempty"`
	// Header, if set, gives each of its values a count of its own.
	Header string `json:"header,omitempty"`
	// ClientAddress gives each client address a count of its own.
	ClientAddress bool `json:"client_address,omitempty"`
	// FailureMode is open (the default) or closed.
	FailureMode string `json:"failure_mode,omitempty"`
}

// TokenQuota lets Tokens model tokens a Unit (default minute) through
// every node together, per value of Header if set (a tenant, an API key;
// the requests without it share the endpoint's quota). An answer's tokens
// are its usage.total_tokens, OpenAI's: a JSON answer's, or a streamed
// answer's last chunk's (the client asks for it with
// stream_options.include_usage); an answer without usage costs none. A
// request is refused with 429 once the tokens already answered reach the
// quota: the answer that crosses it is served whole. FailureMode is as
// GlobalRateLimit's.
type TokenQuota struct {
	// Tokens are let through a Unit.
	Tokens int `json:"tokens"`
	// Unit is the window: minute (the default), second, hour or day.
	Unit string `json:"unit,omitempty"`
	// Header, if set, gives each of its values a quota of its own.
	Header string `json:"header,omitempty"`
	// FailureMode is open (the default) or closed.
	FailureMode string `json:"failure_mode,omitempty"`
	// Weights, if set, make an answer's cost a weighted sum of its tokens
	// instead of its total, as Envoy AI Gateway's budgets weigh them.
	Weights TokenWeights `json:"weights,omitzero"`
	// PerModel gives each model of a model-routed endpoint (model_routing)
	// a quota of its own (per value of Header too, if set): the model is
	// read from the request's body before its quota is checked.
	PerModel bool `json:"per_model,omitempty"`
	// Shadow counts the quota without enforcing it: a request it would
	// refuse passes, and is counted as a would-be refusal (the agents'
	// servemesh_token_quota_shadow_refusals_total, and servemesh status).
	Shadow bool `json:"shadow,omitempty"`
}

// TokenWeights weigh an answer's tokens (OpenAI's usage): Input its
// prompt tokens the server did not serve from its prefix cache
// (prompt_tokens less prompt_tokens_details.cached_tokens), Cached those
// it did, Output its completion tokens. The cost is rounded up; an
// answer that states neither its prompt nor its completion tokens costs
// its total_tokens.
type TokenWeights struct {
	Input  float64 `json:"input,omitempty"`
	Output float64 `json:"output,omitempty"`
	Cached float64 `json:"cached,omitempty"`
}

// MaxTokenWeight bounds each of TokenWeights.
const MaxTokenWeight = 1000

// EffectiveUnit is the window a token quota counts in.
func (q TokenQuota) EffectiveUnit() string {
	if q.Unit == "" {
		return "minute"
	}
	return q.Unit
}

// Closed reports whether requests are refused while the quota cannot be
// checked.
func (q TokenQuota) Closed() bool { return q.FailureMode == FailClosed }

// The units and failure modes of a global rate limit.
const (
	UnitSecond      = "second"
	FailOpen        = "open"
	FailClosed      = "closed"
	MaxGlobalLimits = 1_000_000_000
)

// RateLimitUnits are the units a global rate limit counts in.
var RateLimitUnits = []string{UnitSecond, "minute", "hour", "day"}

// EffectiveUnit is the window a global limit counts in.
func (g GlobalRateLimit) EffectiveUnit() string {
	if g.Unit == "" {
		return UnitSecond
	}
	return g.Unit
}

// Closed reports whether requests are refused while the limit cannot be
// checked.
func (g GlobalRateLimit) Closed() bool { return g.FailureMode == FailClosed }

// Limits of rate limits.
const (
	MaxRequestsPerSecond = 1_000_000
	MaxRateLimitKeys     = wire.MaxRateLimitKeys
)

// EffectiveBurst is the tokens a bucket saves.
func (l LocalRateLimit) EffectiveBurst() int {
	if l.Burst == 0 {
		return l.RequestsPerSecond
	}
	return l.Burst
}

// validateRateLimit checks an endpoint's rate limit.
func validateRateLimit(p *problems, field string, r *RateLimit, modelRouted bool) {
	if r == nil {
		return
	}
	field += ".rate_limit"
	if r.Local == nil && r.Global == nil && r.Tokens == nil {
		p.add(field, "sets no limit; give local: {requests_per_second: N}, global: {requests: N, unit: second} or tokens: {tokens: N, unit: minute}, or remove rate_limit")
		return
	}
	if q := r.Tokens; q != nil {
		validateWindow(p, field+".tokens", "tokens", q.Tokens, q.EffectiveUnit(), q.Unit, q.FailureMode)
		validateLimitHeader(p, field+".tokens", q.Header)
		validateTokenWeights(p, field+".tokens.weights", q.Weights)
		if q.PerModel && !modelRouted {
			p.add(field+".tokens.per_model", "is set, but the endpoint does not route by model (model_routing), so a request's model is not known before its quota is checked; route by model, or remove per_model")
		}
	}
	if r.Global != nil {
		validateGlobalRateLimit(p, field+".global", *r.Global)
	}
	if r.Local != nil {
		validateLocalRateLimit(p, field+".local", *r.Local)
	}
}

// validateTokenWeights checks a token quota's weights, if set.
func validateTokenWeights(p *problems, field string, w TokenWeights) {
	for _, f := range []struct {
		name string
		v    float64
	}{{"input", w.Input}, {"output", w.Output}, {"cached", w.Cached}} {
		if !(f.v >= 0 && f.v <= MaxTokenWeight) {
			p.add(field+"."+f.name, "is %v; weigh a token from 0 to %d (1 counts it as it is)", f.v, MaxTokenWeight)
		}
	}
	if w != (TokenWeights{}) && w.Input == 0 && w.Output == 0 {
		p.add(field, "weighs neither input nor output tokens, so only cached prompt tokens would cost; set input or output above 0, or remove weights to count total_tokens")
	}
}

// validateLocalRateLimit checks a local rate limit.
func validateLocalRateLimit(p *problems, field string, l LocalRateLimit) {
	if l.RequestsPerSecond < 1 || l.RequestsPerSecond > MaxRequestsPerSecond {
		p.add(field+".requests_per_second", "is %d; set the requests a second each node lets through, from 1 to %d (remove rate_limit for none)", l.RequestsPerSecond, MaxRequestsPerSecond)
	}
	if l.Burst != 0 && (l.Burst < l.RequestsPerSecond || l.Burst > 10*MaxRequestsPerSecond) {
		p.add(field+".burst", "is %d; set the requests a bucket saves, from requests_per_second (%d) to %d, or leave it out for requests_per_second", l.Burst, l.RequestsPerSecond, 10*MaxRequestsPerSecond)
	}
	validateLimitHeader(p, field, l.Header)
}

// validateGlobalRateLimit checks a global rate limit.
func validateGlobalRateLimit(p *problems, field string, g GlobalRateLimit) {
	validateWindow(p, field, "requests", g.Requests, g.EffectiveUnit(), g.Unit, g.FailureMode)
	if g.Header != "" && g.ClientAddress {
		p.add(field, "counts by both header and client_address; choose one (a count per header value, or per client address)")
	}
	validateLimitHeader(p, field, g.Header)
}

// validateWindow checks what a global limit and a token quota share: n
// (their field name) a unit, and what happens when it cannot be checked.
func validateWindow(p *problems, field, name string, n int, effectiveUnit, unit, failureMode string) {
	switch {
	case n == 0 && failureMode == FailClosed:
		p.add(field+"."+name, "is 0 with failure_mode closed, which refuses every request; set the %s each %s lets through, from 1 to %d (remove rate_limit for none)", name, effectiveUnit, MaxGlobalLimits)
	case n < 1 || n > MaxGlobalLimits:
		p.add(field+"."+name, "is %d; set the %s each %s lets through every node together, from 1 to %d (remove rate_limit for none)", n, name, effectiveUnit, MaxGlobalLimits)
	}
	if unit != "" && !slices.Contains(RateLimitUnits, unit) {
		p.add(field+".unit", "is %.40q; use one of %s", unit, strings.Join(RateLimitUnits, ", "))
	}
	if failureMode != "" && failureMode != FailOpen && failureMode != FailClosed {
		p.add(field+".failure_mode", "is %.40q; use open (let requests through while the limit cannot be checked, the default) or closed (refuse them)", failureMode)
	}
}

// validateLimitHeader checks the header a limit counts by, if any.
func validateLimitHeader(p *problems, field, h string) {
	if h != "" && (!headerName.MatchString(h) || reservedHeader(h)) {
		p.add(field+".header", "%.80q is not a header clients send that reaches the limit unchanged (servemesh sets or strips x-servemesh-*, Envoy x-envoy-*); name a lower-case header such as x-tenant-id or x-api-key", h)
	}
}

// reservedHeader reports whether h is a header servemesh or Envoy sets,
// replaces or strips on the way in, or a hop-by-hop one.
func reservedHeader(h string) bool {
	switch h {
	case "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host":
		return true
	}
	return strings.HasPrefix(h, "x-servemesh-") || strings.HasPrefix(h, "x-envoy-")
}

// cloneRateLimit returns a deep copy of r.
func cloneRateLimit(r *RateLimit) *RateLimit {
	if r == nil {
		return nil
	}
	out := &RateLimit{}
	if r.Local != nil {
		l := *r.Local
		out.Local = &l
	}
	if r.Global != nil {
		g := *r.Global
		out.Global = &g
	}
	if r.Tokens != nil {
		q := *r.Tokens
		out.Tokens = &q
	}
	return out
}

// rateLimitsEqual reports whether two rate limits are the same.
func rateLimitsEqual(a, b *RateLimit) bool {
	if a == nil || b == nil {
		return a == b
	}
	return ptrsEqual(a.Local, b.Local) && ptrsEqual(a.Global, b.Global) && ptrsEqual(a.Tokens, b.Tokens)
}

// CountedLimits identifies the limits of e that the nodes' rate limit
// services count (its global rate limit and token quota), "" when it has
// none: what a node reports its service has loaded, compared with the
// stored endpoint's.
func (e Endpoint) CountedLimits() string {
	if e.RateLimit == nil || e.RateLimit.Global == nil && e.RateLimit.Tokens == nil {
		return ""
	}
	b, _ := json.Marshal(RateLimit{Global: e.RateLimit.Global, Tokens: e.RateLimit.Tokens}) // plain fields: no error
	return string(b)
}
