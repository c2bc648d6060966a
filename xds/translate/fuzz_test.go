package translate

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
)

// FuzzTranslate: whatever a config file holds, a model the parser accepts
// translates into resources that pass Envoy's own validation rules and
// go-control-plane's consistency check, and a model Validate refuses never
// reaches translation.
func FuzzTranslate(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/in/*.yaml")
	for _, path := range seeds {
		if b, err := os.ReadFile(path); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := meshspec.Parse(data)
		if err != nil {
			return
		}
		translates(t, m, nil)
	})
}

// FuzzTranslateRefusesInvalid builds models from fuzzed fields without the
// parser, so invalid ones reach the door: what Validate accepts, ir.Lower
// must lower and Translate translate. And the catalog's replicas, which
// the door never sees, reach ir.Lower as they are: what the IR accepts
// of them must translate too, without a panic.
func FuzzTranslateRefusesInvalid(f *testing.F) {
	f.Add("b", "127.0.0.1:9001", "e", "/e", 1.0, 0.5, 16)
	f.Add("", "nonsense", "e e", "e", -1.0, 2.0, -4)
	f.Fuzz(func(t *testing.T, backend, addr, endpoint, route string, weight, shadow float64, mcq int) {
		m := &meshspec.Model{
			Backends: []meshspec.Backend{{Name: backend, Replicas: []meshspec.Replica{{Address: addr}}, Config: meshspec.BackendConfig{MaxConcurrentQueries: mcq}}},
			Endpoints: []meshspec.Endpoint{{Name: endpoint, Route: route, Traffic: map[string]float64{backend: weight},
				Shadows: map[string]float64{backend: shadow}}},
		}
		if m.Validate() == nil {
			translates(t, m, nil)
		}
		external := &meshspec.Model{
			Backends:  []meshspec.Backend{{Name: "b", External: &meshspec.ExternalSpec{Service: "s"}}},
			Endpoints: []meshspec.Endpoint{{Name: "e", Route: "/e", Traffic: map[string]float64{"b": 1}}},
		}
		catalog := map[string][]meshspec.Replica{"b": {{Address: addr, Node: backend, Inbound: route}}}
		if dp, err := ir.Lower(external, catalog, ir.Options{}); err == nil {
			res, err := Translate(dp, goldenNode, nil)
			if err != nil {
				t.Fatalf("replicas the IR accepted (%+v) did not translate: %v", catalog["b"], err)
			}
			checkEnvoyValid(t, res)
		}
	})
}

// translates fails t unless m, which passed Validate, with replicas,
// lowers and translates to resources Envoy takes.
func translates(t *testing.T, m *meshspec.Model, replicas map[string][]meshspec.Replica) {
	t.Helper()
	dp, err := ir.Lower(m, replicas, ir.Options{})
	if err != nil {
		t.Fatalf("a valid model's IR was refused: %v", err)
	}
	res, err := Translate(dp, goldenNode, nil)
	if err != nil {
		t.Fatalf("a valid model did not translate: %v", err)
	}
	checkEnvoyValid(t, res)
}
