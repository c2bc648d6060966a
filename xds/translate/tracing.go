package translate

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tracev3 "github.com/envoyproxy/go-control-plane/envoy/config/trace/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tracingtype "github.com/envoyproxy/go-control-plane/envoy/type/tracing/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// tracingCluster reaches the mesh's OTLP/gRPC collector, by DNS if its
// host is a name.
func tracingCluster(t *ir.Tracing) *cluster.Cluster {
	return &cluster.Cluster{
		Name:                 wire.TracingCluster,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STRICT_DNS},
		ConnectTimeout:       durationpb.New(ConnectTimeout),
		LoadAssignment: &endpoint.ClusterLoadAssignment{ClusterName: wire.TracingCluster, Endpoints: []*endpoint.LocalityLbEndpoints{{
			LbEndpoints: []*endpoint.LbEndpoint{{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: socketAddress(t.Host, t.Port),
			}}}},
		}}},
		TypedExtensionProtocolOptions: http2Options(),
	}
}

// traceManager makes m trace its requests with Envoy's OpenTelemetry
// tracer, sending spans to the collector as node's service: a span for
// the request and one for each upstream attempt (which a next hop's spans
// are children of), tagged with node and tags. Requests with a trace
// context keep its decision; others are sampled at the mesh's share
// unless their route says otherwise. Nothing without t.
func traceManager(m *hcm.HttpConnectionManager, t *ir.Tracing, node string, tags ...*tracingtype.CustomTag) error {
	if t == nil {
		return nil
	}
	provider, err := anypb.New(&tracev3.OpenTelemetryConfig{
		GrpcService: &core.GrpcService{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{
			EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: wire.TracingCluster}}},
		ServiceName: wire.TraceService(node),
	})
	if err != nil {
		return fmt.Errorf("pack OpenTelemetry tracer: %w", err)
	}
	m.Tracing = &hcm.HttpConnectionManager_Tracing{
		Provider: &tracev3.Tracing_Http{Name: "envoy.tracers.opentelemetry",
			ConfigType: &tracev3.Tracing_Http_TypedConfig{TypedConfig: provider}},
		RandomSampling:    &typev3.Percent{Value: t.SamplingPercent},
		SpawnUpstreamSpan: wrapperspb.Bool(true),
		CustomTags:        append([]*tracingtype.CustomTag{literalTag(wire.TagNode, node)}, tags...),
	}
	return nil
}

func literalTag(key, value string) *tracingtype.CustomTag {
	return &tracingtype.CustomTag{Tag: key, Type: &tracingtype.CustomTag_Literal_{Literal: &tracingtype.CustomTag_Literal{Value: value}}}
}

func headerTag(key, header string) *tracingtype.CustomTag {
	return &tracingtype.CustomTag{Tag: key, Type: &tracingtype.CustomTag_RequestHeader{RequestHeader: &tracingtype.CustomTag_Header{Name: header}}}
}

// tracedRoutes is the route feature of traced endpoints: each forwarding
// route names its span for the endpoint, samples at the endpoint's share
// and tags the endpoint and its split.
type tracedRoutes struct{}

func (tracedRoutes) name() string            { return "tracing" }
func (tracedRoutes) uses(e ir.Endpoint) bool { return e.TraceSampling != nil }
func (tracedRoutes) forward(e ir.Endpoint, r *route.Route, _ routeSite) {
	r.Decorator = &route.Decorator{Operation: e.Name}
	r.Tracing = &route.Tracing{
		RandomSampling: routeSampling(*e.TraceSampling),
		CustomTags:     []*tracingtype.CustomTag{literalTag(wire.TagEndpoint, e.Name)},
	}
	if len(e.Traffic) > 0 { // a model-routed endpoint splits per model
		r.Tracing.CustomTags = append(r.Tracing.CustomTags, literalTag(wire.TagSplit, splitTag(e.Traffic)))
	}
}

// routeSampling is percent as a route's random sampling. Envoy draws a
// route's sampling from the request id modulo 10,000 and compares it with
// the fraction's numerator, whatever its denominator says, so the
// fraction must be in ten-thousandths (steps of 0.01%): 1% written in
// millionths (10,000) sampled every request.
func routeSampling(percent float64) *typev3.FractionalPercent {
	return &typev3.FractionalPercent{Numerator: uint32(math.Round(percent * 100)), Denominator: typev3.FractionalPercent_TEN_THOUSAND}
}

// splitTag writes a split as "v1=0.9,v2=0.1", sorted by backend.
func splitTag(traffic map[string]float64) string {
	var parts []string
	for _, b := range slices.Sorted(maps.Keys(traffic)) {
		parts = append(parts, b+"="+strconv.FormatFloat(traffic[b], 'g', -1, 64))
	}
	return strings.Join(parts, ",")
}
