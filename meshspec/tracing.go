package meshspec

import (
	"math"
	"net"
	"strconv"
)

// Mesh holds the settings of the whole mesh, stored apart from every
// backend and endpoint (`servemesh tracing set`, or a config file's
// `mesh:`).
type Mesh struct {
	// Tracing, if set, sends every node's spans to a collector.
	Tracing *Tracing `json:"tracing,omitempty"`
}

// Tracing sends spans of every request a node's Envoy serves, on every hop
// (the caller's node, the replica's node's inbound listener), to an
// OpenTelemetry collector over OTLP/gRPC, W3C trace context (traceparent)
// propagated to the replicas. A request that arrives with a trace context
// keeps its decision (a sampled parent is traced on every hop); one
// without is traced with probability SamplingPercent (an endpoint's
// EndpointTracing overrides it for its requests).
type Tracing struct {
	// Collector is host:port of an OTLP/gRPC receiver (Jaeger v2, the
	// OpenTelemetry Collector), reached by every node's Envoy in
	// plaintext: run one on each node's loopback, or on a trusted network.
	Collector string `json:"collector"`
	// SamplingPercent is from 0 to 100; unset is DefaultSamplingPercent.
	SamplingPercent *float64 `json:"sampling_percent,omitempty"`
}

// EndpointTracing overrides the mesh's sampling for an endpoint.
type EndpointTracing struct {
	// SamplingPercent is from 0 to 100: 0 traces only the requests that
	// come with a sampled trace context.
	SamplingPercent float64 `json:"sampling_percent"`
}

// DefaultSamplingPercent is the share of requests traced when the mesh's
// tracing names none, as Istio's default.
const DefaultSamplingPercent = 1.0

// MinSamplingPercent is the finest share Envoy samples: it draws in
// ten-thousandths, so shares are rounded to steps of 0.01%.
const MinSamplingPercent = 0.01

// Sampling is the share of requests t traces, in percent.
func (t *Tracing) Sampling() float64 {
	if t.SamplingPercent == nil {
		return DefaultSamplingPercent
	}
	return *t.SamplingPercent
}

// TraceSampling is the share of e's requests traced in mesh (percent), and
// whether they are traced at all (the mesh has a collector).
func TraceSampling(mesh *Mesh, e Endpoint) (float64, bool) {
	if mesh == nil || mesh.Tracing == nil {
		return 0, false
	}
	if e.Tracing != nil {
		return e.Tracing.SamplingPercent, true
	}
	return mesh.Tracing.Sampling(), true
}

// validateMesh checks the mesh's settings; endpointTracing, the fields of
// endpoints that override the mesh's tracing, need it to have a collector.
func validateMesh(p *problems, mesh *Mesh, endpointTracing []string) {
	if mesh == nil || mesh.Tracing == nil {
		for _, field := range endpointTracing {
			p.add(field, "the mesh sends no traces: give it a collector first (servemesh tracing set --collector HOST:PORT, "+
				"or mesh.tracing.collector in a config file), or remove the endpoint's tracing")
		}
		return
	}
	t := mesh.Tracing
	switch host, port, err := net.SplitHostPort(t.Collector); {
	case t.Collector == "":
		p.add("mesh.tracing.collector", "is required: the host:port of an OTLP/gRPC collector (Jaeger, the OpenTelemetry Collector), "+
			"such as 127.0.0.1:4317; to trace nothing, remove mesh.tracing (servemesh tracing off)")
	case err != nil:
		p.add("mesh.tracing.collector", "%q is not host:port (%v); write it as 127.0.0.1:4317 or collector.example:4317", t.Collector, err)
	default:
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			p.add("mesh.tracing.collector", "port %q of %q: want a number from 1 to 65535", port, t.Collector)
		}
		if net.ParseIP(host) == nil && (len(host) > 253 || !hostName.MatchString(host)) {
			p.add("mesh.tracing.collector", "host %q of %q: want an IP address or a DNS name", host, t.Collector)
		}
	}
	if t.SamplingPercent != nil {
		validatePercent(p, "mesh.tracing.sampling_percent", *t.SamplingPercent)
	}
}

// validatePercent refuses a share that is not from 0 to 100.
func validatePercent(p *problems, field string, v float64) {
	switch {
	case math.IsNaN(v) || v < 0 || v > 100:
		p.add(field, "%v: want a percentage from 0 to 100 (1 traces one request in a hundred)", v)
	case v > 0 && v < MinSamplingPercent:
		p.add(field, "%v: Envoy samples in steps of %v%% (one request in 10,000): want 0 or at least %v", v, MinSamplingPercent, MinSamplingPercent)
	}
}

// cloneMesh is a deep copy of m.
func cloneMesh(m *Mesh) *Mesh {
	if m == nil {
		return nil
	}
	out := *m
	if m.Tracing != nil {
		t := *m.Tracing
		if t.SamplingPercent != nil {
			v := *t.SamplingPercent
			t.SamplingPercent = &v
		}
		out.Tracing = &t
	}
	return &out
}
