package demoreplica

import (
	"context"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// ServeGRPC serves, on l until ctx ends, the standard gRPC health service as
// the demo's gRPC workload: Check is a unary call, Watch a server-streaming
// one, and every answer carries the backend and replica in its header
// metadata (BackendHeader, ReplicaHeader, lower-cased).
func ServeGRPC(ctx context.Context, l net.Listener, backend, name string) error {
	tag := metadata.Pairs(BackendHeader, backend, ReplicaHeader, name)
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			_ = grpc.SetHeader(ctx, tag)
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			_ = ss.SetHeader(tag)
			return h(srv, ss)
		}))
	healthpb.RegisterHealthServer(srv, health.NewServer()) // SERVING
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	return srv.Serve(l)
}
