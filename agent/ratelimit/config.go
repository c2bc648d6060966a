package ratelimit

import (
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// serviceConfig is envoyproxy/ratelimit's configuration file: one domain,
// its descriptors.
type serviceConfig struct {
	Domain      string       `json:"domain"`
	Descriptors []descriptor `json:"descriptors"`
}

// descriptor matches a request's descriptor entry by key (and value, if
// set): its rate limit counts the requests whose descriptor ends there,
// its descriptors those that go on.
type descriptor struct {
	Key         string       `json:"key"`
	Value       string       `json:"value,omitempty"`
	RateLimit   *limit       `json:"rate_limit,omitempty"`
	Descriptors []descriptor `json:"descriptors,omitempty"`
}

type limit struct {
	Unit            string `json:"unit"`
	RequestsPerUnit int    `json:"requests_per_unit"`
}

// Config renders the service's configuration for m: each endpoint with a
// global limit counts its requests (per value of its header or client
// address, if it counts by either; the requests without the header
// together), in its unit. nil m: no limit.
func Config(m *meshspec.Model) ([]byte, error) {
	c := serviceConfig{Domain: wire.RateLimitDomain, Descriptors: []descriptor{}}
	if m != nil {
		for _, e := range m.Endpoints {
			if e.RateLimit == nil || e.RateLimit.Global == nil {
				continue
			}
			g := e.RateLimit.Global
			l := &limit{Unit: g.EffectiveUnit(), RequestsPerUnit: g.Requests}
			d := descriptor{Key: wire.RateLimitEndpointKey, Value: e.Name, RateLimit: l}
			switch {
			case g.Header != "":
				d.Descriptors = []descriptor{{Key: wire.RateLimitHeaderKey, RateLimit: l}}
			case g.ClientAddress:
				d.Descriptors = []descriptor{{Key: wire.RateLimitAddressKey, RateLimit: l}}
			}
			c.Descriptors = append(c.Descriptors, d)
		}
	}
	slices.SortFunc(c.Descriptors, func(a, b descriptor) int { return strings.Compare(a.Value, b.Value) })
	out, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("rate limit service config: %w", err)
	}
	return out, nil
}
