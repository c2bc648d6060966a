package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/translate"
)

func testModel(replicaAddr string) *meshspec.Model {
	return &meshspec.Model{
		Backends: []meshspec.Backend{
			{Name: "v1", Replicas: []meshspec.Replica{{Address: replicaAddr}}},
			{Name: "v2", Replicas: []meshspec.Replica{{Address: "127.0.0.1:9002"}}},
		},
		Endpoints: []meshspec.Endpoint{{Name: "api", Route: "/api", Traffic: map[string]float64{"v1": 0.5, "v2": 0.5}}},
	}
}

// startServer runs a Server on a loopback gRPC listener and returns a client
// connection to it.
func startServer(t *testing.T) (*Server, *grpc.ClientConn, *prometheus.Registry) {
	t.Helper()
	return startServerHolding(t, time.Millisecond, 5*time.Millisecond)
}

// startServerHolding is startServer with the publisher's hold-offs given.
func startServerHolding(t *testing.T, holdOff, maxHoldOff time.Duration) (*Server, *grpc.ClientConn, *prometheus.Registry) {
	t.Helper()
	return startServerWith(t, Options{HoldOff: holdOff, MaxHoldOff: maxHoldOff})
}

// startServerWith is startServer with o (its logger and registry are the
// test's).
func startServerWith(t *testing.T, o Options) (*Server, *grpc.ClientConn, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o.Logger, o.Registerer = slog.New(slog.NewTextHandler(testWriter(t), &slog.HandlerOptions{Level: slog.LevelDebug})), reg
	s := New(o)
	g := grpc.NewServer()
	s.Register(g)
	var lc net.ListenConfig
	lis, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	published := make(chan struct{})
	go func() { defer close(published); _ = s.Run(ctx) }()
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
		cancel()
		// The publisher logs through t (verbose runs, go test -json):
		// it must end before the test does, or a publish in flight logs
		// after it and panics (make flake).
		<-published
	})
	return s, conn, reg
}

func servemeshNode(t testing.TB, id string) *core.Node {
	t.Helper()
	md, err := wire.ProxyNode{ID: id, PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001}.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return &core.Node{Id: id, Metadata: md}
}

// meshOnlyNode is a node without a public listener (`--public none`).
func meshOnlyNode(t testing.TB, id string) *core.Node {
	t.Helper()
	md, err := wire.ProxyNode{ID: id, MeshAddress: "127.0.0.1", MeshPort: 15001}.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return &core.Node{Id: id, Metadata: md}
}

// sotwStream is a state-of-the-world ADS client whose responses arrive on a channel.
type sotwStream struct {
	t      *testing.T
	stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	recv   chan *discovery.DiscoveryResponse
	err    chan error
}

func openSotW(t *testing.T, conn *grpc.ClientConn) *sotwStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := &sotwStream{t: t, stream: stream, recv: make(chan *discovery.DiscoveryResponse, 16), err: make(chan error, 1)}
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				s.err <- err
				return
			}
			s.recv <- r
		}
	}()
	return s
}

func (s *sotwStream) send(req *discovery.DiscoveryRequest) {
	s.t.Helper()
	if err := s.stream.Send(req); err != nil {
		s.t.Fatal(err)
	}
}

func (s *sotwStream) expect(typeURL string) *discovery.DiscoveryResponse {
	s.t.Helper()
	select {
	case r := <-s.recv:
		if r.GetTypeUrl() != typeURL {
			s.t.Fatalf("got a %s response, want %s", r.GetTypeUrl(), typeURL)
		}
		return r
	case err := <-s.err:
		s.t.Fatalf("stream ended while waiting for %s: %v", typeURL, err)
	case <-time.After(5 * time.Second):
		s.t.Fatalf("no %s response within 5s", typeURL)
	}
	return nil
}

func (s *sotwStream) expectNothing(within time.Duration) {
	s.t.Helper()
	select {
	case r := <-s.recv:
		s.t.Fatalf("unexpected %s response version %s", r.GetTypeUrl(), r.GetVersionInfo())
	case <-time.After(within):
	}
}

// ack acknowledges a response. Like Envoy, it restates the subscription: in
// state-of-the-world xDS every request carries the full list of names.
func ack(r *discovery.DiscoveryResponse, names ...string) *discovery.DiscoveryRequest {
	return &discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce(), ResourceNames: names}
}

func clusterNames(t *testing.T, r *discovery.DiscoveryResponse) []string {
	t.Helper()
	var names []string
	for _, a := range r.GetResources() {
		var c cluster.Cluster
		if err := a.UnmarshalTo(&c); err != nil {
			t.Fatal(err)
		}
		names = append(names, c.GetName())
	}
	sort.Strings(names) // the snapshot cache sends resources in map order
	return names
}

func TestServesClustersListenersAndEndpoints(t *testing.T) {
	s, conn, reg := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	st := openSotW(t, conn)
	st.send(&discovery.DiscoveryRequest{Node: servemeshNode(t, "n1"), TypeUrl: resource.ClusterType})
	cds := st.expect(resource.ClusterType)
	if got := strings.Join(clusterNames(t, cds), ","); got != "_servemesh_genai,_servemesh_rate_limit,v1,v2" {
		t.Fatalf("clusters %q, want the node's access log and rate limit services' and v1,v2", got)
	}
	st.send(ack(cds))
	st.send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"v1", "v2"}})
	eds := st.expect(resource.EndpointType)
	if len(eds.GetResources()) != 2 {
		t.Fatalf("got %d endpoint assignments, want 2", len(eds.GetResources()))
	}
	st.send(ack(eds, "v1", "v2"))
	st.send(&discovery.DiscoveryRequest{TypeUrl: resource.ListenerType})
	lds := st.expect(resource.ListenerType)
	if len(lds.GetResources()) != 2 {
		t.Fatalf("got %d listeners, want 2", len(lds.GetResources()))
	}
	st.send(ack(lds))
	st.send(&discovery.DiscoveryRequest{TypeUrl: resource.ScopedRouteType})
	srds := st.expect(resource.ScopedRouteType)
	if len(srds.GetResources()) != 2 {
		t.Fatalf("got %d scoped routes, want 2 (endpoint api's, on the mesh and public listeners)", len(srds.GetResources()))
	}
	st.send(ack(srds))
	routes := []string{wire.MeshRouteName("api"), wire.PublicRouteName("api")}
	st.send(&discovery.DiscoveryRequest{TypeUrl: resource.RouteType, ResourceNames: routes})
	st.send(ack(st.expect(resource.RouteType), routes...))

	// A replica moving changes only endpoints: clusters are not re-sent.
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9101"))); err != nil {
		t.Fatal(err)
	}
	eds2 := st.expect(resource.EndpointType)
	if eds2.GetVersionInfo() == eds.GetVersionInfo() {
		t.Fatal("endpoint version did not change")
	}
	st.send(ack(eds2, "v1", "v2"))
	st.expectNothing(200 * time.Millisecond)

	testutil.WaitFor(t, 5*time.Second, "the condition", func() bool { return len(s.Status()) == 1 && s.Status()[0].InSync })
	if n := histogramCount(t, reg, "servemesh_xds_convergence_seconds"); n < 1 {
		t.Fatalf("servemesh_xds_convergence_seconds has %d observations, want at least 1", n)
	}
	if got := s.Status()[0]; !got.Connected || got.Generation != 2 {
		t.Fatalf("status %+v, want connected at generation 2", got)
	}
}

func TestInvalidDataPlaneIsRefusedAndLastGoodKept(t *testing.T) {
	s, conn, reg := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	bad := lowered(t, testModel("127.0.0.1:9001"))
	bad.Backends[0].Replicas[0].Address = "not an address" // only ir.Lower makes IRs; this one did not
	err := s.SetDataPlane(bad)
	if err == nil || !strings.Contains(err.Error(), `backend "v1": replica not an address: address: want IP:port`) {
		t.Fatalf("got %v, want the IR's refusal of the address", err)
	}
	if s.Generation() != 1 {
		t.Fatalf("generation %d after a refused model, want 1", s.Generation())
	}
	if got := promtest.ToFloat64(mustCounter(t, reg, "servemesh_xds_rejected_models_total")); got != 1 {
		t.Fatalf("rejected models counter %v, want 1", got)
	}
	st := openSotW(t, conn)
	st.send(&discovery.DiscoveryRequest{Node: servemeshNode(t, "n1"), TypeUrl: resource.ClusterType})
	if got := strings.Join(clusterNames(t, st.expect(resource.ClusterType)), ","); got != "_servemesh_genai,_servemesh_rate_limit,v1,v2" {
		t.Fatalf("clusters %q, want the last good v1,v2 (and the access log and rate limit services')", got)
	}
}

func TestNACKIsCountedAndNotResent(t *testing.T) {
	s, conn, reg := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	st := openSotW(t, conn)
	st.send(&discovery.DiscoveryRequest{Node: servemeshNode(t, "n1"), TypeUrl: resource.ClusterType})
	first := st.expect(resource.ClusterType)
	st.send(ack(first))

	// A new model; the node rejects it, repeating the version it accepted.
	m := testModel("127.0.0.1:9001")
	m.Backends[1].Config.MaxConcurrentQueries = 7
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	second := st.expect(resource.ClusterType)
	st.send(&discovery.DiscoveryRequest{
		TypeUrl: resource.ClusterType, VersionInfo: first.GetVersionInfo(), ResponseNonce: second.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "simulated rejection"},
	})
	st.expectNothing(500 * time.Millisecond)
	if got := promtest.ToFloat64(mustCounterVec(t, reg, "servemesh_xds_nacks_total", "clusters")); got != 1 {
		t.Fatalf("NACK counter %v, want 1", got)
	}
	testutil.WaitFor(t, 5*time.Second, "the condition", func() bool { return s.Status()[0].NACKs == 1 })
	if got := s.Status()[0]; got.InSync || !strings.Contains(got.LastNACK, "simulated rejection") {
		t.Fatalf("status %+v, want out of sync with the NACK's message", got)
	}

	// The next real change is sent.
	m2 := testModel("127.0.0.1:9001")
	m2.Backends[1].Config.MaxConcurrentQueries = 8
	if err := s.SetDataPlane(lowered(t, m2)); err != nil {
		t.Fatal(err)
	}
	third := st.expect(resource.ClusterType)
	if third.GetVersionInfo() == second.GetVersionInfo() {
		t.Fatal("the next change carried the rejected version")
	}
}

func TestGoneNodesAreForgotten(t *testing.T) {
	s, conn, _ := startServer(t)
	s.mu.Lock()
	s.forgetAfter = 50 * time.Millisecond
	s.mu.Unlock()
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: servemeshNode(t, "short-lived"), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	testutil.WaitFor(t, 5*time.Second, "the condition", func() bool { st := s.Status(); return len(st) == 1 && !st[0].Connected })
	time.Sleep(100 * time.Millisecond)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9002"))); err != nil { // a publish prunes
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the condition", func() bool { return len(s.Status()) == 0 })
	if _, err := s.snapshots[resource.ListenerType].GetSnapshot("short-lived"); err == nil {
		t.Fatal("the gone node's snapshot was kept")
	}
}

// TestGoneNodesAreBounded: node ids that connected once (3,000 of them
// used to be kept for 10 minutes, 130 MB) are kept at most MaxGoneNodes at a
// time, the longest gone forgotten first, with no publish needed.
func TestGoneNodesAreBounded(t *testing.T) {
	s, conn, _ := startServer(t)
	s.mu.Lock()
	s.maxGone = 3
	s.mu.Unlock()
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discovery.DiscoveryRequest{Node: servemeshNode(t, fmt.Sprintf("once-%d", i)), TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
		cancel()
		testutil.WaitFor(t, 5*time.Second, "the condition", func() bool {
			for _, n := range s.Status() {
				if n.Connected {
					return false
				}
			}
			return true
		})
	}
	testutil.WaitFor(t, 5*time.Second, "the condition", func() bool { return len(s.Status()) == 3 })
	for _, n := range s.Status() {
		if n.ID != "once-7" && n.ID != "once-8" && n.ID != "once-9" {
			t.Errorf("kept %s; want the three most recently gone", n.ID)
		}
	}
}

// TestMTLSServesOnlyMTLSNodes: in a mesh with mTLS, a node with an inbound
// listener gets clusters that call over TLS; a node
// without gets nothing, and its status says why.
func TestMTLSServesOnlyMTLSNodes(t *testing.T) {
	s, conn, _ := startServer(t)
	if err := s.RequireMTLS(&translate.MTLS{IdentityPrefix: "spiffe://td.consul/ns/default/dc/dc1/svc/"}); err != nil {
		t.Fatal(err)
	}
	if err := s.RequireMTLS(&translate.MTLS{IdentityPrefix: "not-spiffe"}); err == nil {
		t.Fatal("a bad identity prefix was accepted")
	}
	m := testModel("127.0.0.1:9001")
	for i := range m.Backends {
		for j := range m.Backends[i].Replicas {
			m.Backends[i].Replicas[j].Node, m.Backends[i].Replicas[j].Inbound = "n1", "10.0.0.1:21000"
		}
	}
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	md, err := wire.ProxyNode{ID: "n1", PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001,
		InboundAddress: "10.0.0.1", InboundPort: 21000}.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	st := openSotW(t, conn)
	st.send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "n1", Metadata: md}, TypeUrl: resource.ClusterType})
	cds := st.expect(resource.ClusterType)
	names := strings.Join(clusterNames(t, cds), ",")
	if names != "_inbound_v1,_inbound_v2,_servemesh_genai,_servemesh_rate_limit,servemesh_picker,v1,v2" {
		t.Fatalf("clusters %q, want the node's inbound clusters, its rate limit service's and picker's and v1,v2", names)
	}
	for _, r := range cds.GetResources() {
		var c cluster.Cluster
		if err := r.UnmarshalTo(&c); err != nil {
			t.Fatal(err)
		}
		local := strings.HasPrefix(c.GetName(), "_inbound_") || c.GetName() == wire.PickerCluster || c.GetName() == wire.RateLimitCluster || c.GetName() == wire.GenAICluster // on the node's own machine
		if tls := c.GetTransportSocket() != nil; tls != !local {
			t.Errorf("cluster %s: over TLS %v", c.GetName(), tls)
		}
	}
	// A node with no replica gets the shared clusters and its picker's
	// alone (other nodes' own assignments once made its snapshot
	// inconsistent and refused).
	md2, err := wire.ProxyNode{ID: "n2", PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001,
		InboundAddress: "10.0.0.2", InboundPort: 21000}.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	other := openSotW(t, conn)
	other.send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "n2", Metadata: md2}, TypeUrl: resource.ClusterType})
	if names := strings.Join(clusterNames(t, other.expect(resource.ClusterType)), ","); names != "_servemesh_genai,_servemesh_rate_limit,servemesh_picker,v1,v2" {
		t.Fatalf("node n2's clusters %q, want its rate limit service's and picker's and v1,v2", names)
	}
	plain := openSotW(t, conn)
	plain.send(&discovery.DiscoveryRequest{Node: servemeshNode(t, "plain"), TypeUrl: resource.ClusterType})
	plain.expectNothing(300 * time.Millisecond)
	testutil.WaitFor(t, 5*time.Second, "the condition", func() bool {
		for _, n := range s.Status() {
			if n.ID == "plain" {
				return strings.Contains(n.Refused, "announces no inbound listener") && !n.InSync
			}
		}
		return false
	})
}

func TestForeignNodeIsRefused(t *testing.T) {
	s, conn, _ := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	st := openSotW(t, conn)
	st.send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "stranger"}, TypeUrl: resource.ClusterType})
	select {
	case err := <-st.err:
		if !strings.Contains(err.Error(), "servemesh bootstrap") {
			t.Fatalf("stream closed with %v, want a pointer to `servemesh bootstrap`", err)
		}
	case r := <-st.recv:
		t.Fatalf("a node without servemesh metadata got %s", r.GetTypeUrl())
	case <-time.After(5 * time.Second):
		t.Fatal("stream from a foreign node stayed open")
	}
}

func TestDeltaStreamServesClusters(t *testing.T) {
	s, conn, _ := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DeltaDiscoveryRequest{Node: servemeshNode(t, "d1"), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range resp.GetResources() {
		names = append(names, r.GetName())
	}
	slices.Sort(names)
	if strings.Join(names, ",") != "_servemesh_genai,_servemesh_rate_limit,v1,v2" {
		t.Fatalf("delta clusters %v, want v1 and v2 (and the access log and rate limit services')", names)
	}
	if err := stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"v1"}}); err != nil {
		t.Fatal(err)
	}
	resp, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResources()) != 1 || resp.GetResources()[0].GetName() != "v1" {
		t.Fatalf("delta endpoints %v, want only v1", resp.GetResources())
	}
}

func mustCounter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return gathered(t, reg, name, "")
}

func mustCounterVec(t *testing.T, reg *prometheus.Registry, name, typ string) prometheus.Collector {
	t.Helper()
	return gathered(t, reg, name, typ)
}

// gathered wraps one gathered sample as a constant collector for testutil.
func gathered(t *testing.T, reg *prometheus.Registry, name, typ string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if typ == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == typ) {
				return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sample", Help: "sample"}, func() float64 { return m.GetCounter().GetValue() })
			}
		}
	}
	t.Fatalf("metric %s{%s} not found", name, typ)
	return nil
}

func testWriter(t *testing.T) io.Writer {
	if testing.Verbose() {
		return tWriter{t}
	}
	return io.Discard
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// TestDeltaSendsOnlyWhatChanged: over delta xDS, a traffic change to one
// endpoint of two sends that endpoint's mesh routes and the public table,
// and nothing else: not its scope (unchanged), not the other endpoint's
// routes, no cluster; the node then counts as in sync. So with
// translation's cache off too (Options.CacheOff): what changed is then
// found by comparing versions.
func TestDeltaSendsOnlyWhatChanged(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("cache-off=%v", off), func(t *testing.T) { deltaSendsOnlyWhatChanged(t, off) })
	}
}

func deltaSendsOnlyWhatChanged(t *testing.T, cacheOff bool) {
	s, conn, _ := startServerWith(t, Options{HoldOff: time.Millisecond, MaxHoldOff: 5 * time.Millisecond, CacheOff: cacheOff})
	m := testModel("127.0.0.1:9001")
	m.Endpoints = append(m.Endpoints, meshspec.Endpoint{Name: "other", Traffic: map[string]float64{"v2": 1}})
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	routes := []string{wire.MeshRouteName("api"), wire.MeshRouteName("other"), wire.PublicRouteName("api")}
	c, _ := openDelta(t, conn, servemeshNode(t, "d1"), subscription{resource.ClusterType, nil}, subscription{resource.EndpointType, []string{"v1", "v2"}},
		subscription{resource.ListenerType, nil}, subscription{resource.ScopedRouteType, nil}, subscription{resource.RouteType, routes})
	testutil.WaitFor(t, 5*time.Second, "the node in sync", func() bool { return len(s.Status()) == 1 && s.Status()[0].InSync })

	m = meshspec.Clone(m)
	m.Endpoints[0].Traffic = map[string]float64{"v1": 0.9, "v2": 0.1}
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	// One answer: api's mesh routes and its public ones; its scopes are
	// the same, and no other type is compared or sent.
	got := c.recv(1)
	if !slices.Equal(got[resource.RouteType], []string{wire.MeshRouteName("api"), wire.PublicRouteName("api")}) || len(got) != 1 {
		t.Errorf("a traffic change sent %v; want api's mesh and public routes alone", got)
	}
	testutil.WaitFor(t, 5*time.Second, "the node in sync after the change", func() bool { return s.Status()[0].InSync })
	// The next answer is the next change's (nothing else was queued):
	// other is headless, so its mesh routes alone.
	m = meshspec.Clone(m)
	m.Endpoints[1].Traffic = map[string]float64{"v1": 1}
	if err := s.SetDataPlane(lowered(t, m)); err != nil {
		t.Fatal(err)
	}
	if got := c.recv(1); !slices.Equal(got[resource.RouteType], []string{wire.MeshRouteName("other")}) || len(got) != 1 {
		t.Errorf("a headless endpoint's traffic change sent %v; want its mesh routes alone", got)
	}
	testutil.WaitFor(t, 5*time.Second, "the node in sync after the second change", func() bool { return s.Status()[0].InSync })
}

// TestSotWAndDeltaStreamsAreKeptApart: go-control-plane numbers
// state-of-the-world and delta streams each from 1, so a node over each
// had the same stream id, and one's ACKs went to the other's record: with
// simulated state-of-the-world nodes beside delta Envoys, the Envoys held
// the current config but were reported out of sync for good.
func TestSotWAndDeltaStreamsAreKeptApart(t *testing.T) {
	s, conn, _ := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	st := openSotW(t, conn)
	st.send(&discovery.DiscoveryRequest{Node: servemeshNode(t, "sotw-node"), TypeUrl: resource.ClusterType})
	st.send(ack(st.expect(resource.ClusterType)))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	delta, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := delta.Send(&discovery.DeltaDiscoveryRequest{Node: servemeshNode(t, "delta-node"), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := delta.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := delta.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: resp.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "both nodes to have ACKed their clusters", func() bool {
		acked := 0
		for _, n := range s.Status() {
			if n.Acked["clusters"] != "" && n.Acked["clusters"] == n.Expected["clusters"] {
				acked++
			}
		}
		return acked == 2
	})
}

// lowered is the IR of view m, as the controller's publisher makes it; in
// an mTLS mesh if the view's replicas have inbound listeners.
func lowered(tb testing.TB, m *meshspec.Model) *ir.DataPlane {
	tb.Helper()
	dp, err := ir.Lower(m, nil, ir.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	return dp
}

// With mTLS, nodes whose own clusters are the same (those that run no
// replica: their agent's services' alone) share one kind of clusters,
// and so its version map: a thousand such nodes held a thousand copies
// of the mesh's clusters. A node that runs replicas has its own.
func TestNodesWithTheSameClustersShareThem(t *testing.T) {
	s := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := s.RequireMTLS(&translate.MTLS{IdentityPrefix: "spiffe://td.consul/ns/default/dc/dc1/svc/"}); err != nil {
		t.Fatal(err)
	}
	m := testModel("127.0.0.1:9001")
	for i := range m.Backends {
		for j := range m.Backends[i].Replicas {
			m.Backends[i].Replicas[j].Node, m.Backends[i].Replicas[j].Inbound = "n0", "10.0.0.1:21000"
		}
	}
	for i := range 3 {
		n := wire.ProxyNode{ID: fmt.Sprintf("n%d", i), PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001,
			InboundAddress: fmt.Sprintf("10.0.0.%d", i+1), InboundPort: 21000}
		s.nodes[n.ID] = &nodeState{node: n, acked: map[string]string{}}
	}
	s.dataPlane = lowered(t, m)
	s.generation++
	s.publish(context.Background())
	clusters := func(node string) *kind { return s.nodes[node].set[resource.ClusterType] }
	if clusters("n1") == nil || clusters("n1") != clusters("n2") {
		t.Fatal("n1 and n2, which run no replica, have clusters of their own")
	}
	if clusters("n0") == clusters("n1") || clusters("n0").twin(wire.InboundClusterName("v1")) == nil {
		t.Fatal("n0, which runs the replicas, does not have its own clusters")
	}
}

// TestNodesPreparedTogetherGetWhatEachGetsAlone: a publish prepares its
// nodes' kinds on every core (prepare); each node's listeners and
// clusters are what its own resources and the shared clusters make,
// merged here without the publish's caches, and nodes that run no
// replica still share their clusters.
func TestNodesPreparedTogetherGetWhatEachGetsAlone(t *testing.T) {
	s := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := s.RequireMTLS(&translate.MTLS{IdentityPrefix: "spiffe://td.consul/ns/default/dc/dc1/svc/"}); err != nil {
		t.Fatal(err)
	}
	const nodes = 8 // the last two run no replica (onNodes places them on the others)
	var all []wire.ProxyNode
	for i := range nodes {
		n := wire.ProxyNode{ID: fmt.Sprintf("n%d", i), PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001,
			InboundAddress: fmt.Sprintf("10.255.0.%d", i+1), InboundPort: 21000}
		s.nodes[n.ID] = &nodeState{node: n, acked: map[string]string{}}
		all = append(all, n)
	}
	for _, seed := range []int{3, 4} { // a first publish, then one that changes every backend
		view := modelgen.Model(20, 2, seed)
		onNodes(view, nodes-2)
		s.dataPlane = lowered(t, view)
		s.generation++
		s.publish(context.Background())
		own, errs := s.built.builder.ForNodes(all) // what was built: nothing changed since
		for i, n := range all {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			// Made here without the publish's caches (mergedFor's).
			clusters := s.built.clusters
			if len(own[i].Clusters) > 0 {
				clusters = mergedClusters(s.built.clusters, own[i])
			}
			listeners := builtKind(own[i].ListenersVersion, own[i].Listeners, own[i].EncodedListeners)
			set := s.nodes[n.ID].set
			for typ, want := range map[string]*kind{resource.ListenerType: listeners, resource.ClusterType: clusters} {
				got := set[typ]
				if got == nil || got.version != want.version || !maps.Equal(got.allVersions(), want.allVersions()) {
					t.Fatalf("seed %d, %s's %s: prepared %v, alone %s", seed, n.ID, shortType(typ), got != nil, want.version)
				}
			}
		}
		if set := func(n string) *kind { return s.nodes[n].set[resource.ClusterType] }; set("n6") != set("n7") {
			t.Fatalf("seed %d: n6 and n7, which run no replica, have clusters of their own", seed)
		}
	}
}
