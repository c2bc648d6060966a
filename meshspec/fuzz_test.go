package meshspec

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the config-file parser: it must never
// panic, and what it accepts must be valid, survive a round trip through
// Marshal unchanged, and validate again.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/invalid/*.yaml")
	more, _ := filepath.Glob("../../xds/translate/testdata/in/*.yaml")
	for _, path := range append(seeds, more...) {
		if b, err := os.ReadFile(path); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("{}"))
	f.Add([]byte(`{"backends": [{"name": "a", "replicas": [{"address": "127.0.0.1:1"}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("Parse accepted a model Validate refuses: %v", err)
		}
		out, err := Marshal(m)
		if err != nil {
			t.Fatalf("an accepted model does not marshal: %v", err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("an accepted model does not parse back from its own YAML: %v\n%s", err, out)
		}
		before, _ := json.Marshal(m)
		after, _ := json.Marshal(back)
		if string(before) != string(after) {
			t.Fatalf("round trip changed the model:\n%s\n%s", before, after)
		}
	})
}

// FuzzDecodeJSON feeds arbitrary bytes to the API's strict decoder for each
// request type: it must never panic, and a backend it accepts either
// validates or is refused by ValidateBackend with an error, never a panic.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"name": "a"}`, `{"name": "a", "config": {"num_replicas": 2}}`, `{"NAME": 1}`,
		`{"max_concurrent_queries": 4294967296}`, `{"autoscaling": {"max_replicas": 3, "target_in_flight_requests": 1e-18}}`,
		`{"name": "e", "route": "/x", "traffic": {"a": 1}}`, `[1, 2]`, `{"name": "a", "name": "b"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var b Backend
		if DecodeJSON(data, &b) == nil {
			_ = ValidateBackend(b)
		}
		var e Endpoint
		if DecodeJSON(data, &e) == nil {
			_ = (&Model{Endpoints: []Endpoint{e}}).Validate()
		}
		if p, err := ParseConfigPatch(data); err == nil {
			if c, err := p.Apply(BackendConfig{MaxConcurrentQueries: 4}); err == nil {
				_ = ValidateBackend(Backend{Name: "a", Config: c})
			}
		}
	})
}
