package ir

import (
	"reflect"
	"testing"

	"github.com/servemesh/servemesh/meshspec"
)

// TestPickedBackendsNameReadyReplicasByNode: an endpoint reads, of each
// backend with an external picker it sends or mirrors to, the ready
// replicas as the picker names them (their node's address, their own
// port; one node's replicas are ranks of one address), with the inbound
// listener and local address that reach each; a replica not healthy is
// not offered, and a backend without a picker is not listed.
func TestPickedBackendsNameReadyReplicasByNode(t *testing.T) {
	dp := &DataPlane{Backends: []Backend{ // sorted by name, as a data plane's are
		{Name: "plain", Reach: ReachInbound, MaxConcurrent: 1},
		{Name: "pool", Reach: ReachInbound, MaxConcurrent: 1, Picker: lowerPicker(meshspec.EndpointPicker{Address: "10.0.0.9:9002", FailOpen: true}), Replicas: []Replica{
			{Address: "127.0.0.1:9002", Health: Healthy, Node: "n2", Inbound: "10.0.0.2:21000"},
			{Address: "127.0.0.1:9001", Health: Healthy, Node: "n1", Inbound: "10.0.0.1:21000"},
			{Address: "127.0.0.1:9003", Health: Healthy, Node: "n1", Inbound: "10.0.0.1:21000"},
			{Address: "127.0.0.1:9004", Health: Draining, Node: "n1", Inbound: "10.0.0.1:21000"},
		}},
	}}
	got := dp.pickedBackends(Endpoint{Name: "e", Traffic: map[string]float64{"plain": 0.5, "pool": 0.5}})
	want := []PickedBackend{{Name: "pool", FailOpen: true, Endpoints: []PickerEndpoint{
		{Endpoint: "10.0.0.1:9001", Inbound: "10.0.0.1:21000", Local: "127.0.0.1:9001"},
		{Endpoint: "10.0.0.1:9003", Inbound: "10.0.0.1:21000", Local: "127.0.0.1:9003"},
		{Endpoint: "10.0.0.2:9002", Inbound: "10.0.0.2:21000", Local: "127.0.0.1:9002"},
	}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("picked backends:\n got %+v\nwant %+v", got, want)
	}
	if got := dp.pickedBackends(Endpoint{Name: "m", Traffic: map[string]float64{"plain": 1}, Shadows: map[string]float64{"pool": 0.1}}); len(got) != 1 {
		t.Errorf("an endpoint mirroring to pool reads %+v; want pool", got)
	}
	if p := lowerPicker(meshspec.EndpointPicker{Address: "epp.internal:9002"}); p != nil {
		t.Errorf("a picker named by DNS lowered to %+v; want none (validation refuses it)", p)
	}
}
