package translate

import (
	"fmt"
	"testing"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/ir"
)

// BenchmarkTranslate measures one node's full translation (lowering to the
// IR, with its validation, included) at 10, 1,000 and 10,000 endpoints of 3 backends with 10 replicas
// each. ns/op divided by endpoints should stay flat if it scales linearly.
func BenchmarkTranslate(b *testing.B) {
	for _, endpoints := range []int{10, 1000, 10000} {
		m := modelgen.Model(endpoints, 3, 10)
		b.Run(fmt.Sprintf("endpoints=%d", endpoints), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				dp, err := ir.Lower(m, nil, ir.Options{})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Translate(dp, goldenNode, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(endpoints), "ns/endpoint")
		})
	}
}

func TestGeneratedModelIsValid(t *testing.T) {
	m := modelgen.Model(5, 3, 10)
	if _, err := Translate(lower(t, m), goldenNode, nil); err != nil {
		t.Fatal(err)
	}
	if len(m.Backends) != 15 || len(m.Backends[0].Replicas) != 10 {
		t.Fatalf("generator made %d backends, %d replicas each", len(m.Backends), len(m.Backends[0].Replicas))
	}
}
