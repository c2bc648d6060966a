package translate

import (
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// TestPublicClientsDecideNothingOfTheMesh: a public client sending a
// rollout's header-stage header sent its request to the candidate, and so
// decided the stage's verdict; one saying x-servemesh-criticality:
// critical was never shed (issue 34). On the public listener a mesh-only
// rule is left out and the criticality is overwritten with the
// endpoint's; on the mesh listener both are as the caller says.
func TestPublicClientsDecideNothingOfTheMesh(t *testing.T) {
	e := ir.Endpoint{Name: "gen", Route: "/gen", Methods: []string{"GET"}, Traffic: map[string]float64{"v1": 1}, Criticality: wire.Sheddable,
		Match: []ir.Match{{Header: "x-canary", Exact: "1", Backend: "v2", MeshOnly: true}, {Header: "x-user", Exact: "a", Backend: "v1"}}}
	for _, tc := range []struct {
		from      caller
		canary    bool
		overwrite bool
	}{{public, false, true}, {mesh, true, false}} {
		routes := endpointRoutes(e, pathMatch(e.Route), tc.from)
		canary, criticality := false, 0
		for _, r := range routes {
			for _, m := range r.GetMatch().GetHeaders() {
				canary = canary || m.GetName() == "x-canary"
			}
			for _, h := range r.GetRequestHeadersToAdd() {
				if h.GetHeader().GetKey() == wire.CriticalityHeader {
					criticality++
					if got := h.GetAppendAction() == core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD; got != tc.overwrite {
						t.Errorf("public=%v: route %s sets criticality with %v", tc.from, r.GetName(), h.GetAppendAction())
					}
				}
			}
		}
		if canary != tc.canary || criticality == 0 {
			t.Errorf("public=%v: the mesh-only rule is there: %v (want %v); criticality set on %d routes", tc.from, canary, tc.canary, criticality)
		}
		if names := routeNames(routes); !strings.Contains(names, "match-1") {
			t.Errorf("public=%v: the endpoint's own rule is gone: %s", tc.from, names)
		}
	}
}

func routeNames(routes []*route.Route) string {
	var out []string
	for _, r := range routes {
		out = append(out, r.GetName())
	}
	return strings.Join(out, " ")
}
