package ir

import (
	"reflect"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/meshspec"
)

// affineState is a mesh with a prompt-affine backend, whose nodes its
// endpoint's IR carries, and a plain one with an endpoint of its own.
func affineState() (*meshspec.Model, map[string][]meshspec.Replica) {
	state := &meshspec.Model{
		Backends: []meshspec.Backend{
			{Name: "llama", Config: meshspec.BackendConfig{LoadAware: &meshspec.LoadAware{PromptAffinity: true}}},
			{Name: "plain"},
		},
		Endpoints: []meshspec.Endpoint{
			{Name: "chat", Route: "/chat", Traffic: map[string]float64{"llama": 1}},
			{Name: "other", Route: "/other", Traffic: map[string]float64{"plain": 1}},
		},
	}
	replicas := map[string][]meshspec.Replica{
		"llama": {{Address: "127.0.0.1:9001", Node: "node-1", Inbound: "10.0.0.1:21000"}},
		"plain": {{Address: "127.0.0.1:9002", Node: "node-1", Inbound: "10.0.0.1:21000"}},
	}
	return state, replicas
}

func lowerWhole(t *testing.T, state *meshspec.Model, replicas map[string][]meshspec.Replica) *DataPlane {
	t.Helper()
	dp, err := Lower(state, replicas, Options{MTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	return dp
}

// TestLowerDeltaIsLowerWhole: an IR lowered from the last one where a
// change names is the IR lowered whole, also for an endpoint the change
// does not name that reads a backend it names (a prompt-affine backend's
// nodes, a backend's first-byte timeout), and for backends and endpoints
// added and gone.
func TestLowerDeltaIsLowerWhole(t *testing.T) {
	state, replicas := affineState()
	prev := lowerWhole(t, state, replicas)
	prev.Seq = 1
	steps := []struct {
		name               string
		change             func(*meshspec.Model, map[string][]meshspec.Replica)
		backends, endpoint []string
	}{
		{"a replica of the affine backend on a new node", func(_ *meshspec.Model, r map[string][]meshspec.Replica) {
			r["llama"] = append(r["llama"], meshspec.Replica{Address: "127.0.0.1:9001", Node: "node-2", Inbound: "10.0.0.2:21000"})
		}, []string{"llama"}, nil},
		{"the backend is no longer affine", func(m *meshspec.Model, _ map[string][]meshspec.Replica) {
			m.Backends[0].Config.LoadAware = nil
		}, []string{"llama"}, nil},
		{"a backend and its endpoint added", func(m *meshspec.Model, r map[string][]meshspec.Replica) {
			m.Backends = append(m.Backends, meshspec.Backend{Name: "added"})
			m.Endpoints = append(m.Endpoints, meshspec.Endpoint{Name: "added", Route: "/added", Traffic: map[string]float64{"added": 1}})
			r["added"] = []meshspec.Replica{{Address: "127.0.0.1:9003", Node: "node-2", Inbound: "10.0.0.2:21000"}}
		}, []string{"added"}, []string{"added"}},
		{"the plain backend's first-byte timeout, which its endpoint takes", func(m *meshspec.Model, _ map[string][]meshspec.Replica) {
			m.Backends[1].Config.FirstByteTimeoutS = 2
		}, []string{"plain"}, nil},
		{"a plain replica's health", func(_ *meshspec.Model, r map[string][]meshspec.Replica) {
			r["plain"] = []meshspec.Replica{{Address: "127.0.0.1:9002", Node: "node-1", Inbound: "10.0.0.1:21000", Health: meshspec.HealthUnhealthy}}
		}, []string{"plain"}, nil},
		{"a backend and its endpoint gone", func(m *meshspec.Model, r map[string][]meshspec.Replica) {
			m.Backends, m.Endpoints = m.Backends[:2], m.Endpoints[:2]
			delete(r, "added")
		}, []string{"added"}, []string{"added"}},
	}
	for _, s := range steps {
		s.change(state, replicas)
		d := &Delta{Since: prev.Seq}
		d.AddBackends(s.backends...)
		d.AddEndpoints(s.endpoint...)
		got, err := LowerDelta(prev, state, replicas, d, Options{MTLS: true})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		want := lowerWhole(t, state, replicas)
		whole := *got
		whole.Seq, whole.Changes = 0, nil
		if !reflect.DeepEqual(&whole, want) {
			t.Fatalf("%s: lowered from the delta:\n%+v\nwant, lowered whole:\n%+v", s.name, whole, *want)
		}
		got.Seq = prev.Seq + 1
		prev = got
	}
}

// TestLowerDeltaRefuses: a delta that does not follow the last IR is
// refused, and so is a backend gone that an endpoint the delta does not
// name still sends to (a state that would not pass meshspec.Validate):
// validating only what the delta names still checks every endpoint then.
func TestLowerDeltaRefuses(t *testing.T) {
	state, replicas := affineState()
	prev := lowerWhole(t, state, replicas)
	prev.Seq = 3
	d := &Delta{Since: 2}
	d.AddBackends("plain")
	if _, err := LowerDelta(prev, state, replicas, d, Options{MTLS: true}); err == nil {
		t.Fatal("a delta since data plane 2 was lowered from data plane 3")
	}
	state.Backends = state.Backends[:1] // "plain" gone, "other" still sends to it
	d.Since = 3
	_, err := LowerDelta(prev, state, replicas, d, Options{MTLS: true})
	if err == nil || !strings.Contains(err.Error(), `endpoint "other" sends to backend "plain"`) {
		t.Fatalf("err = %v, want the endpoint that sends to a backend gone named", err)
	}
}
