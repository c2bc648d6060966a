//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// askClusters opens an ADS stream over conn as node id and waits up to 5 s
// for clusters; it returns the error that ended the attempt, or nil.
func askClusters(t *testing.T, conn *grpc.ClientConn, id string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	md, _ := wire.ProxyNode{ID: id, PublicAddress: "127.0.0.1", PublicPort: 1, MeshAddress: "127.0.0.1", MeshPort: 2,
		InboundAddress: "127.0.0.1", InboundPort: 3}.Metadata()
	if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: id, Metadata: md}, TypeUrl: resource.ClusterType}); err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}

// TestXDSOverTLS serves xDS over TLS with Consul Connect identities: a
// node's Envoy gets its config with its certificate; a client without one
// gets nothing, and a client announcing another node's id than its
// certificate names is refused (any client that reached the xDS port used to
// get the whole mesh's config and could rewrite a node's listeners).
func TestXDSOverTLS(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "ctl", nil)
	ctl.waitLeading(20 * time.Second)
	a := startAgentArgs(t, consul, "tls-node", "127.0.0.2", ctl.xdsAddr, 4, nil)
	c := ctl.client("")
	ctx := context.Background()
	b := meshspec.Backend{Name: "web", Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1},
		Process: &meshspec.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--backend", "web", "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
	testutil.WaitFor(t, 20*time.Second, "the backend to be placed", func() bool { _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(b)); return err == nil })
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "web", Route: "/web", Traffic: map[string]float64{"web": 1}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the node's Envoy, configured over TLS, to serve", func() bool {
		return do(httpClient(), "GET", "http://"+a.public+"/web", "").status == 200
	})

	plain, err := grpc.NewClient(ctl.xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = plain.Close() }()
	if err := askClusters(t, plain, "tls-node"); err == nil {
		t.Fatal("a plaintext client got the mesh's config")
	}

	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	withCert := func(service string) *grpc.ClientConn {
		bundle, err := connect.Fetch(ctx, client, service)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(ctl.xdsAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{bundle.Leaf}, RootCAs: bundle.Roots, InsecureSkipVerify: true, //nolint:gosec // the server's SPIFFE id is not a host name; this client only probes the server
		})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	if err := askClusters(t, withCert(wire.NodeService("tls-node")), "another-node"); err == nil {
		t.Fatal("a client with tls-node's certificate got another node's config")
	}
	if err := askClusters(t, withCert("some-service"), "tls-node"); err == nil {
		t.Fatal("a client whose certificate names no servemesh node got a node's config")
	}
	if err := askClusters(t, withCert(wire.NodeService("probe")), "probe"); err != nil {
		t.Fatalf("a node with its own certificate: %v", err)
	}
}
