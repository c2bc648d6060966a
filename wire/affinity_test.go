package wire

import (
	"strings"
	"testing"
)

// TestAffinityRoute: a route's affinity nodes go through their encoding
// whole; an address that is not IP:port, a share under one, or an
// encoding too long is refused.
func TestAffinityRoute(t *testing.T) {
	r := AffinityRoute{Headers: []string{"x-session-id"}, Backends: []AffinityBackend{{Name: "llama", Nodes: []AffinityNode{{Inbound: "10.0.0.1:21000", Replicas: 2}}}}}
	v, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseAffinityRoute(v)
	if err != nil || len(got.Backends) != 1 || got.Backends[0].Nodes[0] != r.Backends[0].Nodes[0] || got.Headers[0] != "x-session-id" {
		t.Fatalf("ParseAffinityRoute(%s) = %+v, %v", v, got, err)
	}
	for _, bad := range []string{
		`{"backends":[{"name":"b","nodes":[{"inbound":"node-1:21000","replicas":1}]}]}`,
		`{"backends":[{"name":"b","nodes":[{"inbound":"10.0.0.1:21000","replicas":0}]}]}`,
		`{"backends":`,
		strings.Repeat(" ", MaxAffinityRouteBytes+1),
	} {
		if _, err := ParseAffinityRoute(bad); err == nil {
			t.Errorf("ParseAffinityRoute(%.60q) took it", bad)
		}
	}
	many := AffinityRoute{Backends: []AffinityBackend{{Name: "b"}}}
	for range 400 {
		many.Backends[0].Nodes = append(many.Backends[0].Nodes, AffinityNode{Inbound: "10.100.100.100:21000", Replicas: 1})
	}
	if _, err := many.Encode(); err == nil {
		t.Error("400 nodes encoded past MaxAffinityRouteBytes")
	}
}
