package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/wire"
)

// simNode is a simulated node: one ADS stream, over mTLS with the node's
// own Connect identity, that subscribes as a node's Envoy does (listeners
// and clusters, then the routes the listeners name and the assignments of
// every backend), ACKs every answer, and records when each route version
// arrives and how many bytes it was sent.
type simNode struct {
	id    string
	bytes atomic.Int64

	mu       sync.Mutex
	routes   string    // the last routes version it ACKed
	routesAt time.Time // when that version arrived
	changed  chan struct{}
}

// dialSim connects a simulated node to the controller at xds, as node id
// with the identity in bundle, and subscribes; assignments are the EDS
// names it asks for (every backend's).
func dialSim(ctx context.Context, xds, id string, bundle *connect.Bundle, assignments []string) (*simNode, error) {
	tc := &tls.Config{Certificates: []tls.Certificate{bundle.Leaf}, MinVersion: tls.VersionTLS12,
		InsecureSkipVerify: true, //nolint:gosec // the controller's chain is checked below; its name is a SPIFFE id, not a host
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("the controller showed no certificate")
			}
			cert, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			_, err = cert.Verify(x509.VerifyOptions{Roots: bundle.Roots})
			return err
		}}
	conn, err := grpc.NewClient(xds, grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		return nil, err
	}
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	meta, err := wire.ProxyNode{ID: id, PublicAddress: "127.0.0.1", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001,
		InboundAddress: "127.0.0.1", InboundPort: 21000}.Metadata()
	if err != nil {
		return nil, err
	}
	n := &simNode{id: id, changed: make(chan struct{}, 1)}
	node := &core.Node{Id: id, Cluster: bootstrap.ServiceCluster, Metadata: meta}
	names := map[string][]string{
		resource.ListenerType: nil, resource.ClusterType: nil,
		resource.RouteType: {wire.MeshRoutes, wire.PublicRoutes}, resource.EndpointType: assignments,
	}
	first := true
	for _, typ := range []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType} {
		req := &discovery.DiscoveryRequest{TypeUrl: typ, ResourceNames: names[typ]}
		if first {
			req.Node, first = node, false
		}
		if err := stream.Send(req); err != nil {
			return nil, err
		}
	}
	go func() {
		defer func() { _ = conn.Close() }()
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			n.bytes.Add(int64(proto.Size(resp)))
			if resp.GetTypeUrl() == resource.RouteType {
				n.mu.Lock()
				n.routes, n.routesAt = resp.GetVersionInfo(), time.Now()
				n.mu.Unlock()
				select {
				case n.changed <- struct{}{}:
				default:
				}
			}
			ack := &discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(),
				ResponseNonce: resp.GetNonce(), ResourceNames: names[resp.GetTypeUrl()]}
			if err := stream.Send(ack); err != nil {
				return
			}
		}
	}()
	return n, nil
}

// routesVersion is the routes version the node has, and when it came.
func (n *simNode) routesVersion() (string, time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.routes, n.routesAt
}

// waitRoutes waits until the node has a routes version other than not,
// and returns when it came.
func (n *simNode) waitRoutes(ctx context.Context, not string) (time.Time, error) {
	for {
		if v, at := n.routesVersion(); v != "" && v != not {
			return at, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("node %s: no new routes: %w", n.id, ctx.Err())
		case <-n.changed:
		}
	}
}
