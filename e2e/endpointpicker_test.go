//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	consul "github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/dev/devepp"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// The Inference Extension's conformance picker follows this request
// header (a list of endpoints) and names the endpoint Envoy told it served
// the request in this answer header.
const (
	eppSelectionHeader = "test-epp-endpoint-selection"
	eppServedHeader    = "x-conformance-test-served-endpoint"
)

// TestExternalEndpointPicker: the Gateway API Inference Extension's
// reference picker (tools/gie-epp: its handlers, unmodified), one for each
// of two backends, chooses their replicas on the default mesh (mTLS, two
// nodes), as the extension's conformance suite checks a gateway's side of
// the protocol:
//
//  1. the replica the picker chose serves the request, from either node,
//     whichever node it runs on;
//  2. data-parallel ranks: the replicas of one node, one address, several
//     ports, are each reached when chosen;
//  3. a split across two backends (two pools) goes by its weights, each
//     request to a replica of its backend, chosen by that backend's
//     picker from the subset hint (the backend's ready replicas);
//  4. while a picker is down, a backend that fails open is served by
//     replicas Envoy picks, one that fails closed answers 503; and a
//     choice none of the backend's ready replicas can serve is a 503;
//  5. every answer the picker chose tells it the replica that served it.
func TestExternalEndpointPicker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mesh := startTwoNodeMesh(t, "epp")
	pickers := map[string]*devepp.Picker{}
	for _, b := range []string{"pa", "pb"} {
		p, err := devepp.Start(ctx, devepp.Options{Dir: t.TempDir(), Consul: "http://" + mesh.consul.HTTPAddr, Service: wire.BackendService(b), Listen: freeAddr(t)})
		if err != nil {
			t.Fatal(err)
		}
		pickers[b] = p
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("picker of %s:\n%s", b, p.LogTail())
			}
			p.Stop()
		})
	}
	// pa fails closed, pb open; pa's three replicas are spread over two
	// nodes, so one node runs two: ranks of one address.
	mesh.createBackends(t,
		meshspec.Backend{Name: "pa", Process: demoProcess("pa", false), Config: meshspec.BackendConfig{NumReplicas: 3,
			EndpointPicker: &meshspec.EndpointPicker{Address: pickers["pa"].Addr}}},
		meshspec.Backend{Name: "pb", Process: demoProcess("pb", false), Config: meshspec.BackendConfig{NumReplicas: 2,
			EndpointPicker: &meshspec.EndpointPicker{Address: pickers["pb"].Addr, FailOpen: true}}})
	for _, e := range []meshspec.Endpoint{
		{Name: "a", Route: "/a", Traffic: map[string]float64{"pa": 1}},
		{Name: "b", Route: "/b", Traffic: map[string]float64{"pb": 1}},
		{Name: "pools", Route: "/pools", Traffic: map[string]float64{"pa": 0.7, "pb": 0.3}},
	} {
		if _, err := mesh.c.CreateEndpoint(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	catalog, err := mesh.consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	pathOf := map[string]string{"pa": "/a", "pb": "/b"}
	eps := map[string]map[string]string{} // backend: endpoint -> replica
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("the last answer while waiting: %s", last)
		}
	}()
	testutil.WaitFor(t, 3*time.Minute, "pa's 3 and pb's 2 replicas to pass and answer picked", func() bool {
		for b, n := range map[string]int{"pa": 3, "pb": 2} {
			if eps[b] = pickerEndpoints(t, catalog, b); len(eps[b]) != n {
				return false
			}
			for ep := range eps[b] {
				for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
					if a := askPicked(t, n, pathOf[b], ep); a.status != http.StatusOK || a.served != ep {
						last = fmt.Sprintf("/%s via %s choosing %s: %+v", b, n.id, ep, a)
						return false
					}
				}
			}
		}
		return true
	})
	t.Logf("replicas as the pickers name them: %v", eps)

	t.Run("the replica chosen serves the request, whichever node sends it", func(t *testing.T) {
		for b, byEndpoint := range eps {
			for ep, replica := range byEndpoint {
				for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
					for range 3 {
						a := askPicked(t, n, pathOf[b], ep)
						if a.status != http.StatusOK || a.replica != replica || a.served != ep {
							t.Fatalf("%s via %s choosing %s (%s): %d from replica %q, the picker told it served %q; want 200 from %s, told %s",
								pathOf[b], n.id, ep, replica, a.status, a.replica, a.served, replica, ep)
						}
					}
				}
			}
		}
	})

	t.Run("data-parallel ranks: each port of one address is reached when chosen", func(t *testing.T) {
		ports := map[string][]string{}
		for ep := range eps["pa"] {
			host, port, _ := net.SplitHostPort(ep)
			ports[host] = append(ports[host], port)
		}
		var host string
		for h, ps := range ports {
			if len(ps) >= 2 {
				host = h
			}
		}
		if host == "" {
			t.Fatalf("pa's replicas %v: no node runs two; want two ranks of one address", eps["pa"])
		}
		for _, port := range ports[host] {
			ep := net.JoinHostPort(host, port)
			if a := askPicked(t, mesh.n1, "/a", ep); a.status != http.StatusOK || a.replica != eps["pa"][ep] || a.served != ep {
				t.Errorf("rank %s: %d from %q, served %q; want 200 from %s", ep, a.status, a.replica, a.served, eps["pa"][ep])
			}
		}
	})

	t.Run("a split across two pools goes by weight, each request picked in its pool", func(t *testing.T) {
		var all []string
		for _, byEndpoint := range eps {
			for ep := range byEndpoint {
				all = append(all, ep)
			}
		}
		// With the conformance header naming every pool's replicas, and
		// without it (each picker then chooses from its subset hint).
		const n = 200
		for _, selection := range []string{strings.Join(all, ","), ""} {
			got := map[string]int{}
			for i := range n {
				node := []*mtlsNode{mesh.n1, mesh.n2}[i%2]
				a := askPicked(t, node, "/pools", selection)
				replica, ok := eps[a.backend][a.served]
				if a.status != http.StatusOK || !ok || replica != a.replica {
					t.Fatalf("/pools (selection %q): %d from backend %q replica %q, served %q; want 200 from a replica of its backend, the one the picker chose",
						selection, a.status, a.backend, a.replica, a.served)
				}
				got[a.backend]++
			}
			// 70% of 200 is 140, sd 6.5: 110 to 170 fails by chance about
			// once in 100,000 runs.
			if got["pa"] < 110 || got["pa"] > 170 || got["pa"]+got["pb"] != n {
				t.Errorf("/pools split 0.7/0.3 (selection %q): %v of %d; want about 140 to pa", selection, got, n)
			}
		}
		// From inside the mesh (a replica's call, through its node's mesh
		// listener, by the endpoint's name): each backend's share asks its
		// own picker there too.
		got := map[string]int{}
		for i := range 40 {
			node := []*mtlsNode{mesh.n1, mesh.n2}[i%2]
			a := askPickedAt(t, "http://"+node.mesh+"/pools", "pools", "")
			if replica, ok := eps[a.backend][a.served]; a.status != http.StatusOK || !ok || replica != a.replica {
				t.Fatalf("pools via %s's mesh listener: %d from backend %q replica %q, served %q; want 200 from a replica its picker chose", node.id, a.status, a.backend, a.replica, a.served)
			}
			got[a.backend]++
		}
		if got["pa"] == 0 || got["pb"] == 0 {
			t.Errorf("pools via the mesh listeners: %v of 40; want both backends", got)
		}
	})

	t.Run("a picker down: fail open is served, fail closed is a 503", func(t *testing.T) {
		for _, b := range []string{"pa", "pb"} {
			pickers[b].Stop()
		}
		for range 5 {
			if a := askPicked(t, mesh.n1, "/b", ""); a.status != http.StatusOK || a.backend != "pb" || a.served != "" {
				t.Fatalf("/b with its picker down (fail open): %d from %q, served %q; want 200 from pb, no picker told", a.status, a.backend, a.served)
			}
			if a := askPicked(t, mesh.n2, "/a", ""); a.status != http.StatusServiceUnavailable {
				t.Fatalf("/a with its picker down (fail closed): %d from %q; want 503", a.status, a.replica)
			}
		}
		for _, b := range []string{"pa", "pb"} {
			if err := pickers[b].Restart(ctx); err != nil {
				t.Fatal(err)
			}
		}
		testutil.WaitFor(t, 30*time.Second, "/a to be picked again", func() bool {
			return askPicked(t, mesh.n2, "/a", "").status == http.StatusOK
		})
		// A choice outside the backend's ready replicas (the picker finds
		// none to pick): the picker fails the request.
		if a := askPicked(t, mesh.n1, "/a", "192.0.2.1:80"); a.status != http.StatusServiceUnavailable {
			t.Errorf("/a choosing no replica of pa: %d from %q; want 503", a.status, a.replica)
		}
	})

	t.Run("every answer tells the picker the replica that served it", func(t *testing.T) {
		seen := map[string]bool{}
		for i := range 30 {
			a := askPicked(t, []*mtlsNode{mesh.n1, mesh.n2}[i%2], "/a", "")
			if a.status != http.StatusOK || eps["pa"][a.served] != a.replica {
				t.Fatalf("/a: %d from %q, the picker was told %q served (%q); want the replica that answered", a.status, a.replica, a.served, eps["pa"][a.served])
			}
			seen[a.served] = true
		}
		if len(seen) != len(eps["pa"]) {
			t.Errorf("the picker's round robin over pa reached %v; want every one of %v", seen, eps["pa"])
		}
	})
}

// pickedAnswer is what a request to an endpoint whose backend a picker
// picks got: its status, the backend and replica that answered, and the
// endpoint the conformance picker was told served it.
type pickedAnswer struct {
	status                   int
	backend, replica, served string
	header                   http.Header
}

// askPicked sends GET path to node's public listener choosing selection
// (the conformance picker's header; "" none).
func askPicked(t *testing.T, node *mtlsNode, path, selection string) pickedAnswer {
	t.Helper()
	return askPickedAt(t, "http://"+node.public+path, "", selection)
}

// askPickedAt is askPicked to url, as host ("" the URL's).
func askPickedAt(t *testing.T, url, host, selection string) pickedAnswer {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	req.Host = host
	if selection != "" {
		req.Header.Set(eppSelectionHeader, selection)
	}
	resp, err := httpClient().Do(req)
	if err != nil {
		return pickedAnswer{}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return pickedAnswer{status: resp.StatusCode, backend: resp.Header.Get(demoreplica.BackendHeader), replica: resp.Header.Get(demoreplica.ReplicaHeader),
		served: resp.Header.Get(eppServedHeader), header: resp.Header}
}

// pickerEndpoints are backend's passing replicas as a picker names them
// (their node's address, their port), each with its replica's tag.
func pickerEndpoints(t *testing.T, c *consul.Client, backend string) map[string]string {
	t.Helper()
	entries, _, err := c.Health().Service(wire.BackendService(backend), "", true, nil)
	if err != nil {
		t.Logf("reading the catalog: %v", err)
		return nil
	}
	out := map[string]string{}
	for _, e := range entries {
		host, _, err := net.SplitHostPort(e.Service.Meta[wire.MetaReplicaInbound])
		if err != nil {
			continue
		}
		out[net.JoinHostPort(host, strconv.Itoa(e.Service.Port))] = e.Service.Meta[wire.MetaReplicaTag]
	}
	return out
}

// TestEndpointPickerCannotLeaveItsBackend: a picker is a part that can be
// compromised (or wrong). On the default mesh, a picker that answers what
// the test says is told the backend's ready replicas (the subset hint),
// and whatever it names, a request goes only to a replica of that
// backend: a list naming another backend's replica is a 503, and in a
// list the names that are not the backend's replicas are passed over. Its
// own answers (429 shed, 503) reach the client as they are.
func TestEndpointPickerCannotLeaveItsBackend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mesh := startTwoNodeMesh(t, "eppx")
	rogue := &scriptedPicker{}
	addr := rogue.serve(t)
	mesh.createBackends(t,
		meshspec.Backend{Name: "pc", Process: demoProcess("pc", false), Config: meshspec.BackendConfig{NumReplicas: 2,
			EndpointPicker: &meshspec.EndpointPicker{Address: addr}}},
		meshspec.Backend{Name: "other", Process: demoProcess("other", false), Config: meshspec.BackendConfig{NumReplicas: 1}})
	for _, e := range []meshspec.Endpoint{{Name: "c", Route: "/c", Traffic: map[string]float64{"pc": 1}}, {Name: "o", Route: "/o", Traffic: map[string]float64{"other": 1}}} {
		if _, err := mesh.c.CreateEndpoint(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	catalog, err := mesh.consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	var pc, other map[string]string
	testutil.WaitFor(t, 2*time.Minute, "pc's 2 replicas and other's 1 to pass and answer", func() bool {
		pc, other = pickerEndpoints(t, catalog, "pc"), pickerEndpoints(t, catalog, "other")
		if len(pc) != 2 || len(other) != 1 {
			return false
		}
		for ep := range pc {
			rogue.answer.Store(ep)
			if a := askPicked(t, mesh.n1, "/c", ""); a.status != http.StatusOK || a.replica != pc[ep] {
				return false
			}
		}
		return askPicked(t, mesh.n1, "/o", "").status == http.StatusOK
	})
	var want []string
	for ep := range pc {
		want = append(want, ep)
	}
	slices.Sort(want)
	if got := rogue.subset.Load(); got == nil || *got != strings.Join(want, ",") {
		t.Errorf("the picker's subset hint: %v; want pc's ready replicas %s", got, strings.Join(want, ","))
	}
	for ep := range other {
		rogue.answer.Store(ep)
		if a := askPicked(t, mesh.n2, "/c", ""); a.status != http.StatusServiceUnavailable {
			t.Errorf("the picker naming %s, a replica of another backend: %d from %s %q; want 503", ep, a.status, a.backend, a.replica)
		}
	}
	// The picker's own answers (shed: 429; no ready endpoint: 503) reach
	// the client as they are.
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		rogue.status.Store(int32(status))
		if a := askPicked(t, mesh.n1, "/c", ""); a.status != status || a.replica != "" {
			t.Errorf("the picker answering %d: %d from %q; want its %d", status, a.status, a.replica, status)
		}
	}
	rogue.status.Store(0)
	for ep, replica := range pc {
		for _, node := range []*mtlsNode{mesh.n1, mesh.n2} {
			rogue.answer.Store("192.0.2.1:80," + ep)
			if a := askPicked(t, node, "/c", ""); a.status != http.StatusOK || a.replica != replica {
				t.Errorf("the picker naming 192.0.2.1:80 then %s, via %s: %d from %q; want 200 from %s", ep, node.id, a.status, a.replica, replica)
			}
		}
	}
}

// scriptedPicker is an ext_proc server speaking the protocol's picker side
// with whatever answer holds ("IP:port", a list), keeping the last subset
// hint it was sent.
type scriptedPicker struct {
	extproc.UnimplementedExternalProcessorServer
	answer atomic.Value // string
	status atomic.Int32 // if set, the picker answers the request itself with this status
	subset atomic.Pointer[string]
}

// serve serves the picker on a free loopback port until the test ends.
func (p *scriptedPicker) serve(t *testing.T) string {
	t.Helper()
	p.answer.Store("")
	l, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	extproc.RegisterExternalProcessorServer(srv, p)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return l.Addr().String()
}

// Process answers one request's stream until Envoy ends it.
func (p *scriptedPicker) Process(stream extproc.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp := &extproc.ProcessingResponse{}
		switch req.Request.(type) {
		case *extproc.ProcessingRequest_RequestHeaders:
			if hint := req.GetMetadataContext().GetFilterMetadata()[wire.SubsetHintNamespace].GetFields()[wire.SubsetHintKey]; hint != nil {
				s := hint.GetStringValue()
				p.subset.Store(&s)
			}
			if status := p.status.Load(); status != 0 {
				resp.Response = &extproc.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extproc.ImmediateResponse{
					Status: &typev3.HttpStatus{Code: typev3.StatusCode(status)}, Body: []byte("the picker's own answer\n")}}
				break
			}
			picked, _ := p.answer.Load().(string)
			resp.Response = &extproc.ProcessingResponse_RequestHeaders{RequestHeaders: &extproc.HeadersResponse{}}
			resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{wire.PickerNamespace: structpb.NewStructValue(&structpb.Struct{
				Fields: map[string]*structpb.Value{wire.DestinationEndpointKey: structpb.NewStringValue(picked)}})}}
		case *extproc.ProcessingRequest_RequestBody:
			resp.Response = &extproc.ProcessingResponse_RequestBody{RequestBody: &extproc.BodyResponse{}}
		case *extproc.ProcessingRequest_ResponseHeaders:
			resp.Response = &extproc.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extproc.HeadersResponse{}}
		default:
			continue
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}
