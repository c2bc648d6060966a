package translate

import (
	"fmt"
	"maps"
	"slices"

	mutation "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// callerPickerFilter names the outbound ext_proc filter that asks the
// calling node's picker (wire.PickerPromptHeader), on routes that need
// it, to read a request's body: for prompt affinity, the key it names
// and the node it is placed on; for a model with a rewrite, the model
// name it is rewritten to.
const callerPickerFilter = "servemesh.caller_picker"

// promptBalanceFactor bounds a node's share under prompt affinity, in
// percent of the average requests in flight per node (Envoy's
// hash_balance_factor): a prefix's requests stay on its node until it has
// half again the average, then spill to the next node on the ring.
const promptBalanceFactor = 150

// callerPicker is the outbound ext_proc filter, off unless a route turns
// it on (callerPickerOn): it sends the node's picker the request's headers
// (not its credentials) and body (as far as the listener buffers it), and
// takes back the affinity key's header and the node chosen for it, and
// the body rewritten.
func callerPicker(in filterInput) (*hcm.HttpFilter, error) {
	config, err := anypb.New(&extproc.ExternalProcessor{
		GrpcService: &core.GrpcService{
			TargetSpecifier: &core.GrpcService_EnvoyGrpc_{EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: wire.PickerCluster}},
			Timeout:         durationpb.New(pickerGrpcDeadline),
			InitialMetadata: []*core.HeaderValue{{Key: wire.PickerPromptHeader, Value: "1"}},
		},
		// Without an answer, the request goes on without affinity.
		FailureModeAllow: true,
		MessageTimeout:   durationpb.New(pickerTimeout),
		// Idle (it sends nothing) but on a route that turns it on with
		// pickerMode.
		ProcessingMode: idleMode(),
		// The picker reads the route's session and model headers (which
		// the route names in the stream's metadata) and the body; never a
		// request's credentials.
		ForwardRules: withoutCredentials(),
		// It may set one header, and the node in dynamic metadata.
		MutationRules: &mutation.HeaderMutationRules{DisallowAll: wrapperspb.Bool(true), AllowExpression: &matcher.RegexMatcher{Regex: wire.PromptAffinityHeader}},
		MetadataOptions: &extproc.MetadataOptions{ReceivingNamespaces: &extproc.MetadataOptions_MetadataNamespaces{
			Untyped: []string{wire.PickerNamespace}}},
	})
	if err != nil {
		return nil, fmt.Errorf("pack caller picker filter: %w", err)
	}
	return &hcm.HttpFilter{Name: callerPickerFilter, Disabled: in.offUntilRouted(), ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: config}}, nil
}

// idleMode sends an ext_proc server nothing: a filter's own mode where
// only the routes that turn it on ask.
func idleMode() *extproc.ProcessingMode {
	return &extproc.ProcessingMode{
		RequestHeaderMode:   extproc.ProcessingMode_SKIP,
		ResponseHeaderMode:  extproc.ProcessingMode_SKIP,
		RequestTrailerMode:  extproc.ProcessingMode_SKIP,
		ResponseTrailerMode: extproc.ProcessingMode_SKIP,
	}
}

// withoutCredentials forwards a request's headers but its credentials
// (authorization, proxy-authorization, cookie) to an ext_proc server.
func withoutCredentials() *extproc.HeaderForwardingRules {
	return &extproc.HeaderForwardingRules{DisallowedHeaders: &matcher.ListStringMatcher{Patterns: []*matcher.StringMatcher{
		{MatchPattern: &matcher.StringMatcher_Exact{Exact: "authorization"}},
		{MatchPattern: &matcher.StringMatcher_Exact{Exact: "proxy-authorization"}},
		{MatchPattern: &matcher.StringMatcher_Exact{Exact: "cookie"}},
	}}}
}

// pickerMode is what the filter sends the picker on a route that turns
// it on: the request's headers and its body, as far as the listener
// buffers it; and, where the picker places the request on a node
// (placing), the answer's headers, which end its wait there (a new
// prompt goes where the fewest wait).
func pickerMode(placing bool) *extproc.ProcessingMode {
	answer := extproc.ProcessingMode_SKIP
	if placing {
		answer = extproc.ProcessingMode_SEND
	}
	return &extproc.ProcessingMode{
		RequestHeaderMode:   extproc.ProcessingMode_SEND,
		RequestBodyMode:     extproc.ProcessingMode_BUFFERED_PARTIAL,
		ResponseHeaderMode:  answer,
		RequestTrailerMode:  extproc.ProcessingMode_SKIP,
		ResponseTrailerMode: extproc.ProcessingMode_SKIP,
	}
}

// callerPickerOn turns the caller picker filter on for one of e's
// routes: it tells the picker e's affinity headers and its backends'
// nodes (wire.AffinityRoute), if e has prompt affinity, and the route's
// model rewrite (nil: none).
func callerPickerOn(e ir.Endpoint, rewrite *wire.ModelRewrite) *anypb.Any {
	overrides := &extproc.ExtProcOverrides{ProcessingMode: pickerMode(false)}
	if e.PromptAffinity {
		r := wire.AffinityRoute{Headers: e.AffinityHeaders, Backends: make([]wire.AffinityBackend, 0, len(e.AffinityNodes))}
		for _, b := range e.AffinityNodes {
			nodes := make([]wire.AffinityNode, 0, len(b.Nodes))
			for _, n := range b.Nodes {
				nodes = append(nodes, wire.AffinityNode{Inbound: n.Inbound, Replicas: n.Replicas})
			}
			r.Backends = append(r.Backends, wire.AffinityBackend{Name: b.Name, Nodes: nodes})
		}
		// Too many nodes to list (more than wire.MaxAffinityRouteBytes):
		// the picker then names none, and Maglev alone picks the node.
		if v, err := r.Encode(); err == nil {
			overrides.GrpcInitialMetadata = append(overrides.GrpcInitialMetadata, &core.HeaderValue{Key: wire.AffinityRouteHeader, Value: v})
			overrides.ProcessingMode = pickerMode(len(r.Backends) > 0)
		}
	}
	if rewrite != nil {
		if v, err := rewrite.Encode(); err == nil {
			overrides.GrpcInitialMetadata = append(overrides.GrpcInitialMetadata, &core.HeaderValue{Key: wire.ModelRewriteHeader, Value: v})
		}
	}
	return mustAny(&route.FilterConfig{Config: mustAny(&extproc.ExtProcPerRoute{
		Override: &extproc.ExtProcPerRoute_Overrides{Overrides: overrides}})})
}

// callerPickerOff is the caller picker filter's route setting that keeps
// it from asking: in the chain (the route Envoy built it on turned it
// on), but idle on this route.
func callerPickerOff() *anypb.Any {
	return mustAny(&route.FilterConfig{Config: mustAny(&extproc.ExtProcPerRoute{Override: &extproc.ExtProcPerRoute_Disabled{Disabled: true}})})
}

// callerPickerNeeded reports whether some of e's requests ask the calling
// node's picker: for prompt affinity, or for a model's rewrite.
func callerPickerNeeded(e ir.Endpoint) bool {
	if e.PromptAffinity {
		return true
	}
	if e.Models != nil {
		for _, m := range e.Models.Models {
			if len(m.Rewrite) > 0 {
				return true
			}
		}
	}
	return false
}

// modelRewrite is the rewrite of a model's requests, its targets sorted
// by name; nil for none.
func modelRewrite(field string, rewrite map[string]float64) *wire.ModelRewrite {
	if len(rewrite) == 0 {
		return nil
	}
	out := &wire.ModelRewrite{Field: field}
	for _, name := range slices.Sorted(maps.Keys(rewrite)) {
		out.Targets = append(out.Targets, wire.RewriteTarget{Name: name, Weight: rewrite[name]})
	}
	return out
}
