package meshspec

import (
	"strings"
	"testing"
)

// TestRateLimitValidates: a local limit takes its requests a second, a
// burst of at least that and a header of the clients' own; each bad
// setting is refused naming its field and what to write.
func TestRateLimitValidates(t *testing.T) {
	model := func(r *RateLimit) *Model {
		return &Model{Backends: []Backend{{Name: "a", Replicas: []Replica{{Address: "10.0.0.1:80"}}}},
			Endpoints: []Endpoint{{Name: "e", Route: "/e", Traffic: map[string]float64{"a": 1}, RateLimit: r}}}
	}
	if err := model(&RateLimit{Local: &LocalRateLimit{RequestsPerSecond: 5, Burst: 10, Header: "x-tenant-id"}}).Validate(); err != nil {
		t.Fatal(err)
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
	if (LocalRateLimit{RequestsPerSecond: 5}).EffectiveBurst() != 5 || (LocalRateLimit{RequestsPerSecond: 5, Burst: 9}).EffectiveBurst() != 9 {
		t.Error("EffectiveBurst")
	}
}
