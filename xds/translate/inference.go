package translate

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	jsonmeta "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/json_to_metadata/v3"
	lua "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	cswrr "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/client_side_weighted_round_robin/v3"
	commonlb "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/common/v3"
	leastrequest "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	maglev "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/maglev/v3"
	overridehost "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// Serving model traffic (model/inference.go says what users write).
//
// Load-aware picking, in two steps, both on the path every request to a
// replica takes in the default mTLS mode:
//
//  1. The calling node picks a node: the backend's cluster balances with
//     client-side weighted round robin (loadAwareCluster), whose weights
//     come from the ORCA load reports (wire.LoadReportHeader) on the
//     answers it gets: a node's weight, qps/utilization, is its capacity
//     discounted by its replicas' time to first byte (agent/picker).
//  2. That node's inbound listener asks its agent (the picker, an ext_proc
//     server on wire.PickerSocket) which of its replicas takes the
//     request: the agent knows each one's requests in flight (they all
//     cross it), its time to answer and, if the backend says where, the
//     queue and KV cache its server reports. It answers with the replica
//     (dynamic metadata that the inbound cluster's override_host policy
//     follows), or 429 for a sheddable request when every replica there is
//     saturated; and adds the node's load report to the answer. Without an
//     answer in time, Envoy picks by least requests.
//
// A node calls its own replicas of a load-aware backend through its own
// inbound listener too (no local view), so the picker sees every request.
//
// Model-name routing: an endpoint's routes match the model in dynamic
// metadata (wire.ModelMetadata). The first match of a request, before its
// body is read, is the endpoint's model-unknown route (readModelRoute), which turns
// on two filters for it: json_to_metadata reads the model from the body
// (buffered, within the listener's buffer limit), then a line of Lua
// clears the route cache, so the request is matched again, now with its
// model.

// Load reports and picking take effect quickly: a new node's reports count
// after a second, stale ones are dropped after ten.
const (
	loadBlackout       = time.Second
	loadWeightUpdate   = 250 * time.Millisecond
	loadWeightExpiry   = 10 * time.Second
	pickerTimeout      = 200 * time.Millisecond
	pickerGrpcDeadline = time.Second
)

// loadAware reports whether b's replicas are picked by their load.
func loadAware(b ir.Backend) bool { return b.Picked }

// loadAwareCluster makes c, a backend's cluster of nodes, weigh them by
// the load reports on their answers.
func loadAwareCluster(c *cluster.Cluster) error {
	policy, err := anypb.New(&cswrr.ClientSideWeightedRoundRobin{
		BlackoutPeriod:         durationpb.New(loadBlackout),
		WeightUpdatePeriod:     durationpb.New(loadWeightUpdate),
		WeightExpirationPeriod: durationpb.New(loadWeightExpiry),
	})
	if err != nil {
		return fmt.Errorf("cluster %s: pack load-aware policy: %w", c.GetName(), err)
	}
	c.LbPolicy = cluster.Cluster_ROUND_ROBIN // unused: the policy below
	c.LoadBalancingPolicy = &cluster.LoadBalancingPolicy{Policies: []*cluster.LoadBalancingPolicy_Policy{{
		TypedExtensionConfig: &core.TypedExtensionConfig{Name: "envoy.load_balancing_policies.client_side_weighted_round_robin", TypedConfig: policy}}}}
	// Requests wait at the replicas' node, where its picker sees them (and
	// sheds the sheddable ones once every replica is saturated), not here.
	for _, t := range c.GetCircuitBreakers().GetThresholds() {
		t.MaxConnections = t.MaxRequests
	}
	return nil
}

// pickedReplicaCluster makes c, a node's inbound cluster, send each request
// to the replica its picker named (the Endpoint Picker Protocol's key,
// then the key a picker of the previous release names it by), or by
// least requests when it named none, and report the replica that served
// it to the picker (wire.DestinationEndpointServedKey).
func pickedReplicaCluster(c *cluster.Cluster) error {
	fallback, err := anypb.New(&leastrequest.LeastRequest{})
	if err != nil {
		return err
	}
	return overrideHostCluster(c, []string{wire.DestinationEndpointKey, wire.PickedReplicaKey}, wire.DestinationEndpointServedKey,
		"envoy.load_balancing_policies.least_request", fallback)
}

// overrideHostCluster makes c take the host a filter named in dynamic
// metadata (wire.PickerNamespace, the first of keys it finds), as
// "IP:port" (or a list of them, in order), while it is in the cluster,
// else pick by the fallback policy (named, with its config); with served,
// it names the host taken in metadata (wire.PickerNamespace, served).
func overrideHostCluster(c *cluster.Cluster, keys []string, served, fallbackName string, fallback *anypb.Any) error {
	var sources []*overridehost.OverrideHost_OverrideHostSource
	for _, k := range keys {
		sources = append(sources, &overridehost.OverrideHost_OverrideHostSource{Metadata: pickerKey(k)})
	}
	return overrideHostFrom(c, sources, served, fallbackName, fallback)
}

// pickerKey is key in the picker's metadata namespace.
func pickerKey(k string) *metadatav3.MetadataKey {
	return &metadatav3.MetadataKey{Key: wire.PickerNamespace, Path: []*metadatav3.MetadataKey_PathSegment{{
		Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: k}}}}
}

// overrideHostFrom makes c take the host the first of sources names
// while it is in the cluster, else pick by the fallback policy; with
// served, it names the host taken in metadata (wire.PickerNamespace,
// served).
func overrideHostFrom(c *cluster.Cluster, sources []*overridehost.OverrideHost_OverrideHostSource, served, fallbackName string, fallback *anypb.Any) error {
	config := &overridehost.OverrideHost{
		OverrideHostSources: sources,
		FallbackPolicy: &cluster.LoadBalancingPolicy{Policies: []*cluster.LoadBalancingPolicy_Policy{{
			TypedExtensionConfig: &core.TypedExtensionConfig{Name: fallbackName, TypedConfig: fallback}}}},
	}
	if served != "" {
		config.SelectedHostKey = pickerKey(served)
	}
	policy, err := anypb.New(config)
	if err != nil {
		return fmt.Errorf("cluster %s: pack override host policy: %w", c.GetName(), err)
	}
	c.LbPolicy = cluster.Cluster_ROUND_ROBIN // unused: the policy below
	c.LoadBalancingPolicy = &cluster.LoadBalancingPolicy{Policies: []*cluster.LoadBalancingPolicy_Policy{{
		TypedExtensionConfig: &core.TypedExtensionConfig{Name: "envoy.load_balancing_policies.override_host", TypedConfig: policy}}}}
	return nil
}

// pickerFilter asks the node's picker which replica of backend takes each
// request, and adds the node's load report to each answer.
func pickerFilter(b ir.Backend) (*hcm.HttpFilter, error) {
	backend := b.Name
	metadata := []*core.HeaderValue{{Key: wire.BackendHeader, Value: backend}}
	var forwarded []*matcher.StringMatcher
	// The answer's status too: the picker counts a 5xx as a slow answer,
	// not a fast one.
	for _, h := range []string{wire.CriticalityHeader, wire.PriorityHeader, wire.PriorityLimitHeader, wire.TTFTObjectiveHeader, ":status"} {
		forwarded = append(forwarded, &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: h}})
	}
	for _, h := range []struct{ meta, name string }{{wire.PickerSessionHeader, b.SessionHeader}, {wire.PickerModelHeader, b.ModelHeader}, {wire.PickerTenantHeader, b.TenantHeader}} {
		if h.name != "" {
			forwarded = append(forwarded, &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: h.name}})
			metadata = append(metadata, &core.HeaderValue{Key: h.meta, Value: h.name})
		}
	}
	mode := &extproc.ProcessingMode{
		RequestHeaderMode:   extproc.ProcessingMode_SEND,
		ResponseHeaderMode:  extproc.ProcessingMode_SEND,
		RequestTrailerMode:  extproc.ProcessingMode_SKIP,
		ResponseTrailerMode: extproc.ProcessingMode_SKIP,
	}
	if b.PromptAware {
		// The body as far as the listener buffers it (the prompt comes
		// first), never more: the picker picks when it has it.
		mode.RequestBodyMode = extproc.ProcessingMode_BUFFERED_PARTIAL
		metadata = append(metadata, &core.HeaderValue{Key: wire.PickerBodyHeader, Value: "1"})
	}
	config, err := anypb.New(&extproc.ExternalProcessor{
		GrpcService: &core.GrpcService{
			TargetSpecifier: &core.GrpcService_EnvoyGrpc_{EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: wire.PickerCluster}},
			Timeout:         durationpb.New(pickerGrpcDeadline),
			InitialMetadata: metadata,
		},
		// Envoy picks by least requests if the agent does not answer.
		FailureModeAllow: true,
		MessageTimeout:   durationpb.New(pickerTimeout),
		// A request that waits for a replica (flow control) has the
		// picker extend its answer's time, up to the longest wait.
		MaxMessageTimeout: durationpb.New(wire.PickerMaxWait),
		ProcessingMode:    mode,
		// It names the replica in the protocol's namespace, and is told
		// which served the request there (with the answer's headers), and
		// the protocol's subset hint where a filter before it set one.
		MetadataOptions: &extproc.MetadataOptions{
			ReceivingNamespaces:  &extproc.MetadataOptions_MetadataNamespaces{Untyped: []string{wire.PickerNamespace}},
			ForwardingNamespaces: &extproc.MetadataOptions_MetadataNamespaces{Untyped: []string{wire.PickerNamespace, wire.SubsetHintNamespace}}},
		// The picker reads the criticality, the priority and the session,
		// model and tenant headers, and the answer's status; the others
		// are not sent to it.
		ForwardRules: &extproc.HeaderForwardingRules{AllowedHeaders: &matcher.ListStringMatcher{Patterns: forwarded}},
	})
	if err != nil {
		return nil, fmt.Errorf("inbound listener, backend %s: pack picker filter: %w", backend, err)
	}
	return &hcm.HttpFilter{Name: "envoy.filters.http.ext_proc", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: config}}, nil
}

// pickerCluster reaches the node's picker, an HTTP/2 (gRPC) server on a
// unix socket in the Envoy's folder.
func pickerCluster() *cluster.Cluster {
	return unixSocketCluster(wire.PickerCluster, wire.PickerSocket)
}

// unixSocketCluster reaches one of the agent's gRPC servers on the node,
// on socket in the Envoy's folder (its working folder).
func unixSocketCluster(name, socket string) *cluster.Cluster {
	return &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(ConnectTimeout),
		LoadAssignment: &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{{
			LbEndpoints: []*endpoint.LbEndpoint{{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_Pipe{Pipe: &core.Pipe{Path: socket}}},
			}}}},
		}}},
		TypedExtensionProtocolOptions: http2Options(),
	}
}

// modelFilters are the outbound listeners' filters that read a request's
// model from its body, off unless a route turns them on (readModelRoute).
// readModelFilter reads a body's model (off but on model-routed routes).
func readModelFilter(in filterInput) (*hcm.HttpFilter, error) {
	read, err := anypb.New(idleReadModel())
	if err != nil {
		return nil, fmt.Errorf("pack json_to_metadata filter: %w", err)
	}
	return &hcm.HttpFilter{Name: jsonToMetadataFilter, Disabled: in.offUntilRouted(), ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: read}}, nil
}

// rematchFilter matches the route again once the model is read (off but on
// model-routed routes, which give it rematchSource).
func rematchFilter(in filterInput) (*hcm.HttpFilter, error) {
	rematch, err := anypb.New(&lua.Lua{DefaultSourceCode: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: ""}}})
	if err != nil {
		return nil, fmt.Errorf("pack lua filter: %w", err)
	}
	return &hcm.HttpFilter{Name: luaFilter, Disabled: in.offUntilRouted(), ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: rematch}}, nil
}

const (
	jsonToMetadataFilter = "envoy.filters.http.json_to_metadata"
	luaFilter            = "envoy.filters.http.lua"
	// rematchSource matches the request again, once its model is known.
	rematchSource = "function envoy_on_request(h) h:clearRouteCache() end"
)

// readModel reads the model named by a body's field into dynamic metadata
// (wire.ModelMetadata), or marks it missing: no body, not JSON, no such
// field. Every content type is read (clients do not all say JSON).
func readModel(field string) *jsonmeta.JsonToMetadata {
	missing := &jsonmeta.JsonToMetadata_KeyValuePair{MetadataNamespace: wire.ModelMetadata, Key: wire.ModelMissingKey,
		ValueType: &jsonmeta.JsonToMetadata_KeyValuePair_Value{Value: structpb.NewBoolValue(true)}}
	return &jsonmeta.JsonToMetadata{RequestRules: &jsonmeta.JsonToMetadata_MatchRules{
		Rules: []*jsonmeta.JsonToMetadata_Rule{{
			Selectors: []*jsonmeta.JsonToMetadata_Selector{{Selector: &jsonmeta.JsonToMetadata_Selector_Key{Key: field}}},
			OnPresent: &jsonmeta.JsonToMetadata_KeyValuePair{MetadataNamespace: wire.ModelMetadata, Key: wire.ModelKey, Type: jsonmeta.JsonToMetadata_STRING},
			OnMissing: missing,
			OnError:   missing,
		}},
		AllowEmptyContentType:  true,
		AllowContentTypesRegex: &matcher.RegexMatcher{Regex: ".*"},
	}}
}

// idleReadModel is the filter's own config, which a model-routed route
// replaces (readModel): it reads no body, since it allows a content type
// no request has.
func idleReadModel() *jsonmeta.JsonToMetadata {
	r := readModel(wire.DefaultModelField)
	r.RequestRules.AllowEmptyContentType, r.RequestRules.AllowContentTypesRegex = false, nil
	r.RequestRules.AllowContentTypes = []string{"application/x-servemesh-idle"}
	return r
}

// modelRoutes are e's routes of one group of methods (named name, retried
// on retry): one per model, each splitting and mirroring by that model's
// policies once the request's model is read.
func modelRoutes(e ir.Endpoint, match func() *route.RouteMatch, methods *route.HeaderMatcher, name, retry string, from caller) []*route.Route {
	r := e.Models
	var routes []*route.Route
	for _, m := range slices.Sorted(maps.Keys(r.Models)) {
		matched := match()
		matched.Headers = []*route.HeaderMatcher{methods}
		matched.DynamicMetadata = []*matcher.MetadataMatcher{modelMatcher(wire.ModelKey,
			&matcher.ValueMatcher{MatchPattern: &matcher.ValueMatcher_StringMatch{StringMatch: &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: m}}}})}
		split := e
		split.Traffic, split.Shadows = r.Models[m].Traffic, r.Models[m].Shadows
		rt := forwardingRoute(name+"/model/"+m, matched, split, retry, from)
		if rt.TypedPerFilterConfig == nil {
			rt.TypedPerFilterConfig = map[string]*anypb.Any{}
		}
		switch rw := modelRewrite(r.Field, r.Models[m].Rewrite); {
		case rw != nil:
			rt.TypedPerFilterConfig[callerPickerFilter] = callerPickerOn(e, rw)
		case !e.PromptAffinity && callerPickerNeeded(e):
			rt.TypedPerFilterConfig[callerPickerFilter] = callerPickerOff() // another model's rewrite put it in the chain
		}
		if len(rt.TypedPerFilterConfig) == 0 {
			rt.TypedPerFilterConfig = nil
		}
		routes = append(routes, rt)
	}
	return routes
}

// modelAnswers are a model-routed endpoint's answers to requests of its
// methods that name no model (400) or another (404); the latter is what
// such a request first matches, and it reads the body (readModelRoute).
func modelAnswers(e ir.Endpoint, match func() *route.RouteMatch, methods *route.HeaderMatcher) []*route.Route {
	field := e.Models.Field
	missing := match()
	missing.Headers = []*route.HeaderMatcher{methods}
	missing.DynamicMetadata = []*matcher.MetadataMatcher{modelMatcher(wire.ModelMissingKey,
		&matcher.ValueMatcher{MatchPattern: &matcher.ValueMatcher_PresentMatch{PresentMatch: true}})}
	unknown := match()
	unknown.Headers = []*route.HeaderMatcher{methods}
	models := slices.Sorted(maps.Keys(e.Models.Models))
	read := readModelRoute(field)
	// Counted here, before the body is read, on the route Envoy first matches.
	if e.RateLimit != nil {
		read[localRateLimitFilter] = localRateLimitOn(e)
	}
	maps.Copy(read, globalRateLimitsOn(e))
	if e.ReadsAnswers {
		read[usageReaderFilter] = usageReaderOn()
	}
	if callerPickerNeeded(e) {
		// In the chain from the first route on (Envoy builds a request's
		// chain on it), off unless the model's route turns it on.
		read[callerPickerFilter] = callerPickerOff()
	}
	missingAnswer := modelError(fmt.Sprintf("endpoint %q routes by the model a JSON body names in its %q field; send a JSON object with %q set to one of: %s", e.Name, field, field, joinQuoted(models)), field, "")
	unknownAnswer := modelError(fmt.Sprintf("endpoint %q serves no such model; its models are: %s", e.Name, joinQuoted(models)), field, "model_not_found")
	return []*route.Route{
		{Name: e.Name + "/model-missing", Match: missing, Action: directAction(400, missingAnswer), ResponseHeadersToAdd: jsonAnswer()},
		{Name: e.Name + "/model-unknown", Match: unknown, TypedPerFilterConfig: read,
			Action: directAction(404, unknownAnswer), ResponseHeadersToAdd: jsonAnswer()},
	}
}

// modelError is an answer to a request of a model-routed endpoint, as
// OpenAI's API words its errors (what the official SDKs read: they showed
// only "Error code: 404" of a text answer): the message, the request's
// field at fault and a code ("" none).
func modelError(message, param, code string) string {
	body := map[string]any{"message": message, "type": "invalid_request_error", "param": param, "code": nil}
	if code != "" {
		body["code"] = code
	}
	out, err := json.Marshal(map[string]any{"error": body})
	if err != nil {
		panic(err) // strings and nil only
	}
	return string(out) + "\n"
}

// jsonAnswer says a direct answer is JSON.
func jsonAnswer() []*core.HeaderValueOption {
	return []*core.HeaderValueOption{{Header: &core.HeaderValue{Key: "content-type", Value: "application/json"},
		AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}}
}

// readModelRoute turns the model filters on for a route, reading field.
func readModelRoute(field string) map[string]*anypb.Any {
	rematch := &lua.LuaPerRoute{Override: &lua.LuaPerRoute_SourceCode{SourceCode: &core.DataSource{
		Specifier: &core.DataSource_InlineString{InlineString: rematchSource}}}}
	return map[string]*anypb.Any{
		jsonToMetadataFilter: mustAny(&route.FilterConfig{Config: mustAny(readModel(field))}),
		luaFilter:            mustAny(&route.FilterConfig{Config: mustAny(rematch)}),
	}
}

// mustAny packs a message built here, which cannot fail, the same bytes
// each time (a Struct's fields are a map): routes are versioned by their
// encoding.
func mustAny(m proto.Message) *anypb.Any {
	a := &anypb.Any{}
	err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true})
	if err != nil {
		panic(err) // a static, valid message
	}
	return a
}

func modelMatcher(key string, value *matcher.ValueMatcher) *matcher.MetadataMatcher {
	return &matcher.MetadataMatcher{Filter: wire.ModelMetadata,
		Path:  []*matcher.MetadataMatcher_PathSegment{{Segment: &matcher.MetadataMatcher_PathSegment_Key{Key: key}}},
		Value: value}
}

// criticalityHeader marks an endpoint's requests with their criticality
// and the most priority they may ask for (the picker's flow control). From
// the mesh listener (the node's replicas: the operator's code) a request
// may say what it is, and one that says nothing is the endpoint's; from
// the public listener a request is always the endpoint's criticality,
// whatever it says: any client could otherwise call itself critical and
// never be shed. The priority limit is the route's on both, every
// request's own replaced.
func criticalityHeader(e ir.Endpoint, from caller) []*core.HeaderValueOption {
	limit := &core.HeaderValueOption{
		Header:       &core.HeaderValue{Key: wire.PriorityLimitHeader, Value: strconv.Itoa(e.MeshPriority)},
		AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
	action := core.HeaderValueOption_ADD_IF_ABSENT
	if from == public {
		action = core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		limit.Header.Value = strconv.Itoa(e.Priority)
	} else if e.Criticality == wire.Critical {
		return []*core.HeaderValueOption{limit} // a request that says nothing is critical
	}
	return []*core.HeaderValueOption{{
		Header:       &core.HeaderValue{Key: wire.CriticalityHeader, Value: e.Criticality},
		AppendAction: action,
	}, limit}
}

func directAction(status uint32, body string) *route.Route_DirectResponse {
	return &route.Route_DirectResponse{DirectResponse: &route.DirectResponseAction{
		Status: status,
		Body:   &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: body}},
	}}
}

// maxListedModels bounds the models an answer lists (route tables are
// sent whole to every node).
const maxListedModels = 10

// joinQuoted lists names, quoted, the first maxListedModels of them.
func joinQuoted(names []string) string {
	quoted := make([]string, 0, min(len(names), maxListedModels))
	for _, n := range names[:min(len(names), maxListedModels)] {
		quoted = append(quoted, fmt.Sprintf("%q", n))
	}
	out := strings.Join(quoted, ", ")
	if more := len(names) - len(quoted); more > 0 {
		out += fmt.Sprintf(" and %d more", more)
	}
	return out
}

// boundedHashCluster makes c, a backend's cluster of nodes, take the node
// the calling node's picker placed the request's affinity key on
// (wire.PromptNodeKey) while it is healthy, else pick one by the key's
// hash (Maglev), each node's load bounded by promptBalanceFactor.
func boundedHashCluster(c *cluster.Cluster) error {
	hashed, err := anypb.New(&maglev.Maglev{ConsistentHashingLbConfig: &commonlb.ConsistentHashingLbConfig{
		HashBalanceFactor: wrapperspb.UInt32(promptBalanceFactor)}})
	if err != nil {
		return fmt.Errorf("cluster %s: pack maglev policy: %w", c.GetName(), err)
	}
	if err := overrideHostCluster(c, []string{wire.PromptNodeKey}, "", "envoy.load_balancing_policies.maglev", hashed); err != nil {
		return err
	}
	// A node named but not healthy (its replicas' checks lapsed: DEGRADED;
	// failing or ejected) is passed over for the hash's choice.
	if c.CommonLbConfig == nil {
		c.CommonLbConfig = &cluster.Cluster_CommonLbConfig{}
	}
	c.CommonLbConfig.OverrideHostStatus = &core.HealthStatusSet{Statuses: []core.HealthStatus{core.HealthStatus_UNKNOWN, core.HealthStatus_HEALTHY}}
	return nil
}
