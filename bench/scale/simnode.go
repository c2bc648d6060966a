package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/wire"
)

// simNode is a simulated node: one ADS stream, over mTLS with the node's
// own Connect identity, that subscribes as a node's Envoy does (listeners,
// clusters and the mesh's scoped routes, then the route configurations
// the listeners and scopes name, and the assignments of every backend),
// over delta xDS (the nodes' default) or state of the world; it ACKs every
// answer, and records when each routes version arrives and how many bytes
// it was sent.
type simNode struct {
	id     string
	public bool // it has a public listener, so asks for the public table
	bytes  atomic.Int64

	mu       sync.Mutex
	routes   string    // the last routes version it ACKed
	routesAt time.Time // when that version arrived
	changed  chan struct{}
}

// simConfig is what every simulated node is told: where the controller's
// xDS server is, and the xDS variant.
type simConfig struct {
	xds   string
	delta bool
}

// simReach is what one simulated node serves and asks for: whether it
// has a public listener, the endpoints it reaches (nil: every one), and
// the EDS names it asks for (those of the backends its clusters name, as
// Envoy asks).
type simReach struct {
	public      bool
	reachable   []string
	assignments []string
	// onDemand: the node's clusters come on demand (--clusters
	// on-demand), and clusters are those it names besides the wildcard,
	// as Envoy does once requests used them; routes, if not nil, the only
	// route configurations it asks for (a mesh-only node's scopes load
	// theirs on demand).
	onDemand         bool
	clusters, routes []string
}

// dialSim connects a simulated node to the controller, as node id with the
// identity in bundle, and subscribes as reach says.
func dialSim(ctx context.Context, cfg simConfig, id string, bundle *connect.Bundle, reach simReach) (*simNode, error) {
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
	conn, err := grpc.NewClient(cfg.xds, grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		return nil, err
	}
	pn := wire.ProxyNode{ID: id, MeshAddress: "127.0.0.1", MeshPort: 15001, InboundAddress: "127.0.0.1", InboundPort: 21000, Reachable: reach.reachable,
		ClustersOnDemand: reach.onDemand}
	if reach.public {
		pn.PublicAddress, pn.PublicPort = "127.0.0.1", 8080
	}
	meta, err := pn.Metadata()
	if err != nil {
		return nil, err
	}
	n := &simNode{id: id, public: reach.public, changed: make(chan struct{}, 1)}
	node := &core.Node{Id: id, Cluster: bootstrap.ServiceCluster, Metadata: meta}
	client := discovery.NewAggregatedDiscoveryServiceClient(conn)
	if cfg.delta {
		err = n.runDelta(ctx, client, node, reach, func() { _ = conn.Close() })
	} else {
		err = n.runSotW(ctx, client, node, reach, func() { _ = conn.Close() })
	}
	if err != nil {
		_ = conn.Close()
	}
	return n, err
}

// subscribe sends, as Envoy does, a request for each type in order, with
// the names it asks for first (nil: every resource of the type) and the
// node on the first; request builds a request of the stream's kind. A node
// asks for no route configuration until it has scopes (both its listeners
// take their routes from scopes). It returns the names asked for, by type.
func subscribe[R any](send func(R) error, reach simReach, request func(typ string, names []string, node bool) R) (map[string][]string, error) {
	names := map[string][]string{resource.EndpointType: reach.assignments}
	if reach.clusters != nil {
		names[resource.ClusterType] = append([]string{"*"}, reach.clusters...)
	}
	types := []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.ScopedRouteType}
	for i, typ := range types {
		if err := send(request(typ, names[typ], i == 0)); err != nil {
			return nil, err
		}
	}
	return names, nil
}

// runSotW subscribes over state of the world and answers in the
// background; a scoped-routes answer restates the route names, as Envoy
// does.
func (n *simNode) runSotW(ctx context.Context, client discovery.AggregatedDiscoveryServiceClient, node *core.Node, reach simReach, done func()) error {
	stream, err := client.StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	names, err := subscribe(stream.Send, reach, func(typ string, names []string, first bool) *discovery.DiscoveryRequest {
		req := &discovery.DiscoveryRequest{TypeUrl: typ, ResourceNames: names}
		if first {
			req.Node = node
		}
		return req
	})
	if err != nil {
		return err
	}
	routeVersion, routeNonce := "", ""
	go func() {
		defer done()
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			n.received(resp.GetTypeUrl(), resp.GetVersionInfo(), proto.Size(resp))
			typ := resp.GetTypeUrl()
			if typ == resource.RouteType {
				routeVersion, routeNonce = resp.GetVersionInfo(), resp.GetNonce()
			}
			ack := &discovery.DiscoveryRequest{TypeUrl: typ, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(), ResourceNames: names[typ]}
			if err := stream.Send(ack); err != nil {
				return
			}
			if typ == resource.ScopedRouteType {
				names[resource.RouteType] = scopedRouteNames(resp.GetResources())
				req := &discovery.DiscoveryRequest{TypeUrl: resource.RouteType, VersionInfo: routeVersion, ResponseNonce: routeNonce,
					ResourceNames: names[resource.RouteType]}
				if err := stream.Send(req); err != nil {
					return
				}
			}
		}
	}()
	return nil
}

// runDelta subscribes over delta xDS and answers in the background; a
// scoped-routes answer subscribes to the route configurations of the
// scopes added, as Envoy does.
func (n *simNode) runDelta(ctx context.Context, client discovery.AggregatedDiscoveryServiceClient, node *core.Node, reach simReach, done func()) error {
	stream, err := client.DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if _, err := subscribe(stream.Send, reach, func(typ string, names []string, first bool) *discovery.DeltaDiscoveryRequest {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: typ, ResourceNamesSubscribe: names}
		if first {
			req.Node = node
		}
		return req
	}); err != nil {
		return err
	}
	go func() {
		defer done()
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			n.received(resp.GetTypeUrl(), resp.GetSystemVersionInfo(), proto.Size(resp))
			if err := stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
				return
			}
			if resp.GetTypeUrl() != resource.ScopedRouteType {
				continue
			}
			var anys []*anypb.Any
			for _, r := range resp.GetResources() {
				anys = append(anys, r.GetResource())
			}
			added := scopedRouteNames(anys)
			if reach.routes != nil {
				added = slices.DeleteFunc(added, func(name string) bool { return !slices.Contains(reach.routes, name) })
			}
			if len(added) > 0 {
				if err := stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResourceNamesSubscribe: added}); err != nil {
					return
				}
			}
		}
	}()
	return nil
}

// received counts an answer's bytes and, for routes, records its version.
func (n *simNode) received(typeURL, version string, size int) {
	n.bytes.Add(int64(size))
	if typeURL != resource.RouteType {
		return
	}
	n.mu.Lock()
	n.routes, n.routesAt = version, time.Now()
	n.mu.Unlock()
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

// scopedRouteNames are the route configurations scopes name.
func scopedRouteNames(scopes []*anypb.Any) []string {
	var out []string
	for _, a := range scopes {
		var s route.ScopedRouteConfiguration
		if a.UnmarshalTo(&s) == nil {
			out = append(out, s.GetRouteConfigurationName())
		}
	}
	return out
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
