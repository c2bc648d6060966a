package server

import (
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/servemesh/servemesh/wire"
)

// TestNodesOutsideTheSkewPolicyAreRefused: a node whose agent announces a
// protocol newer than the controller's, or older than it serves, gets its
// stream closed with the policy's message and is listed with it in
// Status; one of the previous protocol, and one that announces none (a
// release before versions were announced: protocol 1), are served.
func TestNodesOutsideTheSkewPolicyAreRefused(t *testing.T) {
	s, conn, _ := startServer(t)
	if err := s.SetDataPlane(lowered(t, testModel("127.0.0.1:9001"))); err != nil {
		t.Fatal(err)
	}
	node := func(id string, protocol int) *core.Node {
		md, err := wire.ProxyNode{ID: id, PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001,
			Version: "v-test", Protocol: protocol}.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		return &core.Node{Id: id, Metadata: md}
	}
	for _, c := range []struct {
		id       string
		protocol int
		refused  string
	}{
		{"newer", wire.Protocol + 1, "upgrade the controllers first"},
		{"previous", wire.MinNodeProtocol, ""},
		{"unannounced", 0, ""},
	} {
		st := openSotW(t, conn)
		st.send(&discovery.DiscoveryRequest{Node: node(c.id, c.protocol), TypeUrl: resource.ClusterType})
		select {
		case err := <-st.err:
			if c.refused == "" || !strings.Contains(err.Error(), c.refused) {
				t.Fatalf("node %s (protocol %d): stream closed with %v, want %q", c.id, c.protocol, err, c.refused)
			}
		case r := <-st.recv:
			if c.refused != "" {
				t.Fatalf("node %s (protocol %d) got %s, want its stream refused", c.id, c.protocol, r.GetTypeUrl())
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("node %s: neither served nor refused", c.id)
		}
	}
	skews := map[string]string{}
	for _, n := range s.Status() {
		skews[n.ID] = n.Skew
	}
	if !strings.Contains(skews["newer"], "newer than this controller") || skews["previous"] != "" || skews["unannounced"] != "" {
		t.Fatalf("status skews %q", skews)
	}
}
