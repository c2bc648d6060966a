package bootstrap

import (
	"flag"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/servemesh/servemesh/internal/protoyaml"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

var testNode = wire.ProxyNode{ID: "node-1", PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001}

func TestGolden(t *testing.T) {
	cases := map[string]Options{
		"sotw":            {Node: testNode, XDSAddress: "127.0.0.1:18000", AdminSocket: "/run/servemesh/admin/envoy.sock", Protocol: ProtocolSotW},
		"delta":           {Node: testNode, XDSAddress: "127.0.0.1:18000", AdminSocket: "/run/servemesh/admin/envoy.sock"},
		"dns-xds":         {Node: testNode, XDSAddress: "controlplane.internal:18000", AdminSocket: "/run/servemesh/admin/envoy.sock"},
		"two-controllers": {Node: testNode, XDSAddress: "127.0.0.1:18000,127.0.0.1:18010", AdminSocket: "/run/servemesh/admin/envoy.sock"},
		"xds-tls": {Node: testNode, XDSAddress: "127.0.0.1:18000", AdminSocket: "/run/servemesh/admin/envoy.sock",
			XDSTLS: &XDSTLS{Secrets: "/run/servemesh/secrets", ServerSAN: "spiffe://11111111.consul/ns/default/dc/dc1/svc/servemesh-controller"}},
	}
	for name, opts := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := YAML(opts)
			if err != nil {
				t.Fatal(err)
			}
			testutil.Golden(t, filepath.Join("testdata", name+".yaml"), got, *update)
			var b bootstrapv3.Bootstrap
			if err := protoyaml.Unmarshal(got, &b); err != nil {
				t.Fatalf("golden bootstrap does not unmarshal into the Bootstrap proto: %v", err)
			}
			node, err := wire.ProxyNodeFromEnvoy(b.GetNode())
			if err != nil {
				t.Fatal(err)
			}
			if !node.Equal(opts.Node) {
				t.Errorf("metadata round trip: got %+v, want %+v", node, opts.Node)
			}
		})
	}
}

var onDemandNode = func() wire.ProxyNode { n := testNode; n.ClustersOnDemand = true; return n }()

func TestBuildRejectsBadOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		opts Options
		want string
	}{
		"no xds port":         {Options{Node: testNode, XDSAddress: "127.0.0.1", AdminSocket: "/run/servemesh/admin/envoy.sock"}, "xds address"},
		"no admin socket":     {Options{Node: testNode, XDSAddress: "127.0.0.1:1"}, "admin socket path is empty"},
		"long admin socket":   {Options{Node: testNode, XDSAddress: "127.0.0.1:1", AdminSocket: "/" + strings.Repeat("x", 120)}, "over the 107"},
		"no node id":          {Options{Node: wire.ProxyNode{PublicAddress: "0.0.0.0", PublicPort: 1, MeshAddress: "127.0.0.1", MeshPort: 2}, XDSAddress: "127.0.0.1:1", AdminSocket: "admin/envoy.sock"}, "node id"},
		"same ports":          {Options{Node: wire.ProxyNode{ID: "n", PublicAddress: "127.0.0.1", PublicPort: 1, MeshAddress: "127.0.0.1", MeshPort: 1}, XDSAddress: "127.0.0.1:1", AdminSocket: "admin/envoy.sock"}, "different ports"},
		"bad protocol":        {Options{Node: testNode, XDSAddress: "127.0.0.1:1", AdminSocket: "admin/envoy.sock", Protocol: "rest"}, "xds protocol"},
		"on demand over sotw": {Options{Node: onDemandNode, XDSAddress: "127.0.0.1:1", AdminSocket: "admin/envoy.sock", Protocol: ProtocolSotW}, "clusters on demand need delta xDS"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Build(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}
