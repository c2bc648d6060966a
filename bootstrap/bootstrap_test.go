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

// Each listener's connection limit is a share of the node's, and the
// shares add up to at most the whole, so that a listener at its limit
// leaves every other its own (issue 58, M5: idle public connections took
// the connections the mesh and inbound listeners needed).
func TestListenerConnectionLimitsShareTheWhole(t *testing.T) {
	for _, max := range []uint64{16, 17, 40, 12_345, 0} {
		limits := Limits{MaxConnections: max}.ListenerConnectionLimits()
		whole := max
		if whole == 0 {
			whole = DefaultMaxConnections
		}
		var sum uint64
		for _, name := range []string{wire.PublicListener, wire.MeshListener, wire.InboundListener} {
			if limits[name] == 0 {
				t.Errorf("max %d: listener %s has no connections of its own: %v", max, name, limits)
			}
			sum += limits[name]
		}
		if sum > whole || len(limits) != 3 {
			t.Errorf("max %d: listener limits %v add up to %d; want three, at most %d", max, limits, sum, whole)
		}
		if limits[wire.PublicListener] > whole/2 {
			t.Errorf("max %d: the public listener may hold %d; want at most half", max, limits[wire.PublicListener])
		}
	}
}
