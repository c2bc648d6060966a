package ratelimit

import (
	"cmp"
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
	// QuotaMode counts without refusing: a request over the limit passes,
	// and the service names the descriptor it would have refused in its
	// answer's metadata (a token quota's shadow mode, wire.ShadowedKey).
	QuotaMode bool `json:"quota_mode,omitempty"`
}

type limit struct {
	Unit            string `json:"unit"`
	RequestsPerUnit int    `json:"requests_per_unit"`
}

// Config renders the service's configuration for m: each endpoint with a
// global limit counts its requests (per value of its header or client
// address, if it counts by either; the requests without the header
// together), in its unit; each with a token quota, its answers' tokens
// (or their weighted cost), the same way, counted without refusing in
// shadow mode. nil m: no limit.
func Config(m *meshspec.Model) ([]byte, error) {
	c := serviceConfig{Domain: wire.RateLimitDomain, Descriptors: []descriptor{}}
	if m != nil {
		for _, e := range m.Endpoints {
			if e.RateLimit == nil {
				continue
			}
			if g := e.RateLimit.Global; g != nil {
				nested := ""
				switch {
				case g.Header != "":
					nested = wire.RateLimitHeaderKey
				case g.ClientAddress:
					nested = wire.RateLimitAddressKey
				}
				c.Descriptors = append(c.Descriptors, endpointDescriptor(wire.RateLimitEndpointKey, e.Name, nested,
					limit{Unit: g.EffectiveUnit(), RequestsPerUnit: g.Requests}))
			}
			if q := e.RateLimit.Tokens; q != nil {
				nested := ""
				if q.Header != "" {
					nested = wire.RateLimitHeaderKey
				}
				l := limit{Unit: q.EffectiveUnit(), RequestsPerUnit: q.Tokens}
				d := endpointDescriptor(wire.RateLimitTokensKey, e.Name, nested, l)
				if q.PerModel {
					perModel(&d, l)
				}
				if q.Shadow {
					quotaMode(&d)
				}
				c.Descriptors = append(c.Descriptors, d)
			}
		}
	}
	slices.SortFunc(c.Descriptors, func(a, b descriptor) int {
		return cmp.Or(strings.Compare(a.Value, b.Value), strings.Compare(a.Key, b.Key))
	})
	out, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("rate limit service config: %w", err)
	}
	return out, nil
}

// perModel counts each model of d's requests apart (a request's model is
// its descriptor's last entry), with or without the header d counts by.
func perModel(d *descriptor, l limit) {
	for i := range d.Descriptors {
		d.Descriptors[i].Descriptors = []descriptor{{Key: wire.RateLimitModelKey, RateLimit: &l}}
	}
	d.Descriptors = append(d.Descriptors, descriptor{Key: wire.RateLimitModelKey, RateLimit: &l})
}

// quotaMode puts d and every descriptor under it in quota mode.
func quotaMode(d *descriptor) {
	d.QuotaMode = true
	for i := range d.Descriptors {
		quotaMode(&d.Descriptors[i])
	}
}

// endpointDescriptor counts an endpoint's requests (or tokens) by key,
// and, if nested is set, each value of nested apart, at the same limit.
func endpointDescriptor(key, endpoint, nested string, l limit) descriptor {
	d := descriptor{Key: key, Value: endpoint, RateLimit: &l}
	if nested != "" {
		d.Descriptors = []descriptor{{Key: nested, RateLimit: &l}}
	}
	return d
}
