package translate

import (
	"fmt"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutation "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	lua "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	leastrequest "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	overridehost "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// External endpoint pickers (a backend's endpoint_picker; the data flow
// is numbered in wire's endpointpicker.go). The calling node asks the
// picker, since its choice spans nodes: three filters of the outbound
// chain, off but on the routes (or, in a split, the backends of a route)
// whose backend has a picker. The inbound listener then sends the request
// to the replica named, and names the replica that served it.

// endpointPickerFilter is the outbound ext_proc filter that asks a
// backend's external picker.
const endpointPickerFilter = "servemesh.endpoint_picker"

// Named sources of the two Lua filters, which a route's config picks.
const (
	subsetLuaName = "subset"
	routeLuaName  = "route"
)

// subsetLua puts the backend's ready replicas (the route's filter context,
// "subset") in the protocol's subset hint.
const subsetLua = `function envoy_on_request(h)
  local subset = h:filterContext():get("subset")
  if subset ~= nil then
    h:streamInfo():dynamicMetadata():set("` + wire.SubsetHintNamespace + `", "` + wire.SubsetHintKey + `", subset)
  end
end
`

// routeLua follows the picker's answer: of the endpoints it named, the
// backend's replicas (the filter context's "endpoints") on the first one's
// node, in order; it names that node's inbound listener for the cluster
// of nodes and the replicas, as that node knows them, in the request's
// header for the inbound cluster. Without an answer (the picker failed
// open) the request goes on unpicked, and a client's own header is
// dropped. On the way back it moves the served replica the inbound
// listener names into the metadata the picker is told.
const routeLua = `local key = "` + wire.DestinationEndpointKey + `"
local served = "` + wire.DestinationEndpointServedKey + `"
function envoy_on_request(h)
  local endpoints = h:filterContext():get("endpoints")
  local lb = h:streamInfo():dynamicMetadata():get("` + wire.PickerNamespace + `")
  local picked = lb and lb[key]
  h:headers():remove(key)
  if picked == nil or endpoints == nil then
    return
  end
  local node, keep = nil, {}
  for ep in string.gmatch(picked, "[^,%s]+") do
    local r = endpoints[ep]
    if r ~= nil and (node == nil or r["inbound"] == node) then
      node = r["inbound"]
      keep[#keep + 1] = r["local"]
    end
  end
  if node == nil then
    h:respond({[":status"] = "503", ["content-type"] = "text/plain"},
      "the endpoint picker of backend " .. h:filterContext():get("backend") .. " named none of its ready replicas (" .. string.sub(picked, 1, 200) .. ")\n")
    return
  end
  h:headers():replace(key, table.concat(keep, ","))
  h:streamInfo():dynamicMetadata():set("` + wire.PickerNamespace + `", "` + wire.EndpointNodeKey + `", node)
end
function envoy_on_response(h)
  local local_addr = h:headers():get(served)
  if local_addr == nil then
    return
  end
  h:headers():remove(served)
  local lb = h:streamInfo():dynamicMetadata():get("` + wire.PickerNamespace + `")
  local node = lb and lb["` + wire.EndpointNodeKey + `"]
  local port = string.match(local_addr, ":(%d+)$")
  local host = node and string.match(node, "^(.*):%d+$")
  if host ~= nil and port ~= nil then
    h:streamInfo():dynamicMetadata():set("` + wire.PickerNamespace + `", served, host .. ":" .. port)
  end
end
`

// endpointSubset is the Lua filter before the picker (idle but on routes
// that name its source).
func endpointSubset(in filterInput) (*hcm.HttpFilter, error) {
	return namedLua(in, wire.EndpointSubsetFilter, subsetLuaName, subsetLua)
}

// endpointRoute is the Lua filter after the picker.
func endpointRoute(in filterInput) (*hcm.HttpFilter, error) {
	return namedLua(in, wire.EndpointRouteFilter, routeLuaName, routeLua)
}

// namedLua is a Lua filter that runs nothing but on a route that names
// its one source.
func namedLua(in filterInput, filter, name, source string) (*hcm.HttpFilter, error) {
	if !in.mtls {
		return nil, nil // no inbound listener to follow a pick
	}
	config, err := anypb.New(&lua.Lua{
		DefaultSourceCode: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: ""}},
		SourceCodes:       map[string]*core.DataSource{name: {Specifier: &core.DataSource_InlineString{InlineString: source}}},
	})
	if err != nil {
		return nil, fmt.Errorf("pack %s filter: %w", filter, err)
	}
	return &hcm.HttpFilter{Name: filter, Disabled: in.offUntilRouted(), ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: config}}, nil
}

// endpointPicker is the ext_proc filter that asks a backend's picker,
// idle but on a route that names the picker's cluster (endpointPickerOn).
// It sends the request's headers (not its credentials) and streams its
// body, as the protocol has a proxy do, and the answer's headers; takes
// the endpoints named in the protocol's metadata; and never lets the
// picker choose the route again or set servemesh's or Envoy's headers.
// A picker that fails, with its backend failing closed, is a 503.
func endpointPicker(in filterInput) (*hcm.HttpFilter, error) {
	if !in.mtls {
		return nil, nil
	}
	config, err := anypb.New(&extproc.ExternalProcessor{
		// Unused: each route names its backend's picker.
		GrpcService: &core.GrpcService{
			TargetSpecifier: &core.GrpcService_EnvoyGrpc_{EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: wire.PickerCluster}},
		},
		ProcessingMode:   idleMode(),
		MessageTimeout:   durationpb.New(wire.EndpointPickerWait),
		StatusOnError:    &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
		RouteCacheAction: extproc.ExternalProcessor_RETAIN,
		ForwardRules:     withoutCredentials(),
		MutationRules: &mutation.HeaderMutationRules{
			DisallowSystem:     wrapperspb.Bool(true),
			DisallowExpression: &matcher.RegexMatcher{Regex: "(x-servemesh-|x-envoy-).*|authorization|proxy-authorization|cookie"},
		},
		MetadataOptions: &extproc.MetadataOptions{
			ReceivingNamespaces:  &extproc.MetadataOptions_MetadataNamespaces{Untyped: []string{wire.PickerNamespace}},
			ForwardingNamespaces: &extproc.MetadataOptions_MetadataNamespaces{Untyped: []string{wire.PickerNamespace, wire.SubsetHintNamespace}},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("pack endpoint picker filter: %w", err)
	}
	return &hcm.HttpFilter{Name: endpointPickerFilter, Disabled: in.offUntilRouted(), ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: config}}, nil
}

// endpointPickerMode is what the filter sends a picker: the request's
// headers, its body streamed both ways (the protocol's mode; the picker
// holds the headers' answer until it has read what it needs), and the
// answer's headers, which come with the replica that served it.
var endpointPickerMode = &extproc.ProcessingMode{
	RequestHeaderMode:   extproc.ProcessingMode_SEND,
	RequestBodyMode:     extproc.ProcessingMode_FULL_DUPLEX_STREAMED,
	RequestTrailerMode:  extproc.ProcessingMode_SEND, // as that body mode needs
	ResponseHeaderMode:  extproc.ProcessingMode_SEND,
	ResponseTrailerMode: extproc.ProcessingMode_SKIP,
}

// pickerConfigs are the per-route configs of the three filters for
// requests to p (plain: those of a backend in a route's split; else
// wrapped to turn the filters on for the route).
func pickerConfigs(p ir.PickedBackend, wrap bool) map[string]*anypb.Any {
	subset := ""
	endpoints := map[string]any{}
	for _, e := range p.Endpoints {
		if subset != "" {
			subset += ","
		}
		subset += e.Endpoint
		endpoints[e.Endpoint] = map[string]any{"inbound": e.Inbound, "local": e.Local}
	}
	subsetCtx, err := structpb.NewStruct(map[string]any{"subset": subset})
	if err != nil {
		panic(err) // strings only
	}
	routeCtx, err := structpb.NewStruct(map[string]any{"backend": p.Name, "endpoints": endpoints})
	if err != nil {
		panic(err) // strings and maps of them only
	}
	configs := map[string]*anypb.Any{
		wire.EndpointSubsetFilter: mustAny(&lua.LuaPerRoute{Override: &lua.LuaPerRoute_Name{Name: subsetLuaName}, FilterContext: subsetCtx}),
		endpointPickerFilter: mustAny(&extproc.ExtProcPerRoute{Override: &extproc.ExtProcPerRoute_Overrides{Overrides: &extproc.ExtProcOverrides{
			ProcessingMode: endpointPickerMode,
			GrpcService: &core.GrpcService{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{EnvoyGrpc: &core.GrpcService_EnvoyGrpc{
				ClusterName: wire.EndpointPickerCluster(p.Name)}}},
			FailureModeAllow: wrapperspb.Bool(p.FailOpen),
		}}}),
		wire.EndpointRouteFilter: mustAny(&lua.LuaPerRoute{Override: &lua.LuaPerRoute_Name{Name: routeLuaName}, FilterContext: routeCtx}),
	}
	if wrap {
		for name, c := range configs {
			configs[name] = mustAny(&route.FilterConfig{Config: c})
		}
	}
	return configs
}

// pickersIdle turns the three filters on for a route, idle: in a split,
// each picked backend's own configs make them ask.
func pickersIdle() map[string]*anypb.Any {
	idle := mustAny(&lua.LuaPerRoute{Override: &lua.LuaPerRoute_SourceCode{SourceCode: &core.DataSource{
		Specifier: &core.DataSource_InlineString{InlineString: ""}}}})
	return map[string]*anypb.Any{
		wire.EndpointSubsetFilter: mustAny(&route.FilterConfig{Config: idle}),
		endpointPickerFilter: mustAny(&route.FilterConfig{Config: mustAny(&extproc.ExtProcPerRoute{Override: &extproc.ExtProcPerRoute_Overrides{
			Overrides: &extproc.ExtProcOverrides{ProcessingMode: idleMode()}}})}),
		wire.EndpointRouteFilter: mustAny(&route.FilterConfig{Config: idle}),
	}
}

// endpointPickers is the route feature of an endpoint that sends to
// backends with external pickers: its routes (or, in a split, those
// backends' shares) ask each backend's picker, and a shadow copy to such
// a backend carries no pick of another's.
type endpointPickers struct{}

func (endpointPickers) name() string            { return "endpoint_picker.routes" }
func (endpointPickers) uses(e ir.Endpoint) bool { return len(e.Picked) > 0 }
func (endpointPickers) forward(e ir.Endpoint, r *route.Route, _ routeSite) {
	picked := map[string]ir.PickedBackend{}
	for _, p := range e.Picked {
		picked[wire.ClusterName(p.Name)] = p
	}
	action := r.GetRoute()
	for _, m := range action.GetRequestMirrorPolicies() {
		if _, ok := picked[m.GetCluster()]; ok {
			m.RequestHeadersMutations = append(m.RequestHeadersMutations, &mutation.HeaderMutation{
				Action: &mutation.HeaderMutation_Remove{Remove: wire.DestinationEndpointKey}})
		}
	}
	var configs map[string]*anypb.Any
	if c := action.GetCluster(); c != "" {
		p, ok := picked[c]
		if !ok {
			return
		}
		configs = pickerConfigs(p, true)
	} else {
		any := false
		for _, w := range action.GetWeightedClusters().GetClusters() {
			if p, ok := picked[w.GetName()]; ok {
				w.TypedPerFilterConfig = pickerConfigs(p, false)
				any = true
			}
		}
		if !any {
			return
		}
		configs = pickersIdle()
	}
	if r.TypedPerFilterConfig == nil {
		r.TypedPerFilterConfig = map[string]*anypb.Any{}
	}
	for name, c := range configs {
		r.TypedPerFilterConfig[name] = c
	}
}

// externalPicking is a backend's endpoint_picker: calling nodes send a
// request to the node of the replica its picker named (override_host on
// the cluster of nodes, by the route Lua's metadata), and that node's
// inbound cluster to the replica named in the request's header; both fall
// back to least requests. A node calls its own replicas through its
// inbound listener too, which names the replica that served.
type externalPicking struct{}

func (externalPicking) name() string           { return "endpoint_picker" }
func (externalPicking) uses(b ir.Backend) bool { return b.Picker != nil }
func (externalPicking) cluster(_ ir.Backend, c *cluster.Cluster) error {
	return followHost(c, &overridehost.OverrideHost_OverrideHostSource{Metadata: pickerKey(wire.EndpointNodeKey)})
}
func (externalPicking) inboundCluster(_ ir.Backend, c *cluster.Cluster) error {
	return followHost(c, &overridehost.OverrideHost_OverrideHostSource{Header: wire.DestinationEndpointKey})
}
func (externalPicking) viaInboundOnly() bool { return true }

// followHost makes c take the host source names ("IP:port", or a list
// of them in order) while it is in the cluster, else the least loaded.
func followHost(c *cluster.Cluster, source *overridehost.OverrideHost_OverrideHostSource) error {
	fallback, err := anypb.New(&leastrequest.LeastRequest{})
	if err != nil {
		return err
	}
	return overrideHostFrom(c, []*overridehost.OverrideHost_OverrideHostSource{source}, "", "envoy.load_balancing_policies.least_request", fallback)
}

// servedReplicaHeaders are an inbound route's answer headers for a
// backend with an external picker: the replica that served (as the node
// knows it), whatever the replica said.
func servedReplicaHeaders(b ir.Backend) ([]*core.HeaderValueOption, []string) {
	if b.Picker == nil {
		return nil, nil
	}
	return []*core.HeaderValueOption{{Header: &core.HeaderValue{Key: wire.DestinationEndpointServedKey, Value: "%UPSTREAM_REMOTE_ADDRESS%"},
		AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}}, []string{wire.DestinationEndpointServedKey}
}

// endpointPickerCluster reaches b's external picker: gRPC (HTTP/2) at its
// IP and port, over TLS verified against the node's system trust store
// for that IP if it says.
func endpointPickerCluster(b ir.Backend) (*cluster.Cluster, error) {
	p := b.Picker
	name := wire.EndpointPickerCluster(b.Name)
	c := &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(ConnectTimeout),
		LoadAssignment: &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{{
			LbEndpoints: []*endpoint.LbEndpoint{{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: socketAddress(p.Host, p.Port),
			}}}},
		}}},
		TypedExtensionProtocolOptions: http2Options(),
	}
	if !p.TLS {
		return c, nil
	}
	socket, err := tlsSocket(&tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		AlpnProtocols: []string{"h2"},
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			SystemRootCerts: &tlsv3.CertificateValidationContext_SystemRootCerts{},
			MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{SanType: tlsv3.SubjectAltNameMatcher_IP_ADDRESS,
				Matcher: &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: p.Host}}}},
		}},
	}})
	if err != nil {
		return nil, fmt.Errorf("backend %s: endpoint picker's TLS: %w", b.Name, err)
	}
	c.TransportSocket = socket
	return c, nil
}

// askedPicker is the cluster of the external picker configs (a route's or
// a weighted cluster's) ask, or "".
func askedPicker(configs map[string]*anypb.Any) string {
	a, ok := configs[endpointPickerFilter]
	if !ok {
		return ""
	}
	wrapped := &route.FilterConfig{}
	if a.MessageIs(wrapped) {
		if a.UnmarshalTo(wrapped) != nil {
			return ""
		}
		a = wrapped.GetConfig()
	}
	per := &extproc.ExtProcPerRoute{}
	if a.UnmarshalTo(per) != nil {
		return ""
	}
	return per.GetOverrides().GetGrpcService().GetEnvoyGrpc().GetClusterName()
}
