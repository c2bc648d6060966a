// Package tracing is servemesh's own processes' part in a request's
// trace. The nodes' Envoys start and carry every trace (xds/translate);
// the agent's picker and activator and the controller's API add their
// spans to it with the OpenTelemetry Go SDK, sent over OTLP/gRPC to the
// collector the mesh's tracing names (meshspec.Tracing). A Tracer follows
// that setting as it changes, reading it when a span starts: no
// collector, no spans (the SDK's no-op), a new one, a new exporter.
//
// A span whose parent came with the request (W3C traceparent, in HTTP
// headers or gRPC metadata) is sampled as its parent was, so the agent's
// spans appear exactly in the traces Envoy sampled; a span with no parent
// (a CLI call to the controller) is sampled at the mesh's rate.
package tracing

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/metadata"

	"github.com/servemesh/servemesh/meshspec"
)

// Propagator reads and writes a trace's context: W3C traceparent and
// tracestate, what Envoy's OpenTelemetry tracer sends.
var Propagator = propagation.TraceContext{}

// MetadataCarrier reads and writes a trace context in gRPC metadata (what
// Envoy's gRPC clients send: its ext_proc calls to the picker).
type MetadataCarrier metadata.MD

// Get is the first value of key.
func (c MetadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set sets key to value.
func (c MetadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

// Keys are the metadata's keys.
func (c MetadataCarrier) Keys() []string { return slices.Collect(maps.Keys(c)) }

// Tracer starts the spans of one process (its service name), sent to the
// mesh's collector while it has one.
type Tracer struct {
	service  string
	settings func() *meshspec.Tracing // the mesh's, nil: tracing off
	log      *slog.Logger

	mu     sync.Mutex            // held while switching exporters
	now    atomic.Pointer[state] // never nil after New
	closed atomic.Bool           // Shutdown: off for good
}

// off is the state of a Tracer while the mesh traces nothing: the SDK's
// no-op, shared.
var off = &state{tracer: noop.NewTracerProvider().Tracer("servemesh")}

// state is the exporter a Tracer sends to: its collector and sampling,
// and the provider's tracer (the no-op without a collector).
type state struct {
	collector string
	sampling  float64
	provider  *sdktrace.TracerProvider // nil: off
	tracer    trace.Tracer
	exporter  *watchedExporter // nil: off
}

// New returns the tracer of service (the name its spans show under, such
// as servemesh-agent-n1), following settings (nil: never traces).
func New(service string, settings func() *meshspec.Tracing, log *slog.Logger) *Tracer {
	t := &Tracer{service: service, settings: settings, log: log}
	t.now.Store(off)
	return t
}

// Start starts a span named name, the child of the trace context in
// carrier (none: a new trace, sampled at the mesh's rate). The span is a
// no-op while the mesh traces nothing (or t is nil); End it.
func (t *Tracer) Start(ctx context.Context, name string, carrier propagation.TextMapCarrier, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if carrier != nil {
		ctx = Propagator.Extract(ctx, carrier)
	}
	return following{t: t}.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// Provider is t as an OpenTelemetry TracerProvider, for instrumentation
// libraries (otelhttp): its tracers follow the mesh's setting as t does.
func (t *Tracer) Provider() trace.TracerProvider { return provider{t: t} }

type provider struct {
	embedded.TracerProvider
	t *Tracer
}

func (p provider) Tracer(string, ...trace.TracerOption) trace.Tracer { return following{t: p.t} }

// following starts its spans with its Tracer's exporter of the moment.
type following struct {
	embedded.Tracer
	t *Tracer
}

func (f following) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if f.t == nil {
		return off.tracer.Start(ctx, name, opts...)
	}
	return f.t.current().tracer.Start(ctx, name, opts...)
}

// same reports whether s follows want (nil: off).
func (s *state) same(want *meshspec.Tracing) bool {
	if want == nil {
		return s.collector == ""
	}
	return want.Collector == s.collector && want.Sampling() == s.sampling
}

// current is the state for the mesh's setting now, switched to when it
// changed since the last span.
func (t *Tracer) current() *state {
	s := t.now.Load()
	var want *meshspec.Tracing
	if t.settings != nil && !t.closed.Load() {
		want = t.settings()
	}
	if s.same(want) {
		return s
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s = t.now.Load(); s.same(want) || t.closed.Load() {
		return s // another span switched it, or the tracer stopped
	}
	next := t.stateFor(want)
	t.now.Store(next)
	go shutdown(s.provider, t.log)
	return next
}

// stateFor makes the exporter of want (nil: off).
func (t *Tracer) stateFor(want *meshspec.Tracing) *state {
	if want == nil {
		t.log.Info("tracing off: the mesh names no collector")
		return off
	}
	// Retried for ExportGiveUp at most: a collector that cannot be reached
	// is then a Problem within seconds, not the SDK's minute.
	exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(want.Collector), otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithTimeout(ExportGiveUp/2), otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{
			Enabled: true, InitialInterval: time.Second, MaxInterval: ExportGiveUp / 4, MaxElapsedTime: ExportGiveUp}))
	if err != nil { // only for options it cannot use; it dials lazily
		t.log.Warn("tracing off: the mesh's collector cannot be used", "collector", want.Collector, "err", err)
		return &state{collector: want.Collector, sampling: want.Sampling(), tracer: off.tracer}
	}
	res := resource.NewSchemaless(attribute.String("service.name", t.service))
	watched := &watchedExporter{SpanExporter: exp}
	p := sdktrace.NewTracerProvider(sdktrace.WithBatcher(watched, sdktrace.WithBatchTimeout(time.Second)), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(want.Sampling()/100))))
	t.log.Info("tracing: spans go to the mesh's collector", "collector", want.Collector, "sampling_percent", want.Sampling())
	return &state{collector: want.Collector, sampling: want.Sampling(), provider: p, tracer: p.Tracer(t.service), exporter: watched}
}

// ExportGiveUp is how long a batch of spans is tried, then dropped and its
// failure a Problem.
const ExportGiveUp = 10 * time.Second

// Problem says why the process's spans could not be sent to the mesh's
// collector at their last sending ("": they were, none were sent yet, or
// the mesh traces nothing): the agent reports it, and the controller
// lists it among the problems of status.
func (t *Tracer) Problem() string {
	if t == nil {
		return ""
	}
	s := t.now.Load()
	if s.exporter == nil {
		return ""
	}
	if err := s.exporter.failed.Load(); err != nil {
		return "its spans cannot be sent to the mesh's collector " + s.collector + ": " + *err
	}
	return ""
}

// watchedExporter is an exporter that keeps why its last export failed.
type watchedExporter struct {
	sdktrace.SpanExporter
	failed atomic.Pointer[string] // nil: the last export went through
}

func (w *watchedExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := w.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		why := err.Error()
		w.failed.Store(&why)
	} else {
		w.failed.Store(nil)
	}
	return err
}

// Shutdown sends the spans not yet sent and stops the exporter, within
// ctx.
func (t *Tracer) Shutdown(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed.Store(true)
	s := t.now.Swap(off)
	if s.provider == nil {
		return nil
	}
	return s.provider.Shutdown(ctx)
}

// shutdown stops a provider no longer used, its spans sent within a few
// seconds.
func shutdown(p *sdktrace.TracerProvider, log *slog.Logger) {
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		log.Warn("tracing: the previous collector's exporter did not stop cleanly", "err", err)
	}
}
