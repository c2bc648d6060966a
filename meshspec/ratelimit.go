package meshspec

import "strings"

// RateLimit bounds an endpoint's requests. Local is enforced by each
// node's Envoy, apart from the other nodes (an endpoint that clients
// reach through N nodes evenly takes up to N times its figure in all),
// per route: the requests that enter the mesh there (its public listener)
// and those that leave a replica there (its mesh listener) count apart,
// as do an endpoint's idempotent methods and its others (a route each)
// and each match rule's requests.
type RateLimit struct {
	Local *LocalRateLimit `json:"local,omitempty"`
}

// LocalRateLimit is a token bucket on each node (Envoy's local rate
// limit): RequestsPerSecond tokens a second, up to Burst saved (default
// RequestsPerSecond). With Header, each value of that request header (a
// tenant, an API key) has a bucket of its own, up to MaxRateLimitKeys
// values a node at once (the least recently seen forgotten); requests
// without it share one. A request over it gets 429 with Retry-After and
// the x-ratelimit-* headers.
type LocalRateLimit struct {
	RequestsPerSecond int    `json:"requests_per_second"`
	Burst             int    `json:"burst,omitempty"`
	Header            string `json:"header,omitempty"`
}

// Limits of rate limits.
const (
	MaxRequestsPerSecond = 1_000_000
	MaxRateLimitKeys     = 10_000
)

// EffectiveBurst is the tokens a bucket saves.
func (l LocalRateLimit) EffectiveBurst() int {
	if l.Burst == 0 {
		return l.RequestsPerSecond
	}
	return l.Burst
}

// validateRateLimit checks an endpoint's rate limit.
func validateRateLimit(p *problems, field string, r *RateLimit) {
	if r == nil {
		return
	}
	field += ".rate_limit"
	l := r.Local
	if l == nil {
		p.add(field, "sets no limit; give local: {requests_per_second: N}, or remove rate_limit")
		return
	}
	field += ".local"
	if l.RequestsPerSecond < 1 || l.RequestsPerSecond > MaxRequestsPerSecond {
		p.add(field+".requests_per_second", "is %d; set the requests a second each node lets through, from 1 to %d (remove rate_limit for none)", l.RequestsPerSecond, MaxRequestsPerSecond)
	}
	if l.Burst != 0 && (l.Burst < l.RequestsPerSecond || l.Burst > 10*MaxRequestsPerSecond) {
		p.add(field+".burst", "is %d; set the requests a bucket saves, from requests_per_second (%d) to %d, or leave it out for requests_per_second", l.Burst, l.RequestsPerSecond, 10*MaxRequestsPerSecond)
	}
	if h := l.Header; h != "" && (!headerName.MatchString(h) || reservedHeader(h)) {
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
	return out
}

// rateLimitsEqual reports whether two rate limits are the same.
func rateLimitsEqual(a, b *RateLimit) bool {
	if a == nil || b == nil {
		return a == b
	}
	return ptrsEqual(a.Local, b.Local)
}
