package translate

import (
	"bytes"
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/ir"
)

// TestEncodedNodeAssignments: the assignments framed from their endpoints'
// encodings are, byte for byte, what proto.Marshal makes of those
// BuildAssignments, inboundAssignments and nodeViewAssignments build, for
// every mTLS golden model's backends and for replicas of every health on
// uneven nodes.
func TestEncodedNodeAssignments(t *testing.T) {
	health := []ir.Health{ir.Healthy, ir.Unknown, ir.Draining, ir.Unhealthy}
	var backends []ir.Backend
	for nodes := 1; nodes <= 4; nodes++ {
		for _, picked := range []bool{false, true} {
			b := ir.Backend{Name: fmt.Sprintf("b%d-%v", nodes, picked), Reach: ir.ReachInbound, MaxConcurrent: 4, Picked: picked}
			for i := range 3*nodes + 1 {
				n := (i * i) % nodes
				b.Replicas = append(b.Replicas, ir.Replica{Address: fmt.Sprintf("127.0.0.1:%d", 9000-i), Health: health[(i/2)%4],
					Node: fmt.Sprintf("node-%d", n), Inbound: fmt.Sprintf("10.0.0.%d:21000", 9-n)})
			}
			backends = append(backends, b)
		}
	}
	for _, view := range goldenInputs(t, "testdata/mtls/in") {
		backends = append(backends, lowerFor(t, view, true).Backends...)
	}
	framed := 0
	for _, b := range backends {
		if !b.ViaInbound() {
			continue
		}
		got, ok, err := encodedNodeAssignments(b)
		if err != nil || !ok {
			t.Fatalf("backend %s: ok %v, %v", b.Name, ok, err)
		}
		one := &ir.DataPlane{Backends: []ir.Backend{b}}
		want := map[string][]byte{}
		for _, cla := range slices.Concat(BuildAssignments(one), inboundAssignments(one), nodeViewAssignments(one)) {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(cla)
			if err != nil {
				t.Fatal(err)
			}
			want[cla.GetClusterName()] = b
		}
		if len(got) != len(want) {
			t.Fatalf("backend %s: %d assignments, want %d", b.Name, len(got), len(want))
		}
		for _, e := range got {
			if !bytes.Equal(e.bytes(), want[e.Name]) {
				t.Fatalf("backend %s: assignment %s is not what proto.Marshal makes:\n got %x\nwant %x", b.Name, e.Name, e.bytes(), want[e.Name])
			}
			framed++
		}
	}
	if framed < 40 {
		t.Fatalf("compared %d assignments: the cases did not reach the framing", framed)
	}
}

// Nodes that do not pair one to one with inbound listeners (an agent
// moving its own) are left to the message-by-message path.
func TestEncodedNodeAssignmentsNeedOneListenerANode(t *testing.T) {
	for name, rs := range map[string][]ir.Replica{
		"a node on two listeners": {{Address: "127.0.0.1:1", Node: "n1", Inbound: "10.0.0.1:21000"}, {Address: "127.0.0.1:2", Node: "n1", Inbound: "10.0.0.2:21000"}},
		"two nodes on a listener": {{Address: "127.0.0.1:1", Node: "n1", Inbound: "10.0.0.1:21000"}, {Address: "127.0.0.1:2", Node: "n2", Inbound: "10.0.0.1:21000"}},
	} {
		b := ir.Backend{Name: "b", Reach: ir.ReachInbound, Replicas: rs}
		if _, ok, _ := encodedNodeAssignments(b); ok {
			t.Errorf("%s: framed", name)
		}
		nodes := map[string]bool{}
		for _, r := range rs {
			nodes[r.Node] = true
		}
		got, err := inboundBackendAssignments(b)
		if err != nil || len(got) != 1+2*len(nodes) {
			t.Errorf("%s: %d assignments, %v; want the shared one and the two of each node", name, len(got), err)
		}
	}
}

// TestAppendHost: an endpoint's host framed by appendHost is what
// proto.Marshal makes of it, for IPv4 and IPv6 replicas, host names and
// the ports' every varint length.
func TestAppendHost(t *testing.T) {
	for _, address := range []string{"127.0.0.1:9000", "10.1.2.3:1", "[::1]:8080", "[2001:db8::0:1]:65535", "replica.local:0", "127.0.0.1:127", "127.0.0.1:128", "127.0.0.1:16384"} {
		host, port := replicaHost(address)
		want, err := marshalDeterministic(&endpoint.LbEndpoint{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: socketAddress(host, port)}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := appendHost([]byte("head"), host, port); !bytes.Equal(got, append([]byte("head"), want...)) {
			t.Errorf("%s: appendHost\n got %x\nwant head+%x", address, got, want)
		}
	}
}

// TestReplicaHostIsCanonical: an endpoint names a replica's IP in its
// canonical form, and a host name as written.
func TestReplicaHostIsCanonical(t *testing.T) {
	for address, want := range map[string]string{"127.0.0.1:9000": "127.0.0.1", "[2001:db8::0:1]:1": "2001:db8::1",
		"[::ffff:10.0.0.1]:2": "::ffff:10.0.0.1", "[2001:DB8::1]:3": "2001:db8::1", "replica.local:4": "replica.local"} {
		if host, _ := replicaHost(address); host != want {
			t.Errorf("replicaHost(%q) = %q, want %q", address, host, want)
		}
	}
}

// TestPlaceByNodeIsSortByNode: replicas placed by node are what sorting
// them by node makes (stably), whatever their order; and groupByNode's
// groups are by node, each by address, on few nodes or many.
func TestPlaceByNodeIsSortByNode(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, nodes := range []int{1, 2, 3, placedNodes, placedNodes + 1, 40} {
		for range 20 {
			var rs []ir.Replica
			for i := range 3 * nodes {
				n := rng.IntN(nodes)
				rs = append(rs, ir.Replica{Address: fmt.Sprintf("10.0.%d.%d:80", rng.IntN(3), i), Node: fmt.Sprintf("n%02d", n), Inbound: fmt.Sprintf("10.255.0.%d:21000", n)})
			}
			want, wantEnds := sortByNode(rs)
			if got, ends := placeByNode(rs); got != nil && (!slices.Equal(got, want) || !slices.Equal(ends, wantEnds)) {
				t.Fatalf("%d nodes: placed %v %v\nsorted %v %v", nodes, got, ends, want, wantEnds)
			} else if got == nil && nodes <= placedNodes {
				t.Fatalf("%d nodes: not placed", nodes)
			}
			groups, ok := groupByNode(rs)
			if !ok {
				t.Fatalf("%d nodes: not grouped", nodes)
			}
			var flat []ir.Replica
			for _, g := range groups {
				flat = append(flat, g.replicas...)
			}
			sorted := slices.Clone(rs)
			slices.SortStableFunc(sorted, func(a, b ir.Replica) int {
				return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Address, b.Address))
			})
			if !slices.Equal(flat, sorted) {
				t.Fatalf("%d nodes: grouped %v\nwant %v", nodes, flat, sorted)
			}
		}
	}
}
