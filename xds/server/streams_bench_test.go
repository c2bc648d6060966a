package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/meshspec"
)

// BenchmarkChangeToDeltaNodes measures one `traffic set` in a
// 1,000-endpoint mesh (plaintext, over loopback gRPC) from SetModel until
// every delta xDS stream has the new routes: publishing, go-control-plane's
// answers to each stream, and their sending. The streams subscribe as
// Envoy does and ACK each answer: 100 and 1,000 nodes with a public
// listener, and 1,000 mesh-only nodes (no public routes).
func BenchmarkChangeToDeltaNodes(b *testing.B) {
	b.Run("100 nodes", func(b *testing.B) { benchChangeToDeltaNodes(b, 1000, 100, true) })
	b.Run("1000 nodes", func(b *testing.B) { benchChangeToDeltaNodes(b, 1000, 1000, true) })
	b.Run("1000 mesh-only nodes", func(b *testing.B) { benchChangeToDeltaNodes(b, 1000, 1000, false) })
}

func benchChangeToDeltaNodes(b *testing.B, endpoints, nodes int, public bool) {
	s := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HoldOff: time.Millisecond, MaxHoldOff: 5 * time.Millisecond})
	g := grpc.NewServer()
	s.Register(g)
	var lc net.ListenConfig
	lis, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Run(ctx) }()
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	m := modelgen.Model(endpoints, 3, 3)
	if err := s.SetDataPlane(lowered(b, m)); err != nil {
		b.Fatal(err)
	}
	var assignments []string
	for _, be := range m.Backends {
		assignments = append(assignments, be.Name)
	}
	streams := make([]*benchDeltaNode, nodes)
	for i := range streams {
		streams[i] = dialBenchDelta(ctx, b, lis.Addr().String(), fmt.Sprintf("bench-%04d", i), assignments, public)
	}
	for _, st := range streams {
		st.waitRoutes(b, "")
	}
	e := m.Endpoints[0]
	backends := meshspec.SortedKeys(e.Traffic)
	var sent int64
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		had := make([]string, len(streams))
		for j, st := range streams {
			had[j] = st.version()
		}
		before := receivedBytes(streams)
		next := meshspec.Clone(m)
		w := 0.25 + 0.5*float64(i%2)
		next.Endpoints[0].Traffic = map[string]float64{backends[0]: w, backends[1]: 1 - w}
		if err := s.SetDataPlane(lowered(b, next)); err != nil {
			b.Fatal(err)
		}
		for j, st := range streams {
			st.waitRoutes(b, had[j])
		}
		sent += receivedBytes(streams) - before
	}
	b.ReportMetric(float64(sent)/float64(b.N)/float64(nodes)/1024, "KiB/node")
}

// benchDeltaNode is a delta xDS stream that subscribes as a node's Envoy
// does, ACKs every answer and keeps the last routes version.
type benchDeltaNode struct {
	bytes   atomic.Int64
	mu      sync.Mutex
	routes  string
	changed chan struct{}
}

func dialBenchDelta(ctx context.Context, b *testing.B, addr, id string, assignments []string, public bool) *benchDeltaNode {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		b.Fatal(err)
	}
	subs := map[string][]string{resource.EndpointType: assignments}
	types := []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.ScopedRouteType}
	node := meshOnlyNode(b, id)
	if public { // its public routes come with its scopes, as the mesh ones do
		node = servemeshNode(b, id)
	}
	for i, typ := range types {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: typ, ResourceNamesSubscribe: subs[typ]}
		if i == 0 {
			req.Node = node
		}
		if err := stream.Send(req); err != nil {
			b.Fatal(err)
		}
	}
	n := &benchDeltaNode{changed: make(chan struct{}, 1)}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			n.bytes.Add(int64(proto.Size(resp)))
			if stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}) != nil {
				return
			}
			switch resp.GetTypeUrl() {
			case resource.RouteType:
				n.mu.Lock()
				n.routes = resp.GetSystemVersionInfo()
				n.mu.Unlock()
				select {
				case n.changed <- struct{}{}:
				default:
				}
			case resource.ScopedRouteType:
				var names []string
				for _, r := range resp.GetResources() {
					var sc route.ScopedRouteConfiguration
					if r.GetResource().UnmarshalTo(&sc) == nil {
						names = append(names, sc.GetRouteConfigurationName())
					}
				}
				if len(names) > 0 && stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResourceNamesSubscribe: names}) != nil {
					return
				}
			}
		}
	}()
	return n
}

func receivedBytes(streams []*benchDeltaNode) int64 {
	var n int64
	for _, st := range streams {
		n += st.bytes.Load()
	}
	return n
}

func (n *benchDeltaNode) version() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.routes
}

func (n *benchDeltaNode) waitRoutes(b *testing.B, not string) {
	deadline := time.After(2 * time.Minute)
	for {
		if v := n.version(); v != "" && v != not {
			return
		}
		select {
		case <-n.changed:
		case <-deadline:
			b.Fatal("a stream got no new routes within 2 minutes")
		}
	}
}
