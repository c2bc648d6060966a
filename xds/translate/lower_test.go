package translate

import (
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
)

// lower is the IR of view m in a plaintext mesh, as the controller's
// publisher (or servemesh serve) makes it: translation reads only the IR.
func lower(tb testing.TB, m *meshspec.Model) *ir.DataPlane { return lowerFor(tb, m, false) }

// lowerMTLS is the IR of view m in a mesh with mTLS.
func lowerMTLS(tb testing.TB, m *meshspec.Model) *ir.DataPlane { return lowerFor(tb, m, true) }

func lowerFor(tb testing.TB, m *meshspec.Model, mtls bool) *ir.DataPlane {
	tb.Helper()
	dp, err := ir.Lower(m, ir.Options{MTLS: mtls})
	if err != nil {
		tb.Fatalf("a translation case must be a view the IR serves: %v", err)
	}
	return dp
}

// marshalIR is dp as YAML, the golden cases' ir.yaml.
func marshalIR(t *testing.T, dp *ir.DataPlane) []byte {
	t.Helper()
	out, err := yaml.Marshal(dp)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
