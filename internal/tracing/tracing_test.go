package tracing

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

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

// collector is an OTLP/gRPC trace collector on loopback that takes every
// export.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
}

func (collector) Export(context.Context, *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// TestTracerSaysWhenItsSpansCannotBeSent: while the mesh's collector
// cannot be reached, the tracer's Problem says so, naming it; once spans
// go through again it says nothing. Nothing is said before a span is sent,
// nor while the mesh traces nothing.
func TestTracerSaysWhenItsSpansCannotBeSent(t *testing.T) {
	dead, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	_ = dead.Close() // nothing listens there now
	var mesh atomic.Pointer[meshspec.Tracing]
	tr := New("servemesh-test", mesh.Load, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	if p := tr.Problem(); p != "" {
		t.Fatalf("tracing off, yet a problem: %s", p)
	}
	// send sends a span and waits until its export has ended, one way or
	// the other (the SDK's flush returns when it has).
	send := func() {
		t.Helper()
		_, span := tr.Start(t.Context(), "pick b", carrier(sampledParent), trace.SpanKindInternal)
		span.End()
		ctx, cancel := context.WithTimeout(t.Context(), 3*ExportGiveUp)
		defer cancel()
		if err := tr.now.Load().provider.ForceFlush(ctx); ctx.Err() != nil {
			t.Fatalf("the export did not end within %v: %v", 3*ExportGiveUp, err)
		}
	}
	mesh.Store(&meshspec.Tracing{Collector: deadAddr, SamplingPercent: percent(100)})
	if _, span := tr.Start(t.Context(), "pick b", carrier(sampledParent), trace.SpanKindInternal); span != nil {
		span.End() // switches to the collector; nothing sent yet
	}
	if p := tr.Problem(); p != "" {
		t.Fatalf("nothing sent yet, yet a problem: %s", p)
	}
	send()
	if p := tr.Problem(); !strings.Contains(p, "cannot be sent to the mesh's collector "+deadAddr) {
		t.Fatalf("spans to a collector nothing listens on: problem %q; want it named", p)
	}

	lis, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, collector{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	mesh.Store(&meshspec.Tracing{Collector: lis.Addr().String(), SamplingPercent: percent(100)})
	send()
	if p := tr.Problem(); p != "" {
		t.Fatalf("spans sent to a collector that takes them, yet a problem: %s", p)
	}
}
