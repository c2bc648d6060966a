package catalog

import (
	"testing"

	"github.com/servemesh/servemesh/controlplane/model"
)

func TestDataPlaneView(t *testing.T) {
	m := &model.Model{Backends: []model.Backend{
		{Name: "run", Process: &model.ProcessSpec{Command: "x"}, Config: model.BackendConfig{NumReplicas: 2,
			Autoscaling: &model.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 3, TargetInFlight: 1}}, Placements: []model.Placement{
			{Tag: "run#000001", Node: "n1", State: model.Running},
			{Tag: "run#000002", Node: "n2", State: model.Draining},
			{Tag: "run#000003", Node: "n3", State: model.Running},
		}},
		{Name: "ext", External: &model.ExternalSpec{Service: "legacy"}},
		{Name: "static", Replicas: []model.Replica{{Address: "127.0.0.1:1"}}},
	}}
	view := DataPlaneView(m, map[string][]Instance{
		"run": {
			{ID: "a", Address: "127.0.0.2:1000", Tag: "run#000001", Passing: true},
			{ID: "b", Address: "127.0.0.3:1000", Tag: "run#000002", Passing: true},
			{ID: "c", Address: "127.0.0.4:1000", Tag: "run#000003", Passing: false},
			{ID: "d", Address: "127.0.0.5:1000", Tag: "run#ffffff", Passing: true}, // not placed
		},
		"legacy": {{ID: "l", Address: "10.0.0.1:80", Passing: true}},
	})
	if err := view.Validate(); err != nil {
		t.Fatalf("the data-plane view must be a valid model: %v", err)
	}
	want := []model.Replica{
		{Address: "127.0.0.2:1000", Health: model.HealthHealthy},
		{Address: "127.0.0.3:1000", Health: model.HealthDraining},
		{Address: "127.0.0.4:1000", Health: model.HealthUnhealthy},
	}
	if got := view.Backends[0].Replicas; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("process backend replicas %+v, want %+v", got, want)
	}
	if got := view.Backends[1].Replicas; len(got) != 1 || got[0].Address != "10.0.0.1:80" {
		t.Fatalf("external backend replicas %+v", got)
	}
	if len(view.Backends[2].Replicas) != 1 || m.Backends[0].Replicas != nil {
		t.Fatal("static replicas lost, or the input model was modified")
	}
	if s := Services(m); len(s) != 2 || s[0] != "run" || s[1] != "legacy" {
		t.Fatalf("services %v", s)
	}
}
