package meshspec

import (
	"strings"
	"testing"
)

// TestRateLimitValidates: a local limit takes its requests a second, a
// burst of at least that and a header of the clients' own; a global one
// its requests a unit, a known unit and failure mode, and one key; each
// bad setting is refused naming its field and what to write.
func TestRateLimitValidates(t *testing.T) {
	model := func(r *RateLimit) *Model {
		return &Model{Backends: []Backend{{Name: "a", Replicas: []Replica{{Address: "10.0.0.1:80"}}}},
			Endpoints: []Endpoint{{Name: "e", Route: "/e", Traffic: map[string]float64{"a": 1}, RateLimit: r}}}
	}
	for _, ok := range []*RateLimit{
		{Local: &LocalRateLimit{RequestsPerSecond: 5, Burst: 10, Header: "x-tenant-id"}},
		{Global: &GlobalRateLimit{Requests: 100, Unit: "minute", Header: "x-api-key", FailureMode: FailClosed}},
		{Global: &GlobalRateLimit{Requests: 1, ClientAddress: true}, Local: &LocalRateLimit{RequestsPerSecond: 5}},
		{Tokens: &TokenQuota{Tokens: 10000, Header: "x-tenant-id"}, Global: &GlobalRateLimit{Requests: 5, FailureMode: FailClosed}},
	} {
		if err := model(ok).Validate(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		limit *RateLimit
		says  string
	}{
		{&RateLimit{}, "rate_limit: sets no limit"},
		{&RateLimit{Local: &LocalRateLimit{}}, "rate_limit.local.requests_per_second: is 0; set the requests a second each node lets through, from 1"},
		{&RateLimit{Local: &LocalRateLimit{RequestsPerSecond: MaxRequestsPerSecond + 1}}, "requests_per_second: is 1000001"},
		{&RateLimit{Local: &LocalRateLimit{RequestsPerSecond: 10, Burst: 5}}, "rate_limit.local.burst: is 5; set the requests a bucket saves, from requests_per_second (10)"},
		{&RateLimit{Local: &LocalRateLimit{RequestsPerSecond: 10, Header: "x-servemesh-priority"}}, "rate_limit.local.header: \"x-servemesh-priority\" is not a header clients send"},
		{&RateLimit{Local: &LocalRateLimit{RequestsPerSecond: 10, Header: "X-Tenant"}}, "rate_limit.local.header: \"X-Tenant\""},
		{&RateLimit{Local: &LocalRateLimit{RequestsPerSecond: 10, Header: "x-envoy-original-path"}}, "rate_limit.local.header"},
		{&RateLimit{Global: &GlobalRateLimit{}}, "rate_limit.global.requests: is 0; set the requests each second lets through every node together, from 1"},
		{&RateLimit{Global: &GlobalRateLimit{FailureMode: FailClosed}}, "rate_limit.global.requests: is 0 with failure_mode closed, which refuses every request"},
		{&RateLimit{Global: &GlobalRateLimit{Requests: MaxGlobalLimits + 1}}, "rate_limit.global.requests: is 1000000001"},
		{&RateLimit{Global: &GlobalRateLimit{Requests: 5, Unit: "week"}}, `rate_limit.global.unit: is "week"; use one of second, minute, hour, day`},
		{&RateLimit{Global: &GlobalRateLimit{Requests: 5, FailureMode: "deny"}}, `rate_limit.global.failure_mode: is "deny"; use open`},
		{&RateLimit{Global: &GlobalRateLimit{Requests: 5, Header: "x-api-key", ClientAddress: true}}, "rate_limit.global: counts by both header and client_address; choose one"},
		{&RateLimit{Global: &GlobalRateLimit{Requests: 5, Header: "x-servemesh-model"}}, `rate_limit.global.header: "x-servemesh-model" is not a header clients send that reaches the limit unchanged`},
		{&RateLimit{Global: &GlobalRateLimit{Requests: 5}, Local: &LocalRateLimit{}}, "rate_limit.local.requests_per_second: is 0"},
		{&RateLimit{Tokens: &TokenQuota{}}, "rate_limit.tokens.tokens: is 0; set the tokens each minute lets through every node together"},
		{&RateLimit{Tokens: &TokenQuota{Tokens: 0, FailureMode: FailClosed}}, "rate_limit.tokens.tokens: is 0 with failure_mode closed"},
		{&RateLimit{Tokens: &TokenQuota{Tokens: 100, Unit: "fortnight"}}, `rate_limit.tokens.unit: is "fortnight"`},
		{&RateLimit{Tokens: &TokenQuota{Tokens: 100, Header: "x-envoy-foo"}}, `rate_limit.tokens.header: "x-envoy-foo"`},
		{&RateLimit{Tokens: &TokenQuota{Tokens: 100, PerModel: true}}, "rate_limit.tokens.per_model: is set, but the endpoint does not route by model (model_routing)"},
		{&RateLimit{Tokens: &TokenQuota{Tokens: 100, Weights: TokenWeights{Input: -1, Output: 1}}}, "rate_limit.tokens.weights.input: is -1; weigh a token from 0 to 1000"},
		{&RateLimit{Tokens: &TokenQuota{Tokens: 100, Weights: TokenWeights{Output: 1001}}}, "rate_limit.tokens.weights.output: is 1001"},
		{&RateLimit{Tokens: &TokenQuota{Tokens: 100, Weights: TokenWeights{Cached: 1}}}, "rate_limit.tokens.weights: weighs neither input nor output tokens"},
	} {
		err := model(c.limit).Validate()
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: got %v, want %q", c.limit, err, c.says)
		}
	}
	r := &RateLimit{Local: &LocalRateLimit{RequestsPerSecond: 5}}
	c := cloneRateLimit(r)
	c.Local.RequestsPerSecond = 6
	if r.Local.RequestsPerSecond != 5 || rateLimitsEqual(r, c) || !rateLimitsEqual(r, cloneRateLimit(r)) {
		t.Error("cloneRateLimit shares its limit, or rateLimitsEqual misses a change")
	}
	g := &RateLimit{Global: &GlobalRateLimit{Requests: 5}}
	gc := cloneRateLimit(g)
	gc.Global.Requests = 6
	if g.Global.Requests != 5 || rateLimitsEqual(g, gc) || !rateLimitsEqual(g, cloneRateLimit(g)) {
		t.Error("cloneRateLimit shares its global limit, or rateLimitsEqual misses a change")
	}
	q := &RateLimit{Tokens: &TokenQuota{Tokens: 5}}
	if qc := cloneRateLimit(q); rateLimitsEqual(q, &RateLimit{Tokens: &TokenQuota{Tokens: 6}}) || !rateLimitsEqual(q, qc) || qc.Tokens == q.Tokens {
		t.Error("cloneRateLimit shares its token quota, or rateLimitsEqual misses a change")
	}
	if (TokenQuota{}).EffectiveUnit() != "minute" || !(TokenQuota{FailureMode: FailClosed}).Closed() {
		t.Error("TokenQuota's EffectiveUnit or Closed")
	}
	if (GlobalRateLimit{}).EffectiveUnit() != UnitSecond || (GlobalRateLimit{}).Closed() || !(GlobalRateLimit{FailureMode: FailClosed}).Closed() {
		t.Error("EffectiveUnit or Closed")
	}
	if (LocalRateLimit{RequestsPerSecond: 5}).EffectiveBurst() != 5 || (LocalRateLimit{RequestsPerSecond: 5, Burst: 9}).EffectiveBurst() != 9 {
		t.Error("EffectiveBurst")
	}
}
