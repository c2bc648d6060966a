package server

import (
	"testing"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/xds/translate"
)

// TestKindsSendTheResourcesAndEncodeOnce: what go-control-plane marshals
// from a kind is each resource byte for byte, and a kind built after a
// change re-encodes only the resources the builder rebuilt.
func TestKindsSendTheResourcesAndEncodeOnce(t *testing.T) {
	m := modelgen.Model(5, 3, 2)
	b := translate.NewBuilder(nil)
	first, err := b.Build(m)
	if err != nil {
		t.Fatal(err)
	}
	k1, err := newKind(first.RoutesVersion, first.Routes, lookup(first.RouteVersions), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range first.Routes {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := proto.MarshalOptions{Deterministic: true}.Marshal(k1.items[r.GetName()])
		if err != nil {
			t.Fatal(err)
		}
		var back route.RouteConfiguration
		if string(got) != string(want) || proto.Unmarshal(got, &back) != nil || !proto.Equal(&back, r) {
			t.Fatalf("route configuration %s is not sent as itself", r.GetName())
		}
	}

	next := *m
	next.Endpoints = append(next.Endpoints[:0:0], m.Endpoints...)
	next.Endpoints[2].Traffic = map[string]float64{next.Endpoints[2].Name + "-v0": 1}
	second, err := b.Build(&next)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := newKind(second.RoutesVersion, second.Routes, lookup(second.RouteVersions), k1)
	if err != nil {
		t.Fatal(err)
	}
	var reencoded []string
	for name, twin := range k2.items {
		if k1.items[name] != twin {
			reencoded = append(reencoded, name)
		}
	}
	if len(reencoded) != 2 { // the endpoint's mesh routes and the public table
		t.Fatalf("a traffic change re-encoded %v; want the endpoint's mesh routes and the public table", reencoded)
	}
}
