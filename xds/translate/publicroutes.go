package translate

import (
	"fmt"

	mutation "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	lua "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlymutation "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// The public listener's routes are scoped by a request's first path
// segment, so that a change to one endpoint sends each public node the
// routes of the endpoints that share its first segment, not the whole
// table (a table is one resource, sent whole at every change):
//
//  1. before routing and before any filter, the connection manager's
//     early header mutation writes wire.PublicRouteKeyFormat into
//     wire.PublicRouteKeyHeader ("public/api/v1" for "/api/v1?x", on the
//     normalised path), replacing any the client sent;
//  2. its scoped routes (publicScopes) key the request by that header's
//     first two '/'-separated fragments ("public", "api"), whose scope
//     names the route configuration (wire.PublicRouteName) of the
//     endpoints whose routes start with that segment, longest first, as
//     the one table had them. The request's filters are made on that
//     route, as before;
//  3. if no route matches (no scope has the key, or none of its routes
//     matches the path), routeFallbackFilter, first in the chain and off
//     on every public virtual host, sets the root's key and clears the
//     route cache: the root scope holds the routes of "/", which match
//     every path, as they did last in the one table; with no root
//     endpoint the request gets 404. Such a request's filters were made
//     on no route, so on this listener the filters a route turns on are
//     on already and idle without their route's config
//     (filterInput.offUntilRouted); so that a request does not pay for
//     filters no endpoint uses, the public chain holds only those some
//     routed endpoint needs (publicFilters).
//
// Every route a request could match in the one table sits in its scope
// (a route matches only paths of its own first segment, or it is "/"), in
// the same order, so each request goes where it went.
const routeFallbackFilter = "servemesh.route_fallback"

// routeFallbackSource is routeFallbackFilter's script, which runs only
// while no route matched.
var routeFallbackSource = fmt.Sprintf(`function envoy_on_request(h)
  if h:headers():get(%[1]q) ~= %[2]q then
    h:headers():replace(%[1]q, %[2]q)
    h:clearRouteCache()
  end
end`, wire.PublicRouteKeyHeader, wire.PublicRouteName(wire.PublicRootKey))

// routeFallback is the fallback filter, on the public listener alone.
func routeFallback(in filterInput) (*hcm.HttpFilter, error) {
	if !in.public {
		return nil, nil
	}
	config, err := anypb.New(&lua.Lua{DefaultSourceCode: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: routeFallbackSource}}})
	if err != nil {
		return nil, fmt.Errorf("pack %s filter: %w", routeFallbackFilter, err)
	}
	return &hcm.HttpFilter{Name: routeFallbackFilter, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: config}}, nil
}

// publicScopes takes the public listener's routes from the public
// scopes, keyed by the route key header, which the connection manager
// writes before it routes.
func publicScopes() routeSource {
	fragment := func(i uint32) *hcm.ScopedRoutes_ScopeKeyBuilder_FragmentBuilder {
		return &hcm.ScopedRoutes_ScopeKeyBuilder_FragmentBuilder{Type: &hcm.ScopedRoutes_ScopeKeyBuilder_FragmentBuilder_HeaderValueExtractor_{
			HeaderValueExtractor: &hcm.ScopedRoutes_ScopeKeyBuilder_FragmentBuilder_HeaderValueExtractor{
				Name:             wire.PublicRouteKeyHeader,
				ElementSeparator: "/",
				ExtractType:      &hcm.ScopedRoutes_ScopeKeyBuilder_FragmentBuilder_HeaderValueExtractor_Index{Index: i},
			}}}
	}
	writeKey := mustAny(&earlymutation.HeaderMutation{Mutations: []*mutation.HeaderMutation{{
		Action: &mutation.HeaderMutation_Append{Append: &core.HeaderValueOption{
			Header:       &core.HeaderValue{Key: wire.PublicRouteKeyHeader, Value: wire.PublicRouteKeyFormat},
			AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}},
	}}})
	return func(m *hcm.HttpConnectionManager) {
		m.EarlyHeaderMutationExtensions = []*core.TypedExtensionConfig{{Name: "envoy.http.early_header_mutation.header_mutation", TypedConfig: writeKey}}
		m.RouteSpecifier = &hcm.HttpConnectionManager_ScopedRoutes{ScopedRoutes: &hcm.ScopedRoutes{
			Name:            wire.PublicRoutes,
			ScopeKeyBuilder: &hcm.ScopedRoutes_ScopeKeyBuilder{Fragments: []*hcm.ScopedRoutes_ScopeKeyBuilder_FragmentBuilder{fragment(0), fragment(1)}},
			RdsConfigSource: adsConfigSource(),
			ConfigSpecifier: &hcm.ScopedRoutes_ScopedRds{ScopedRds: &hcm.ScopedRds{ScopedRdsConfigSource: adsConfigSource()}},
		}}
	}
}

// publicVirtualHost is the one virtual host of every public route
// configuration: the shared one's settings (virtualHost), the route key
// kept from the replicas, and the fallback off, since a route matched.
func publicVirtualHost(routes []*route.Route) *route.VirtualHost {
	vh := virtualHost(wire.PublicVirtualHost, routes)
	vh.RequestHeadersToRemove = append(vh.RequestHeadersToRemove, wire.PublicRouteKeyHeader)
	vh.TypedPerFilterConfig = map[string]*anypb.Any{routeFallbackFilter: mustAny(&lua.LuaPerRoute{Override: &lua.LuaPerRoute_Disabled{Disabled: true}})}
	return vh
}

// publicRoutesConfig is the public route configuration of key: routes, in
// order.
func publicRoutesConfig(key string, routes []*route.Route) *route.RouteConfiguration {
	// A public client's TTFT objective would put its requests ahead of
	// others' while they wait: only callers inside the mesh state one.
	rc := &route.RouteConfiguration{Name: wire.PublicRouteName(key), VirtualHosts: []*route.VirtualHost{publicVirtualHost(routes)},
		RequestHeadersToRemove: []string{wire.TTFTObjectiveHeader}}
	// Envoy refuses a table whose direct answers exceed 4 KiB unless it
	// says how long they may be (a long model list).
	longest := 0
	for _, r := range routes {
		longest = max(longest, len(r.GetDirectResponse().GetBody().GetInlineString()))
	}
	if longest > defaultDirectBodyLimit {
		rc.MaxDirectResponseBodySizeBytes = wrapperspb.UInt32(uint32(longest))
	}
	return rc
}

// defaultDirectBodyLimit is how long Envoy lets a direct answer be when a
// route configuration does not say.
const defaultDirectBodyLimit = 4096

// publicScope selects key's public route configuration.
func publicScope(key string) *route.ScopedRouteConfiguration {
	name := wire.PublicRouteName(key)
	return &route.ScopedRouteConfiguration{
		Name:                   name,
		RouteConfigurationName: name,
		Key: &route.ScopedRouteConfiguration_Key{Fragments: []*route.ScopedRouteConfiguration_Key_Fragment{
			{Type: &route.ScopedRouteConfiguration_Key_Fragment_StringKey{StringKey: wire.PublicRoutes}},
			{Type: &route.ScopedRouteConfiguration_Key_Fragment_StringKey{StringKey: key}},
		}},
	}
}

// byRouteKey groups items by the route key of their route, each group
// sorted longest route first (the order the public table matches in).
func byRouteKey[T any](items []T, routeOf func(T) string) map[string][]T {
	out := map[string][]T{}
	for _, it := range items {
		key := wire.PublicRouteKey(routeOf(it))
		out[key] = append(out[key], it)
	}
	for _, group := range out {
		sortByRoute(group, routeOf)
	}
	return out
}

// routedEndpoints are m's endpoints with a route.
func routedEndpoints(m *ir.DataPlane) []ir.Endpoint {
	routed := make([]ir.Endpoint, 0, len(m.Endpoints))
	for _, e := range m.Endpoints {
		if !e.Headless() {
			routed = append(routed, e)
		}
	}
	return routed
}
