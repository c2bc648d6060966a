package meshspec

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestMarshalSpecWritesWhatUsersWrite: a config file servemesh writes
// (export, the demo's mesh.yaml) puts each object's fields in the order
// the README writes them, name first, writes nothing for what is unset
// (issue 40: `traffic: null`, `name:` after `config:`), quotes a string
// that would read as another type, and reads back as it was.
func TestMarshalSpecWritesWhatUsersWrite(t *testing.T) {
	s := &Spec{
		Backends: []BackendSpec{
			{Name: "model-v1", Config: BackendConfig{NumReplicas: 2, CPUs: 0.5}, Process: &ProcessSpec{Command: "/srv/model", Args: []string{"--port", "8080"}, Env: map[string]string{"MODE": "true", "N": "007", "Y": "off", "DATE": "2001-01-01", "T": "1:20", "U": "1_000", "P": "/a: b"}}},
			{Name: "static", Replicas: []ReplicaSpec{{Address: "127.0.0.1:9001"}}},
		},
		Endpoints: []Endpoint{
			{Name: "model", Route: "/model", Traffic: map[string]float64{"model-v1": 0.9, "static": 0.1}},
			{Name: "chat", Route: "/v1/chat", ModelRouting: &ByModel{Models: map[string]TrafficPolicy{"m": {Traffic: map[string]float64{"static": 1}}}}},
		},
	}
	out, err := MarshalSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	for _, want := range []string{"backends:\n  - name: model-v1\n    config:\n", "endpoints:\n  - name: model\n    route: /model\n", "MODE: \"true\"", "\"N\": \"007\"", "\"Y\": \"off\""} {
		if !strings.Contains(text, want) {
			t.Errorf("the file lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "null") || strings.Contains(text, "{") {
		t.Errorf("the file writes a null or a flow mapping:\n%s", text)
	}
	back, err := ParseSpec(out)
	if err != nil {
		t.Fatalf("the file does not read back: %v\n%s", err, text)
	}
	got, _ := json.Marshal(back)
	want, _ := json.Marshal(s)
	if string(got) != string(want) {
		t.Errorf("read back differs:\n got %s\nwant %s", got, want)
	}
}
