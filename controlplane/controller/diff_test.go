package controller

import (
	"slices"
	"testing"

	"github.com/servemesh/servemesh/meshspec"
)

// TestFieldChanges: an update lists each field it changes, by its path in
// the config file, with its values before and after.
func TestFieldChanges(t *testing.T) {
	before := meshspec.Endpoint{Name: "model", Route: "/model", Traffic: map[string]float64{"model-v1": 0.7, "model-v2": 0.3}}
	after := meshspec.Endpoint{Name: "model", Route: "/model", Methods: []string{"POST"},
		Traffic: map[string]float64{"model-v1": 0.9, "model-v3": 0.1}, Shadows: map[string]float64{"model-v2": 0.2}}
	var got []string
	for _, f := range fieldChanges(before, after) {
		got = append(got, f.String())
	}
	want := []string{
		`methods: (none) -> ["POST"]`,
		`shadows.model-v2: (none) -> 0.2`,
		`traffic.model-v1: 0.7 -> 0.9`,
		`traffic.model-v2: 0.3 -> (none)`,
		`traffic.model-v3: (none) -> 0.1`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("field changes:\n got  %q\n want %q", got, want)
	}
	if len(fieldChanges(before, before)) != 0 {
		t.Fatal("an object compared with itself has changes")
	}
}
