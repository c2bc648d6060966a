package translate

import (
	"slices"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
)

// lower is the IR of case m in a plaintext mesh, as the controller's
// publisher (or servemesh serve) makes it: translation reads only the IR.
func lower(tb testing.TB, m *meshspec.Model) *ir.DataPlane { return lowerFor(tb, m, false) }

// lowerMTLS is the IR of case m in a mesh with mTLS.
func lowerMTLS(tb testing.TB, m *meshspec.Model) *ir.DataPlane { return lowerFor(tb, m, true) }

func lowerFor(tb testing.TB, m *meshspec.Model, mtls bool) *ir.DataPlane {
	tb.Helper()
	state, replicas := split(m)
	dp, err := ir.Lower(state, replicas, ir.Options{MTLS: mtls})
	if err != nil {
		tb.Fatalf("a translation case must be a mesh the IR serves: %v", err)
	}
	return dp
}

// split reads a translation case as what the controller's publisher has:
// the stored state, and each backend's replicas from the catalog. A case
// lists every backend's replicas in one file for brevity; those that name
// a node are the catalog's (servemesh runs them: users cannot set a
// replica's node), the others the state's own.
func split(m *meshspec.Model) (*meshspec.Model, map[string][]meshspec.Replica) {
	state := meshspec.Clone(m)
	replicas := map[string][]meshspec.Replica{}
	for i := range state.Backends {
		b := &state.Backends[i]
		if slices.ContainsFunc(b.Replicas, func(r meshspec.Replica) bool { return r.Node != "" }) {
			replicas[b.Name], b.Replicas = b.Replicas, nil
		}
	}
	return state, replicas
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
