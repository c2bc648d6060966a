package rayserve

import (
	"flag"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestGoldenRayConfigs reads each Ray Serve config of testdata/in into a
// servemesh spec (out/<case>.spec.yaml) and its notes (out/<case>.notes),
// or, for the invalid-* cases, into the error naming the field
// (out/<case>.error). Every spec is valid.
func TestGoldenRayConfigs(t *testing.T) {
	testutil.GoldenCases(t, "testdata/in", "testdata/out", *update, func(t *testing.T, input []byte) map[string][]byte {
		if !IsConfig(input) {
			t.Fatal("IsConfig says this is not a Ray Serve config")
		}
		spec, notes, err := Convert(input, Options{Dir: "/srv/app", Paths: []string{"/opt/servemesh/src"}})
		if err != nil {
			return map[string][]byte{"error": []byte(err.Error() + "\n")}
		}
		out, err := meshspec.MarshalSpec(spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := meshspec.ParseSpec(out); err != nil {
			t.Fatalf("servemesh does not take the spec: %v", err)
		}
		return map[string][]byte{"spec.yaml": out, "notes": []byte(strings.Join(notes, "\n") + "\n")}
	})
}

func TestIsConfig(t *testing.T) {
	for doc, want := range map[string]bool{
		"applications: []\n":                true,
		"backends: []\nendpoints: []\n":     false,
		"applications: []\nbackends: []\n":  false,
		"apiVersion: v1\nkind: HTTPRoute\n": false,
		"not: [valid\n":                     false,
		`{"applications": [{"name": "a"}]}`: true,
	} {
		if got := IsConfig([]byte(doc)); got != want {
			t.Errorf("IsConfig(%q) = %t; want %t", doc, got, want)
		}
	}
}
