package translate

import (
	"slices"
	"testing"

	"github.com/servemesh/servemesh/meshspec"
)

// TestFilterTable: every row of the filter table is on a chain and says
// why it sits there; the router ends every chain; and each chain's filters
// come in the table's order (goldens pin their configuration).
func TestFilterTable(t *testing.T) {
	for _, f := range httpFilters {
		if len(f.on) == 0 || len(f.why) < 20 || f.build == nil {
			t.Errorf("filter %s: every row needs its chains, its reason and its builder", f.name)
		}
	}
	names := func(c chain, in filterInput) []string {
		t.Helper()
		built, err := filtersFor(c, in)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range built {
			out = append(out, f.GetName())
		}
		return out
	}
	aware := meshspec.Backend{Name: "llm", Config: meshspec.BackendConfig{LoadAware: &meshspec.LoadAware{}}}
	for _, c := range []struct {
		chain chain
		in    filterInput
		want  []string
	}{
		{outbound, filterInput{}, []string{"envoy.filters.http.grpc_stats", jsonToMetadataFilter, luaFilter, "envoy.filters.http.router"}},
		{inbound, filterInput{backend: meshspec.Backend{Name: "api"}}, []string{"servemesh.replica_report_scrub", "envoy.filters.http.router"}},
		{inbound, filterInput{backend: aware}, []string{"envoy.filters.http.ext_proc", "servemesh.replica_report_scrub", "envoy.filters.http.router"}},
	} {
		if got := names(c.chain, c.in); !slices.Equal(got, c.want) {
			t.Errorf("chain %d for %q: %v, want %v", c.chain, c.in.backend.Name, got, c.want)
		}
	}
}
