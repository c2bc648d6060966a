package meshspec

import (
	"fmt"
	"testing"
)

func TestSuggestNamesTheFix(t *testing.T) {
	many := make([]string, 12)
	for i := range many {
		many[i] = fmt.Sprintf("b%02d", i)
	}
	for _, c := range []struct {
		name  string
		known []string
		want  string
	}{
		{"model-v9", []string{"model-v2", "model-v1", "embedder"}, `did you mean "model-v1"? backends: embedder, model-v1, model-v2`},
		{"Model-V1", []string{"model-v1"}, `did you mean "model-v1"? backends: model-v1`},
		{"ghost", []string{"model-v1", "model-v2"}, `backends: model-v1, model-v2`},
		{"ghost", nil, `there are no backends yet`},
		{"zzz", many, `backends: b00, b01, b02, b03, b04, b05, b06, b07, b08, b09, ... (12 in all: servemesh backend list shows them)`},
	} {
		if got := Suggest("backend", c.name, c.known); got != c.want {
			t.Errorf("Suggest(%q, %v) = %q, want %q", c.name, c.known, got, c.want)
		}
	}
}
