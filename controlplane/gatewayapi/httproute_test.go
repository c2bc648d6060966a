package gatewayapi

import (
	"flag"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestGoldenHTTPRoutes reads each HTTPRoute of testdata/in into an
// endpoint (out/<case>.endpoint.yaml), or, for the invalid-* cases, into
// the error naming every field servemesh refuses (out/<case>.error).
func TestGoldenHTTPRoutes(t *testing.T) {
	testutil.GoldenCases(t, "testdata/in", "testdata/out", *update, func(t *testing.T, input []byte) map[string][]byte {
		if !IsHTTPRoute(input) {
			t.Fatal("IsHTTPRoute says this is not an HTTPRoute")
		}
		e, err := Endpoint(input)
		if err != nil {
			return map[string][]byte{"error": []byte(err.Error() + "\n")}
		}
		out, err := yaml.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		return map[string][]byte{"endpoint.yaml": out}
	})
}

func TestIsHTTPRoute(t *testing.T) {
	for doc, want := range map[string]bool{
		"apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n":      true,
		"apiVersion: gateway.networking.k8s.io/v1beta1\nkind: HTTPRoute\n": true, // then refused by Endpoint, by version
		"apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n":        false,
		"backends: []\n": false,
	} {
		if got := IsHTTPRoute([]byte(doc)); got != want {
			t.Errorf("IsHTTPRoute(%q) = %t", doc, got)
		}
	}
	if _, err := Endpoint([]byte("apiVersion: gateway.networking.k8s.io/v1beta1\nkind: HTTPRoute\nmetadata: {name: a}\n")); err == nil {
		t.Error("a v1beta1 HTTPRoute was read")
	}
}
