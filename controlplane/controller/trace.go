package controller

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracerName names the controller's spans' instrumentation scope.
const tracerName = "github.com/servemesh/servemesh/controlplane/controller"

// startSpan starts a span under ctx's, with the same provider: an
// operation traced where its API call is (controlplane/api), a no-op
// where it is not.
func startSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(tracerName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// endSpan ends span, marked failed with err (nil: none) and given attrs.
func endSpan(span trace.Span, err error, attrs ...attribute.KeyValue) {
	span.SetAttributes(attrs...)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
