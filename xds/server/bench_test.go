package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"testing"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/translate"
)

// BenchmarkPublish measures a full publish for one node: translation, content
// hashes, endpoint diffing, the consistency check and setting the snapshot.
// Each iteration alternates between two models that differ in every
// endpoint's replicas, so every assignment is really updated.
func BenchmarkPublish(b *testing.B) {
	for _, endpoints := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("endpoints=%d", endpoints), func(b *testing.B) {
			s := oneNodeServer(b, false)
			publishEach(b, s, [2]*meshspec.Model{modelgen.Model(endpoints, 3, 10), modelgen.Model(endpoints, 3, 11)})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(endpoints), "ns/endpoint")
		})
	}
}

// BenchmarkPublishNodes measures a full publish of a 1,000-endpoint model
// (3,000 backends, 30,000 replicas) for several nodes, in plaintext and
// with mesh mTLS, where each node also gets its inbound listener and
// clusters for the backends it runs (each backend runs on up to three
// nodes), and the assignments list nodes.
func BenchmarkPublishNodes(b *testing.B) {
	for _, mtls := range []bool{false, true} {
		for _, nodes := range []int{1, 10, 30} {
			b.Run(fmt.Sprintf("mtls=%v/nodes=%d", mtls, nodes), func(b *testing.B) {
				s := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if mtls {
					if err := s.RequireMTLS(&translate.MTLS{IdentityPrefix: "spiffe://td.consul/ns/default/dc/dc1/svc/"}); err != nil {
						b.Fatal(err)
					}
				}
				for i := range nodes {
					n := wire.ProxyNode{ID: fmt.Sprintf("n%d", i), PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001}
					if mtls {
						n.InboundAddress, n.InboundPort = fmt.Sprintf("10.255.0.%d", i+1), 21000
					}
					s.nodes[n.ID] = &nodeState{node: n, acked: map[string]string{}}
				}
				models := [2]*meshspec.Model{modelgen.Model(1000, 3, 10), modelgen.Model(1000, 3, 11)}
				if mtls {
					for _, m := range models {
						onNodes(m, nodes)
					}
				}
				publishEach(b, s, models)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(nodes)/1e6, "ms/node")
			})
		}
	}
}

// onNodes places each backend's replicas on up to three of nodes
// n0..n<nodes-1> (backend i on nodes i, i+1, i+2), as agents with mesh mTLS
// register them.
func onNodes(m *meshspec.Model, nodes int) {
	for i := range m.Backends {
		for j := range m.Backends[i].Replicas {
			n := (i + j%3) % nodes
			r := &m.Backends[i].Replicas[j]
			r.Node, r.Inbound = fmt.Sprintf("n%d", n), fmt.Sprintf("10.255.0.%d:21000", n+1)
		}
	}
}

// publishEach publishes the two models in turn, one per iteration, so
// every assignment really changes each time.
func publishEach(b *testing.B, s *Server, models [2]*meshspec.Model) {
	ctx := context.Background()
	irs := [2]*ir.DataPlane{lowered(b, models[0]), lowered(b, models[1])}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.dataPlane = irs[i%2]
		s.generation++
		s.publish(ctx)
		i++
	}
}

// BenchmarkPublishOneChange measures what one `traffic set` costs in a
// large mesh: the model was published once, then each iteration changes
// one endpoint's weights and publishes, for one node; with translation's
// cache on (the default) and off, side by side.
func BenchmarkPublishOneChange(b *testing.B) {
	for _, endpoints := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("endpoints=%d", endpoints), func(b *testing.B) {
			b.Run("cache=on", func(b *testing.B) { publishOneChange(b, endpoints, false) })
			b.Run("cache=off", func(b *testing.B) { publishOneChange(b, endpoints, true) })
		})
	}
}

func publishOneChange(b *testing.B, endpoints int, cacheOff bool) {
	s := oneNodeServer(b, cacheOff)
	m := modelgen.Model(endpoints, 3, 10)
	dp := lowered(b, m)
	dp.Seq = 1
	s.dataPlane, s.generation = dp, 1
	s.publish(context.Background())
	e := dp.Endpoints[0]
	backends := slices.Sorted(maps.Keys(e.Traffic))
	var weights [2]map[string]float64
	for i := range weights {
		weights[i] = map[string]float64{backends[0]: 0.5 + 0.1*float64(i), backends[1]: 0.5 - 0.1*float64(i)}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		next := *dp
		next.Endpoints = append([]ir.Endpoint(nil), dp.Endpoints...)
		next.Endpoints[0].Traffic = weights[i%2]
		carry(&next, s.dataPlane, nil, []string{e.Name})
		s.dataPlane = &next
		s.generation++
		s.publish(context.Background())
		i++
	}
}

// BenchmarkPublishOneHealthChange measures what one replica's health
// change costs in a 1,000-endpoint mesh with mTLS and 30 nodes: its
// backend's assignments change, and the own resources of the nodes that
// run it are looked at again; with translation's cache on (the default)
// and off, side by side.
func BenchmarkPublishOneHealthChange(b *testing.B) {
	b.Run("cache=on", func(b *testing.B) { publishOneHealthChange(b, false) })
	b.Run("cache=off", func(b *testing.B) { publishOneHealthChange(b, true) })
}

func publishOneHealthChange(b *testing.B, cacheOff bool) {
	s := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CacheOff: cacheOff})
	if err := s.RequireMTLS(&translate.MTLS{IdentityPrefix: "spiffe://td.consul/ns/default/dc/dc1/svc/"}); err != nil {
		b.Fatal(err)
	}
	for i := range 30 {
		n := wire.ProxyNode{ID: fmt.Sprintf("n%d", i), PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001,
			InboundAddress: fmt.Sprintf("10.255.0.%d", i+1), InboundPort: 21000}
		s.nodes[n.ID] = &nodeState{node: n, acked: map[string]string{}}
	}
	m := modelgen.Model(1000, 3, 10)
	onNodes(m, 30)
	dp := lowered(b, m)
	dp.Seq = 1
	s.dataPlane, s.generation = dp, 1
	s.publish(context.Background())
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		next := *dp
		next.Backends = append([]ir.Backend(nil), dp.Backends...)
		replicas := append([]ir.Replica(nil), next.Backends[0].Replicas...)
		replicas[0].Health = [2]ir.Health{ir.Unhealthy, ir.Healthy}[i%2]
		next.Backends[0].Replicas = replicas
		carry(&next, s.dataPlane, []string{next.Backends[0].Name}, nil)
		s.dataPlane = &next
		s.generation++
		s.publish(context.Background())
		i++
	}
}

// carry numbers next after prev and names the backends and endpoints it
// changed, as the controller's publisher does.
func carry(next, prev *ir.DataPlane, backends, endpoints []string) {
	next.Seq = prev.Seq + 1
	next.Changes = &ir.Delta{Since: prev.Seq}
	next.Changes.AddBackends(backends...)
	next.Changes.AddEndpoints(endpoints...)
}

// oneNodeServer is a server with one plaintext node connected, its cache
// off if cacheOff.
func oneNodeServer(b *testing.B, cacheOff bool) *Server {
	s := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CacheOff: cacheOff})
	node, err := wire.ProxyNodeFromEnvoy(servemeshNode(b, "bench"))
	if err != nil {
		b.Fatal(err)
	}
	s.nodes[node.ID] = &nodeState{node: node, acked: map[string]string{}}
	return s
}
