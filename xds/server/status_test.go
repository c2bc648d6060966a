package server

import (
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// TestAckedAllNeedsNoACKForAnEmptyType: a node of an empty mesh holds
// scopes but no route configuration, so its Envoy never asks for routes;
// it is in sync once it ACKed the rest (the controller reported such a
// node out of sync forever). A type with resources still needs its ACK.
func TestAckedAllNeedsNoACKForAnEmptyType(t *testing.T) {
	full := func(version string) *kind {
		return &kind{version: version, twins: map[string]types.Resource{"x": nil}, versions: map[string]string{"x": version}}
	}
	empty := &kind{version: "e3b0c44298fc1c14", twins: map[string]types.Resource{}, versions: map[string]string{}}
	n := &nodeState{
		set: snapshot{resource.ClusterType: full("c1"), resource.ListenerType: full("l1"),
			resource.ScopedRouteType: empty, resource.RouteType: empty},
		acked: map[string]string{resource.ClusterType: "c1", resource.ListenerType: "l1", resource.ScopedRouteType: "e3b0c44298fc1c14"},
	}
	if !n.ackedAll() {
		t.Fatal("a node that ACKed every type it has resources of is reported out of sync")
	}
	n.acked[resource.RouteType] = "r-old" // its last scope went away: it unsubscribed
	if !n.ackedAll() {
		t.Fatal("a node that unsubscribed from the routes it no longer has is reported out of sync")
	}
	n.set[resource.RouteType] = full("r2")
	if n.ackedAll() {
		t.Fatal("a node that did not ACK its routes is reported in sync")
	}
	n.acked[resource.RouteType] = "r2"
	n.acked[resource.ListenerType] = "l0"
	if n.ackedAll() {
		t.Fatal("a node that did not ACK its listeners is reported in sync")
	}
}
