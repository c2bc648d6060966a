package api

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/controlplane/autoscale"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	xdsserver "github.com/servemesh/servemesh/xds/server"
)

func TestNewStatusReport(t *testing.T) {
	m := &meshspec.Model{
		Backends: []meshspec.Backend{
			{Name: "v1", Replicas: []meshspec.Replica{{Address: "127.0.0.1:1"}, {Address: "127.0.0.1:2"}}},
			{Name: "v2", Process: &meshspec.ProcessSpec{Command: "/srv/x"}, Config: meshspec.BackendConfig{NumReplicas: 3,
				Autoscaling: &meshspec.AutoscalingConfig{MaxReplicas: 4, TargetInFlight: 1}},
				Placements: []meshspec.Placement{{Tag: "v2#1", State: meshspec.Running}, {Tag: "v2#2", State: meshspec.Running}, {Tag: "v2#3", State: meshspec.Draining}}},
		},
		Endpoints: []meshspec.Endpoint{{Name: "e", Route: "/e", Traffic: map[string]float64{"v1": 0.75, "v2": 0.25}, Shadows: map[string]float64{"v2": 0.1}}},
	}
	load := map[string]autoscale.BackendLoad{"v1": {InFlight: 2, RequestRate: 30, ErrorRate: 1}, "v2": {RequestRate: 10}}
	nodes := []xdsserver.NodeStatus{{ID: "n1", Connected: true, InSync: false, NACKs: 2, LastNACK: "port taken", Version: "v1.0", Protocol: 2},
		{ID: "n9", Version: "v9.0", Protocol: 9, Skew: "node n9 runs servemesh v9.0 (protocol 9), newer than this controller's"}}
	health := func(b meshspec.Backend) ReplicaHealth {
		if b.Name != "v2" {
			t.Errorf("health asked of %s, which servemesh does not run", b.Name)
		}
		return ReplicaHealth{Ready: 1}
	}
	routes := map[string]autoscale.BackendLoad{"e": {RequestRate: 40, ErrorRate: 1}}
	got := NewStatusReport(StatusInputs{State: m, Backends: load, Endpoints: routes, Health: health, Nodes: nodes, Problems: []string{"key x: unreadable"},
		Unread: map[string]string{"n1": "connection refused"}})
	want := StatusReport{
		RateWindowS: 10,
		Endpoints: []EndpointStatus{{Name: "e", Route: "/e", RequestRate: 40, ErrorRate: 1, Backends: []EndpointBackendStatus{
			{Backend: "v1", Weight: 0.75, RequestRate: 30, ErrorRate: 1},
			{Backend: "v2", Weight: 0.25, Shadow: 0.1, RequestRate: 10},
		}}},
		Backends: []BackendStatus{
			{Name: "v1", Desired: 2, Running: 2, Ready: 2, InFlight: 2, RequestRate: 30, ErrorRate: 1},
			{Name: "v2", Desired: 3, Running: 2, Ready: 1, Draining: 1, Autoscaled: true, RequestRate: 10},
		},
		Nodes: []NodeStatus{{ID: "n1", Connected: true, NACKs: 2, LastNACK: "port taken", Version: "v1.0", Protocol: 2, FiguresUnread: "connection refused"},
			{ID: "n9", Version: "v9.0", Protocol: 9, Skew: "node n9 runs servemesh v9.0 (protocol 9), newer than this controller's"}},
		Problems: []string{"key x: unreadable",
			`backend "v2": 1 of 2 placed replicas are not ready; 1 starting, failing their health check, or not registered by their agent`,
			"refused: node n9 runs servemesh v9.0 (protocol 9), newer than this controller's"},
		Version: wire.Version, Protocol: wire.Protocol,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("status report\n got %+v\nwant %+v", got, want)
	}
	if empty := NewStatusReport(StatusInputs{State: &meshspec.Model{}, Health: health}); empty.Endpoints == nil || empty.Backends == nil || empty.Nodes == nil || empty.Problems == nil {
		t.Fatal("an empty report must list empty arrays, not null")
	}
}

// TestShadowShare: a shadow backend that serves nothing else shows the
// share of the endpoint's requests it gets next to the set proportion; one
// that also serves other traffic shows none (it cannot be told apart).
func TestShadowShare(t *testing.T) {
	m := &meshspec.Model{
		Backends: []meshspec.Backend{{Name: "v1", Replicas: []meshspec.Replica{{Address: "127.0.0.1:1"}}},
			{Name: "only-shadow", Replicas: []meshspec.Replica{{Address: "127.0.0.1:2"}}}},
		Endpoints: []meshspec.Endpoint{
			{Name: "e", Route: "/e", Traffic: map[string]float64{"v1": 1}, Shadows: map[string]float64{"only-shadow": 0.2, "v1": 0.1}},
		},
	}
	r := NewStatusReport(StatusInputs{State: m, Health: func(meshspec.Backend) ReplicaHealth { return ReplicaHealth{} },
		Backends:  map[string]autoscale.BackendLoad{"v1": {RequestRate: 110}, "only-shadow": {RequestRate: 20.5}},
		Endpoints: map[string]autoscale.BackendLoad{"e": {RequestRate: 100}}})
	for _, b := range r.Endpoints[0].Backends {
		switch b.Backend {
		case "only-shadow":
			if b.ShadowShare == nil || *b.ShadowShare != 0.205 {
				t.Errorf("only-shadow's share: %v, want 0.205", b.ShadowShare)
			}
		case "v1":
			if b.ShadowShare != nil {
				t.Errorf("v1 serves the endpoint too, yet has a shadow share %v", *b.ShadowShare)
			}
		}
	}
}

// TestStatusOfAnEndpointRoutedByModel: each model's split and shadows are
// rows of their own, named by the model.
func TestStatusOfAnEndpointRoutedByModel(t *testing.T) {
	m := &meshspec.Model{Endpoints: []meshspec.Endpoint{{Name: "chat", Route: "/v1", ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{
		"b-model": {Traffic: map[string]float64{"x": 1}},
		"a-model": {Traffic: map[string]float64{"x": 0.25, "y": 0.75}, Shadows: map[string]float64{"z": 0.5}},
	}}}}}
	got := NewStatusReport(StatusInputs{State: m, Health: func(meshspec.Backend) ReplicaHealth { return ReplicaHealth{} }}).Endpoints[0].Backends
	want := []EndpointBackendStatus{
		{Backend: "x", Model: "a-model", Weight: 0.25}, {Backend: "y", Model: "a-model", Weight: 0.75}, {Backend: "z", Model: "a-model", Shadow: 0.5},
		{Backend: "x", Model: "b-model", Weight: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rows %+v, want %+v", got, want)
	}
}

// TestARateLimitServiceDownIsAProblem: while an endpoint has a global rate
// limit, a node whose agent cannot reach its rate limit service is a
// problem, and its node says why; with no such limit, or with the service
// up, nothing is said.
func TestARateLimitServiceDownIsAProblem(t *testing.T) {
	limited := meshspec.Endpoint{Name: "api", Route: "/api", Traffic: map[string]float64{"v1": 1},
		RateLimit: &meshspec.RateLimit{Global: &meshspec.GlobalRateLimit{Requests: 5, Unit: "minute"}}}
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "v1", Replicas: []meshspec.Replica{{Address: "127.0.0.1:1"}}}}, Endpoints: []meshspec.Endpoint{limited}}
	nodes := []xdsserver.NodeStatus{{ID: "n1", Connected: true, InSync: true}, {ID: "n2", Connected: true, InSync: true}}
	loads := map[string]wire.Load{"n1": {RateLimitService: "dial unix ratelimit.sock: connection refused"}, "n2": {RateLimitsLoaded: map[string]string{}}}
	r := NewStatusReport(StatusInputs{State: m, Nodes: nodes, Loads: loads})
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "node n1: its rate limit service cannot be reached (dial unix ratelimit.sock: connection refused)") ||
		!strings.Contains(r.Problems[0], "token quotas of api are not counted there") {
		t.Errorf("problems: %q", r.Problems)
	}
	if r.Nodes[0].RateLimitService == "" || r.Nodes[1].RateLimitService != "" {
		t.Errorf("nodes: %+v", r.Nodes)
	}
	m.Endpoints[0].RateLimit = nil
	if r := NewStatusReport(StatusInputs{State: m, Nodes: nodes, Loads: loads}); len(r.Problems) != 0 || r.Nodes[0].RateLimitService != "" {
		t.Errorf("with no global limit: problems %q, nodes %+v", r.Problems, r.Nodes)
	}
}

// TestSpansThatCannotBeSentAreAProblem: while the mesh traces, a node
// whose agent says its spans cannot be sent to the collector is a problem
// naming it, and its node is marked; while the mesh traces nothing, it
// is not.
func TestSpansThatCannotBeSentAreAProblem(t *testing.T) {
	m := &meshspec.Model{Mesh: &meshspec.Mesh{Tracing: &meshspec.Tracing{Collector: "127.0.0.1:4317"}}}
	nodes := []xdsserver.NodeStatus{{ID: "n1", Connected: true, InSync: true}, {ID: "n2", Connected: true, InSync: true}}
	why := "its spans cannot be sent to the mesh's collector 127.0.0.1:4317: connection refused"
	loads := map[string]wire.Load{"n1": {}, "n2": {Tracing: why}}
	r := NewStatusReport(StatusInputs{State: m, Nodes: nodes, Loads: loads})
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "node n2: "+why) {
		t.Errorf("problems: %q", r.Problems)
	}
	if r.Nodes[0].Tracing != "" || r.Nodes[1].Tracing != why {
		t.Errorf("nodes: %+v", r.Nodes)
	}
	m.Mesh = nil
	if r := NewStatusReport(StatusInputs{State: m, Nodes: nodes, Loads: loads}); len(r.Problems) != 0 || r.Nodes[1].Tracing != "" {
		t.Errorf("with tracing off: problems %q, nodes %+v", r.Problems, r.Nodes)
	}
}

// TestMergeNodesCompletesAnHAReport: one controller's report knows only
// the nodes connected to it; the others' complete it, a node connected
// elsewhere marked with its controller and keeping its maintenance.
func TestMergeNodesCompletesAnHAReport(t *testing.T) {
	r := StatusReport{Nodes: []NodeStatus{
		{ID: "n1", Connected: true, InSync: true},
		{ID: "n2", Connected: false, Cordoned: true},
		{ID: "n4", Connected: false},
	}}
	MergeNodes(&r, []ControllerNodes{
		{Controller: "c1:18001", Nodes: []xdsserver.NodeStatus{{ID: "n1", Connected: true, InSync: true}, {ID: "n2", Connected: false}}},
		{Controller: "c2:18001", Nodes: []xdsserver.NodeStatus{{ID: "n2", Connected: true, InSync: true, Version: "v2"}, {ID: "n3", Connected: true}, {ID: "n1", Connected: false}}},
		{Controller: "c3:18001", Err: errors.New("connection refused")},
	})
	want := []NodeStatus{
		{ID: "n1", Connected: true, InSync: true},
		{ID: "n2", Connected: true, InSync: true, Version: "v2", Cordoned: true, Controller: "c2:18001"},
		{ID: "n3", Connected: true, Controller: "c2:18001"},
		{ID: "n4", Connected: false},
	}
	if !reflect.DeepEqual(r.Nodes, want) {
		t.Fatalf("merged nodes\n got %+v\nwant %+v", r.Nodes, want)
	}
}
