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
		dp, err := ir.Lower(m, ir.Options{})
		if err != nil {
			t.Fatalf("a valid model's IR was refused: %v", err)
		}
		res, err := Translate(dp, goldenNode, nil)
		if err != nil {
			t.Fatalf("a valid model did not translate: %v", err)
		}
		checkEnvoyValid(t, res)
	})
}

// FuzzTranslateRefusesInvalid builds models from fuzzed fields without the
// parser, so invalid ones reach the IR: ir.Lower must refuse every one
// Validate refuses, and what it accepts must translate, without a panic.
func FuzzTranslateRefusesInvalid(f *testing.F) {
	f.Add("b", "127.0.0.1:9001", "e", "/e", 1.0, 0.5, 16)
	f.Add("", "nonsense", "e e", "e", -1.0, 2.0, -4)
	f.Fuzz(func(t *testing.T, backend, addr, endpoint, route string, weight, shadow float64, mcq int) {
		m := &meshspec.Model{
			Backends: []meshspec.Backend{{Name: backend, Replicas: []meshspec.Replica{{Address: addr}}, Config: meshspec.BackendConfig{MaxConcurrentQueries: mcq}}},
			Endpoints: []meshspec.Endpoint{{Name: endpoint, Route: route, Traffic: map[string]float64{backend: weight},
				Shadows: map[string]float64{backend: shadow}}},
		}
		dp, err := ir.Lower(m, ir.Options{})
		if verr := m.Validate(); verr != nil {
			if err == nil {
				t.Fatalf("an invalid model was lowered: %v", verr)
			}
			return
		}
		if err != nil {
			t.Fatalf("a valid model's IR was refused: %v", err)
		}
		res, err := Translate(dp, goldenNode, nil)
		if err != nil {
			t.Fatalf("a valid model did not translate: %v", err)
		}
		checkEnvoyValid(t, res)
	})
}
