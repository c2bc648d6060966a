package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/wire"
)

// BenchmarkPublish measures a full publish for one node: translation, content
// hashes, endpoint diffing, the consistency check and setting the snapshot.
// Each iteration alternates between two models that differ in every
// endpoint's replicas, so every assignment is really updated.
func BenchmarkPublish(b *testing.B) {
	for _, endpoints := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("endpoints=%d", endpoints), func(b *testing.B) {
			s := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			node, err := wire.ProxyNodeFromEnvoy(servemeshNode(b, "bench"))
			if err != nil {
				b.Fatal(err)
			}
			s.nodes[node.ID] = &nodeState{node: node, acked: map[string]string{}}
			models := [2]*model.Model{modelgen.Model(endpoints, 3, 10), modelgen.Model(endpoints, 3, 11)}
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.model = models[i%2]
				s.generation++
				s.publish(ctx)
				i++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(endpoints), "ns/endpoint")
		})
	}
}
