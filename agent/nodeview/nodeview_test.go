package nodeview

import (
	"testing"

	"github.com/servemesh/servemesh/meshspec"
)

// TestView: backends by name, and which run a replica here (a replica
// draining or placed elsewhere does not count); a nil view has none.
func TestView(t *testing.T) {
	m := &meshspec.Model{Backends: []meshspec.Backend{
		{Name: "here", Placements: []meshspec.Placement{{Tag: "here#1", Node: "n1", State: meshspec.Running}}},
		{Name: "elsewhere", Placements: []meshspec.Placement{{Tag: "elsewhere#1", Node: "n2", State: meshspec.Running}}},
		{Name: "static", Replicas: []meshspec.Replica{{Address: "10.0.0.1:80"}}},
	}}
	v := New(m, "n1")
	if b, ok := v.Backend("static"); !ok || b.Name != "static" {
		t.Fatalf("Backend(static) = %+v, %v", b, ok)
	}
	if _, ok := v.Backend("ghost"); ok {
		t.Fatal("a backend the state lacks was found")
	}
	if !v.PlacedHere("here") || v.PlacedHere("elsewhere") || v.PlacedHere("static") {
		t.Fatalf("placed here: here %v, elsewhere %v, static %v", v.PlacedHere("here"), v.PlacedHere("elsewhere"), v.PlacedHere("static"))
	}
	var none *View
	if _, ok := none.Backend("here"); ok || none.PlacedHere("here") || New(nil, "n1") != nil {
		t.Fatal("a nil view has backends")
	}
}

// TestLatestHoldsTheLastViewSet: none at first (a nil view, which reads as
// no desired state), then the last view set and the state it was made of.
func TestLatestHoldsTheLastViewSet(t *testing.T) {
	var l Latest
	if l.View() != nil || l.Model() != nil {
		t.Fatal("a new Latest holds a view")
	}
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "b"}}}
	l.Set(New(m, "n1"))
	if _, ok := l.View().Backend("b"); !ok || l.Model() != m {
		t.Fatalf("after Set: view %+v, model %p; want backend b and model %p", l.View(), l.Model(), m)
	}
}
