package agent

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestGRPCHealth: a gRPC replica passes only when its health service says
// SERVING; one that says NOT_SERVING, or a server that does not speak gRPC,
// fails.
func TestGRPCHealth(t *testing.T) {
	serve := func(status healthpb.HealthCheckResponse_ServingStatus) string {
		l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		h := health.NewServer()
		h.SetServingStatus("", status)
		healthpb.RegisterHealthServer(srv, h)
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(srv.Stop)
		return l.Addr().String()
	}
	if err := grpcHealthy(context.Background(), serve(healthpb.HealthCheckResponse_SERVING)); err != nil {
		t.Fatalf("a SERVING replica: %v", err)
	}
	if err := grpcHealthy(context.Background(), serve(healthpb.HealthCheckResponse_NOT_SERVING)); err == nil || !strings.Contains(err.Error(), "NOT_SERVING") {
		t.Fatalf("a NOT_SERVING replica: %v, want it failing", err)
	}
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer plain.Close()
	if err := grpcHealthy(context.Background(), strings.TrimPrefix(plain.URL, "http://")); err == nil {
		t.Fatal("an HTTP/1.1 server passed a gRPC health check")
	}
}
