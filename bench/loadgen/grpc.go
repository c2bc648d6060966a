package loadgen

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// GRPC calls the standard gRPC health service's Check at a target
// (host:port, cleartext HTTP/2) over one connection, as a gRPC client
// multiplexes its calls.
type GRPC struct {
	conn   *grpc.ClientConn
	health healthpb.HealthClient
}

// NewGRPC connects to target.
func NewGRPC(target string) (*GRPC, error) {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &GRPC{conn: conn, health: healthpb.NewHealthClient(conn)}, nil
}

// Check makes one call and wants SERVING.
func (g *GRPC) Check() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := g.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("status %s", resp.GetStatus())
	}
	return nil
}

// Close closes the connection.
func (g *GRPC) Close() error { return g.conn.Close() }
