package tracing

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/servemesh/servemesh/meshspec"
)

// sampledParent and unsampledParent are trace contexts as Envoy sends them.
const (
	sampledParent   = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	unsampledParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
)

func percent(v float64) *float64 { return &v }

func carrier(traceparent string) propagation.TextMapCarrier {
	h := http.Header{}
	if traceparent != "" {
		h.Set("traceparent", traceparent)
	}
	return propagation.HeaderCarrier(h)
}

// TestTracerFollowsTheMesh: spans are recorded only while the mesh names a
// collector, sampled as their parent was or, without one, at the mesh's
// rate, and stop for good at Shutdown.
func TestTracerFollowsTheMesh(t *testing.T) {
	var mesh atomic.Pointer[meshspec.Tracing]
	tr := New("servemesh-test", mesh.Load, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	recording := func(traceparent string) (bool, trace.SpanContext) {
		_, span := tr.Start(t.Context(), "pick b", carrier(traceparent), trace.SpanKindInternal)
		defer span.End()
		return span.IsRecording(), span.SpanContext()
	}
	if rec, _ := recording(sampledParent); rec {
		t.Fatal("a span was recorded while the mesh names no collector")
	}
	mesh.Store(&meshspec.Tracing{Collector: "127.0.0.1:1", SamplingPercent: percent(0)})
	rec, sc := recording(sampledParent)
	if !rec || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || !sc.IsSampled() {
		t.Fatalf("a sampled parent's child: recording %v, context %v; want recorded in the parent's trace", rec, sc)
	}
	if rec, _ := recording(unsampledParent); rec {
		t.Fatal("an unsampled parent's child was recorded")
	}
	if rec, _ := recording(""); rec {
		t.Fatal("a root span was recorded at 0% sampling")
	}
	mesh.Store(&meshspec.Tracing{Collector: "127.0.0.1:2", SamplingPercent: percent(100)})
	if rec, _ := recording(""); !rec {
		t.Fatal("a root span was not recorded at 100% sampling: the tracer did not follow the mesh's new setting")
	}
	// The provider's tracers (for otelhttp) follow the same setting.
	_, span := tr.Provider().Tracer("x").Start(t.Context(), "GET /v1/status")
	if !span.IsRecording() {
		t.Fatal("the provider's tracer did not record at 100% sampling")
	}
	span.End()
	mesh.Store(nil)
	if rec, _ := recording(sampledParent); rec {
		t.Fatal("a span was recorded after the mesh's tracing was turned off")
	}
	mesh.Store(&meshspec.Tracing{Collector: "127.0.0.1:2", SamplingPercent: percent(100)})
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Logf("shutdown: %v", err) // no collector listens: what was not sent is dropped
	}
	if rec, _ := recording(sampledParent); rec {
		t.Fatal("a span was recorded after Shutdown")
	}
}

// TestNilTracer: a part given no tracer starts no-op spans.
func TestNilTracer(t *testing.T) {
	var tr *Tracer
	_, span := tr.Start(t.Context(), "hold b", carrier(sampledParent), trace.SpanKindInternal)
	if span.IsRecording() {
		t.Fatal("a nil tracer recorded a span")
	}
	span.End()
}
