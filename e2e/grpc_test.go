//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestGRPC runs gRPC through the default data path with a real grpc-go
// server and client, the replicas on two nodes: the agents probe the
// replicas with the gRPC health protocol; unary calls split by weight
// (chi-square) and are mirrored by proportion; server-streaming calls flow;
// calls cross the inbound hop over HTTP/2.
func TestGRPC(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "grpc")
	n1, ctx := mesh.n1, context.Background()
	for name, replicas := range map[string]int{"rank-v1": 2, "rank-v2": 1, "rank-shadow": 1} {
		mesh.createBackends(t, meshspec.Backend{Name: name, Protocol: meshspec.ProtocolGRPC, Config: meshspec.BackendConfig{NumReplicas: replicas, CPUs: 1},
			Process: demoProcess(name, true)})
	}
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "rank", Route: "/grpc.health.v1.Health", Methods: []string{"POST"},
		Traffic: map[string]float64{"rank-v1": 0.7, "rank-v2": 0.3}, Shadows: map[string]float64{"rank-shadow": 0.4}}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(n1.public, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	health := healthpb.NewHealthClient(conn)
	backend := strings.ToLower(demoreplica.BackendHeader)
	replica := strings.ToLower(demoreplica.ReplicaHeader)
	check := func() (string, string, error) {
		var md metadata.MD
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := health.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check: %s", resp.GetStatus())
		}
		return first(md.Get(backend)), first(md.Get(replica)), err
	}
	testutil.WaitFor(t, 30*time.Second, "every replica of the split to answer gRPC through n1 (their gRPC health passing)", func() bool {
		seen := map[string]bool{}
		for range 40 {
			if _, r, err := check(); err == nil {
				seen[r] = true
			}
		}
		return len(seen) == 3
	})

	t.Run("unary calls split by weight and are mirrored by proportion", func(t *testing.T) {
		mirrored := func() float64 { return envoyStat(t, n1.admin, "cluster.rank-shadow.upstream_rq_total") }
		before := mirrored()
		const n = 600
		counts, v1Replicas := map[string]int{}, map[string]bool{}
		for range n {
			b, r, err := check()
			if err != nil {
				t.Fatalf("Check through n1: %v", err)
			}
			counts[b]++
			if b == "rank-v1" {
				v1Replicas[r] = true
			}
		}
		checkShare(t, "calls to rank-v1 (weight 0.7)", counts["rank-v1"], n, 0.7)
		if counts["rank-v1"]+counts["rank-v2"] != n {
			t.Errorf("calls answered by %v; want only rank-v1 and rank-v2", counts)
		}
		if len(v1Replicas) != 2 {
			t.Errorf("rank-v1's calls reached %v; want both its replicas, the other node's over HTTP/2 through its inbound listener", v1Replicas)
		}
		testutil.WaitFor(t, 5*time.Second, "the mirrored calls to be counted", func() bool { return mirrored()-before >= 0.4*n-5*11.5 })
		checkShare(t, "calls mirrored to rank-shadow (proportion 0.4)", int(mirrored()-before), n, 0.4)
	})
	t.Run("failed calls count as the backend's errors, once each", func(t *testing.T) {
		// A call for a service the health server does not know fails with
		// NOT_FOUND in an HTTP 200: Envoy's upstream_rq_5xx misses it, its
		// grpc_stats filter counts it, and the agent reports both as errors.
		errs := func() float64 {
			return metricValue(t, n1.metr, "servemesh_backend_errors_total", "backend", "rank-v1") +
				metricValue(t, n1.metr, "servemesh_backend_errors_total", "backend", "rank-v2")
		}
		before := errs()
		const n = 50
		for range n {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := health.Check(cctx, &healthpb.HealthCheckRequest{Service: "no-such-service"})
			cancel()
			if status.Code(err) != codes.NotFound {
				t.Fatalf("Check of an unknown service: %v; want NotFound", err)
			}
		}
		testutil.WaitFor(t, 5*time.Second, "the failed calls to be counted", func() bool { return errs()-before >= n })
		if got := errs() - before; got != n {
			t.Fatalf("%v errors counted for %d failed calls", got, n)
		}
	})
	t.Run("server-streaming calls flow", func(t *testing.T) {
		for range 6 {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			stream, err := health.Watch(sctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				cancel()
				t.Fatalf("Watch: %v", err)
			}
			resp, err := stream.Recv()
			md, _ := stream.Header()
			cancel()
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING || first(md.Get(backend)) == "" {
				t.Fatalf("Watch's first message: %v, %v, from %v", resp, err, md)
			}
		}
	})
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}
