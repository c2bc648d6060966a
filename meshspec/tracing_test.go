package meshspec

import (
	"strings"
	"testing"
)

func percent(v float64) *float64 { return &v }

func TestTracingValidation(t *testing.T) {
	backend := Backend{Name: "v1", Replicas: []Replica{{Address: "127.0.0.1:9001"}}}
	withEndpoint := func(mesh *Mesh, tracing *EndpointTracing) *Model {
		return &Model{Backends: []Backend{backend}, Mesh: mesh,
			Endpoints: []Endpoint{{Name: "api", Route: "/api", Traffic: map[string]float64{"v1": 1}, Tracing: tracing}}}
	}
	for _, tc := range []struct {
		name string
		m    *Model
		want []string // every problem, in one pass; none: valid
	}{
		{"collector and default sampling", withEndpoint(&Mesh{Tracing: &Tracing{Collector: "127.0.0.1:4317"}}, nil), nil},
		{"a DNS name and an override", withEndpoint(&Mesh{Tracing: &Tracing{Collector: "otel.example:4317", SamplingPercent: percent(0)}},
			&EndpointTracing{SamplingPercent: 100}), nil},
		{"no collector", withEndpoint(&Mesh{Tracing: &Tracing{SamplingPercent: percent(5)}}, nil),
			[]string{"mesh.tracing.collector: is required", "servemesh tracing off"}},
		{"not host:port", withEndpoint(&Mesh{Tracing: &Tracing{Collector: "127.0.0.1"}}, nil),
			[]string{`mesh.tracing.collector: "127.0.0.1" is not host:port`}},
		{"bad port and host, sampling out of range", withEndpoint(&Mesh{Tracing: &Tracing{Collector: "a_b:99999", SamplingPercent: percent(101)}}, nil),
			[]string{`port "99999"`, `host "a_b"`, "mesh.tracing.sampling_percent: 101: want a percentage from 0 to 100"}},
		{"finer than Envoy samples", withEndpoint(&Mesh{Tracing: &Tracing{Collector: "127.0.0.1:4317", SamplingPercent: percent(0.005)}},
			&EndpointTracing{SamplingPercent: 0.001}),
			[]string{"mesh.tracing.sampling_percent: 0.005: Envoy samples in steps of 0.01% (one request in 10,000): want 0 or at least 0.01",
				`endpoint "api".tracing.sampling_percent: 0.001: Envoy samples`}},
		{"an endpoint's override without a collector", withEndpoint(nil, &EndpointTracing{SamplingPercent: -1}),
			[]string{`endpoint "api".tracing: the mesh sends no traces: give it a collector first (servemesh tracing set --collector HOST:PORT`,
				`endpoint "api".tracing.sampling_percent: -1: want a percentage`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v; want it valid", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted it; want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate: %v\nwant it to say %q", err, w)
				}
			}
		})
	}
}

func TestTraceSampling(t *testing.T) {
	e := Endpoint{Name: "api"}
	if _, on := TraceSampling(nil, e); on {
		t.Error("a mesh without tracing traces")
	}
	mesh := &Mesh{Tracing: &Tracing{Collector: "127.0.0.1:4317"}}
	if got, on := TraceSampling(mesh, e); !on || got != DefaultSamplingPercent {
		t.Errorf("default sampling: %v %v; want %v", got, on, DefaultSamplingPercent)
	}
	e.Tracing = &EndpointTracing{SamplingPercent: 0}
	if got, on := TraceSampling(mesh, e); !on || got != 0 {
		t.Errorf("an endpoint's 0: %v %v; want 0, traced when its callers sampled", got, on)
	}
	orig := &Model{Mesh: &Mesh{Tracing: &Tracing{Collector: "x:1", SamplingPercent: percent(3)}}}
	c := Clone(orig)
	*c.Mesh.Tracing.SamplingPercent = 4
	if got := orig.Mesh.Tracing.Sampling(); got != 3 {
		t.Errorf("Clone shares the sampling: the original's is %v", got)
	}
}
