package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	status, _, body := testutil.Get(t, url)
	return status, body
}

func TestFilePlaneServesAValidFileOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := StartFilePlane(ctx, quiet(), FilePlaneOptions{}); err == nil || !strings.Contains(err.Error(), "--config is required") {
		t.Fatalf("no config: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("backends: [{name: 'x y'}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := StartFilePlane(ctx, quiet(), FilePlaneOptions{ConfigPath: bad, XDSListen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0"}); err == nil {
		t.Fatal("an invalid config file was served")
	}
	p, err := StartFilePlane(ctx, quiet(), FilePlaneOptions{ConfigPath: "../examples/demo.yaml", XDSListen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if code, body := get(t, "http://"+p.HTTPAddr()+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, "http://"+p.HTTPAddr()+"/v1/xds/nodes"); code != http.StatusOK || strings.TrimSpace(body) != "[]" {
		t.Fatalf("/v1/xds/nodes with no node: %d %q", code, body)
	}
	if _, body := get(t, "http://"+p.HTTPAddr()+"/metrics"); !strings.Contains(body, "servemesh_xds_model_generation 1") {
		t.Fatalf("the demo model was not accepted: /metrics lacks servemesh_xds_model_generation 1")
	}
}

// TestControllerWiring runs a whole controller against a real Consul dev
// agent: it must lead, take a change through its API, and report it in
// /v1/status and its metrics.
// TestDaemonsRefuseAnOpenConsul: with mTLS, a Consul whose ACLs are off
// lets any replica mint any identity and rewrite the state; the controller
// and the agent refuse to start on one unless told --insecure-consul. (The
// e2e ACL test shows both start on a Consul with default deny.)
func TestDaemonsRefuseAnOpenConsul(t *testing.T) {
	consul := testutil.MustStartConsul(t)
	t.Setenv("CONSUL_HTTP_ADDR", consul.HTTPAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	apiAddr, _ := proc.FreeAddr(ctx, "127.0.0.1")
	err := RunController(ctx, quiet(), ControllerOptions{APIListen: apiAddr, XDSListen: "127.0.0.1:0", Advertise: apiAddr, ConsulPrefix: "servemesh", ID: "open"})
	if !errors.Is(err, ErrConsulOpen) || !strings.Contains(err.Error(), "--insecure-consul") {
		t.Fatalf("the controller on a Consul without ACLs: %v; want ErrConsulOpen naming --insecure-consul", err)
	}
	_, err = nodeMTLS(ctx, quiet(), nil, &AgentOptions{Inbound: "127.0.0.1:21000"})
	if !errors.Is(err, ErrConsulOpen) {
		t.Fatalf("the agent on a Consul without ACLs: %v; want ErrConsulOpen", err)
	}
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	if keys, _, err := client.KV().Keys(aclProbePrefix, "", nil); err != nil || len(keys) != 0 {
		t.Fatalf("the probe left keys %v (%v)", keys, err)
	}
}

func TestControllerWiring(t *testing.T) {
	consul := testutil.MustStartConsul(t)
	t.Setenv("CONSUL_HTTP_ADDR", consul.HTTPAddr)
	ctx, cancel := context.WithCancel(context.Background())
	c, apiAddr, done := startLeadingController(ctx, t, ControllerOptions{ID: "test", InsecureConsul: true})
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller ended with %v", err)
		}
	}()
	b := meshspec.Backend{Name: "v1", Replicas: []meshspec.Replica{{Address: "10.0.0.1:9001"}}}
	if changed, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(b)); err != nil || !changed {
		t.Fatalf("create backend: %v, %v", changed, err)
	}
	r, err := c.Status(ctx)
	if err != nil || len(r.Backends) != 1 || r.Backends[0].Name != "v1" || r.Backends[0].Running != 1 {
		t.Fatalf("status %+v, %v", r, err)
	}
	_, body := get(t, "http://"+apiAddr+"/metrics")
	for _, want := range []string{`servemesh_controller_operations_total{op="create_backend",result="ok"} 1`,
		"servemesh_dataplane_view_refusals_total 0", "servemesh_xds_model_generation"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	var nodes []json.RawMessage
	if _, body := get(t, "http://"+apiAddr+"/v1/xds/nodes"); json.Unmarshal([]byte(body), &nodes) != nil {
		t.Errorf("/v1/xds/nodes: %q", body)
	}
}

// TestDemoHasRoomForWhatItPrints: the demo's help has model-v2 scaled to 3
// and load that autoscales embedder to its maximum; both at once, with
// every other backend as it starts, fit the demo's node (the autoscaler got
// none of the replicas it wanted before).
func TestDemoHasRoomForWhatItPrints(t *testing.T) {
	m := StackModel("/bin/servemesh", nil)
	help := stackHelp(StackOptions{Self: "/bin/servemesh"}, "consul", "mesh.yaml", "http://127.0.0.1:16686")
	if !strings.Contains(help, "backend update model-v2 --num-replicas 3") {
		t.Fatalf("the demo's help no longer scales model-v2 to 3; update this test: %s", help)
	}
	need := 0.0
	for _, b := range m.Backends {
		replicas := b.Config.NumReplicas
		if b.Name == "model-v2" {
			replicas = 3
		}
		if as := b.Config.Autoscaling; as != nil {
			replicas = as.MaxReplicas
		}
		need += float64(replicas) * b.Config.CPUs
	}
	if need > DemoNodeCPUs {
		t.Fatalf("the demo's lines need %g CPUs at once; its node offers %d", need, DemoNodeCPUs)
	}
}

func TestStackModelIsValid(t *testing.T) {
	if err := StackModel("/bin/servemesh", nil).Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestXDSStreamsPerConnectionAreCapped: one connection may hold at most
// MaxXDSStreamsPerConnection ADS streams (the xDS server had no limits); one
// more waits until another ends.
func TestXDSStreamsPerConnectionAreCapped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := StartFilePlane(ctx, quiet(), FilePlaneOptions{ConfigPath: "../examples/demo.yaml", XDSListen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	conn, err := grpc.NewClient(p.XDSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	// open starts stream i as a node and waits up to 2 s for its first
	// answer; the stream lives until the test ends (or 20 s).
	open := func(i int) (context.CancelFunc, error) {
		sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
		got := make(chan error, 1)
		go func() {
			stream, err := ads.StreamAggregatedResources(sctx) // waits for a stream slot
			if err != nil {
				got <- err
				return
			}
			id := fmt.Sprintf("cap-%d", i)
			md, _ := wire.ProxyNode{ID: id, PublicAddress: "127.0.0.1", PublicPort: uint32(20000 + i), MeshAddress: "127.0.0.1", MeshPort: 15001}.Metadata()
			if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: id, Metadata: md}, TypeUrl: resource.ClusterType}); err != nil {
				got <- err
				return
			}
			_, err = stream.Recv()
			got <- err
		}()
		select {
		case err := <-got:
			return scancel, err
		case <-time.After(2 * time.Second):
			return scancel, context.DeadlineExceeded
		}
	}
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	for i := range MaxXDSStreamsPerConnection {
		c, err := open(i)
		cancels = append(cancels, c)
		if err != nil {
			t.Fatalf("stream %d of %d: %v", i+1, MaxXDSStreamsPerConnection, err)
		}
	}
	c, err := open(MaxXDSStreamsPerConnection)
	cancels = append(cancels, c)
	if err == nil {
		t.Fatalf("stream %d on one connection was served; the cap is %d", MaxXDSStreamsPerConnection+1, MaxXDSStreamsPerConnection)
	}
}

// TestEveryPathNeedsAToken: with tokens, /metrics and /v1/xds/nodes need
// one too (they used to skip it); only /healthz answers anyone.
func TestEveryPathNeedsAToken(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := NewPlane(quiet(), false)
	p.Wrap(api.Tokens{"read-token": api.ScopeRead}.Authenticate)
	if err := p.Listen(ctx, "127.0.0.1:0", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("the plane stopped with %v", err)
		}
	}()
	for _, path := range []string{"/metrics", "/v1/xds/nodes", "/healthz"} {
		for _, token := range []string{"", "read-token"} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.HTTPAddr()+path, nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			want := http.StatusOK
			if token == "" && path != "/healthz" {
				want = http.StatusUnauthorized
			}
			if resp.StatusCode != want {
				t.Errorf("GET %s with token %q: %d, want %d", path, token, resp.StatusCode, want)
			}
		}
	}
}

func TestAPIBeyondLoopbackNeedsAToken(t *testing.T) {
	for _, tc := range []struct {
		o     ControllerOptions
		fails bool
	}{
		{ControllerOptions{APIListen: "127.0.0.1:18001"}, false},
		{ControllerOptions{APIListen: "[::1]:18001"}, false},
		{ControllerOptions{APIListen: "0.0.0.0:18001"}, true},
		{ControllerOptions{APIListen: "10.0.0.5:18001"}, true},
		{ControllerOptions{APIListen: "0.0.0.0:18001", Tokens: api.Tokens{"t": api.ScopeExec}}, false},
		{ControllerOptions{APIListen: "0.0.0.0:18001", Insecure: true}, false},
	} {
		err := checkExposure(quiet(), tc.o)
		if (err != nil) != tc.fails || (err != nil && !strings.Contains(err.Error(), "--token-file")) {
			t.Errorf("%+v: %v", tc.o, err)
		}
	}
}

func TestAgentStatusBeyondLoopbackNeedsAToken(t *testing.T) {
	err := RunAgent(context.Background(), quiet(), AgentOptions{StatusListen: "0.0.0.0:0"})
	if err == nil || !strings.Contains(err.Error(), "--status-token-file") {
		t.Fatalf("a status listener beyond loopback without a token: %v", err)
	}
}

// TestDaemonsRefuseTwoListenersOnOneAddress: an agent given one address for
// its status listener and its Envoy's mesh listener once started its status
// listener and then took its own port for another daemon's; a controller
// given one for its API and xDS failed on an unnamed bind. Both refuse,
// before anything starts, naming both flags.
func TestDaemonsRefuseTwoListenersOnOneAddress(t *testing.T) {
	var o AgentOptions
	o.StatusListen, o.Inbound = "127.0.0.1:44769", "127.0.0.2:21000"
	o.Envoy.Bootstrap.Node = wire.ProxyNode{ID: "n1", PublicAddress: "127.0.0.2", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 44769}
	err := RunAgent(context.Background(), quiet(), o)
	if err == nil || err.Error() != "--metrics-listen 127.0.0.1:44769 and --mesh 127.0.0.1:44769 are the same address: give each listener its own port" {
		t.Errorf("agent: %v", err)
	}
	o.Envoy.Bootstrap.Node.MeshPort, o.Inbound = 15001, "0.0.0.0:8080"
	if err := RunAgent(context.Background(), quiet(), o); err == nil || !strings.Contains(err.Error(), "--public 127.0.0.2:8080 and --inbound 0.0.0.0:8080") {
		t.Errorf("agent: %v", err)
	}
	err = RunController(context.Background(), quiet(), ControllerOptions{APIListen: "127.0.0.1:18001", XDSListen: "127.0.0.1:18001", ConsulPrefix: "servemesh", ID: "c"})
	if err == nil || !strings.Contains(err.Error(), "--xds-listen 127.0.0.1:18001 and --api-listen 127.0.0.1:18001 are the same address") {
		t.Errorf("controller: %v", err)
	}
}

// TestFilePlaneRefusesWhatItCannotRun: a served file whose backend names a
// command (no agent runs it) or a Consul service (no catalog is read) is
// refused with the fix, not served as a backend with no replica.
func TestFilePlaneRefusesWhatItCannotRun(t *testing.T) {
	for name, backend := range map[string]string{
		"process":  `{name: a, process: {command: /srv/model}}`,
		"external": `{name: a, external: {service: legacy}}`,
	} {
		path := filepath.Join(t.TempDir(), "mesh.yaml")
		if err := os.WriteFile(path, []byte("backends: ["+backend+"]\nendpoints: [{name: e, route: /e, traffic: {a: 1}}]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := StartFilePlane(context.Background(), quiet(), FilePlaneOptions{ConfigPath: path, XDSListen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0"})
		if err == nil || !strings.Contains(err.Error(), `backend "a".`+name+": servemesh serve") || !strings.Contains(err.Error(), "servemesh apply -f") {
			t.Errorf("%s: %v; want it refused, naming the field and the fix", name, err)
		}
	}
}

// TestFilePlaneRefusesRollouts: nothing judges a rollout in file mode, so
// a file that declares one is refused rather than served as if it moved.
func TestFilePlaneRefusesRollouts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(path, []byte(`backends: [{name: a, replicas: [{address: "127.0.0.1:9001"}]}, {name: b, replicas: [{address: "127.0.0.1:9002"}]}]
endpoints: [{name: e, route: /e, traffic: {a: 1}, rollout: {candidate: b, steps: [{weight: 1, duration_s: 60}]}}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := StartFilePlane(context.Background(), quiet(), FilePlaneOptions{ConfigPath: path, XDSListen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), `endpoint "e".rollout: servemesh serve judges no rollout`) {
		t.Fatalf("%v; want the rollout refused, naming the field and the fix", err)
	}
}

func TestMeshListenerOfANode(t *testing.T) {
	for _, tc := range []struct {
		node wire.ProxyNode
		want string
	}{
		{wire.ProxyNode{MeshAddress: "127.0.0.1", MeshPort: 15001}, "127.0.0.1:15001"},
		{wire.ProxyNode{MeshAddress: "0.0.0.0", MeshPort: 15001}, "127.0.0.1:15001"},
		{wire.ProxyNode{MeshAddress: "::", MeshPort: 15001}, "[::1]:15001"},
		{wire.ProxyNode{MeshAddress: "10.0.0.4", MeshPort: 15002}, "10.0.0.4:15002"},
		{wire.ProxyNode{}, ""},
	} {
		if got := meshListener(tc.node); got != tc.want {
			t.Errorf("meshListener(%s:%d) = %q; want %q", tc.node.MeshAddress, tc.node.MeshPort, got, tc.want)
		}
	}
}

// TestATokenlessAgentServesNoLogs: an agent whose status listener takes no
// token (on loopback) refuses every log, which any user of the host, a
// replica included, read there before (issue 58, M1); behind a token it
// serves them.
func TestATokenlessAgentServesNoLogs(t *testing.T) {
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "envoy.log"), []byte("envoy's log\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	get := func(h http.Handler) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequestWithContext(t.Context(), http.MethodGet, wire.LogsPath+"?envoy=true&tail=5", nil))
		return w
	}
	o := AgentOptions{Plaintext: true}
	o.Envoy.WorkDir = work
	if w := get(statusLogs(o)); w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "--status-token-file") {
		t.Fatalf("a tokenless agent's logs: %d %q; want 403 naming --status-token-file", w.Code, w.Body.String())
	}
	o.StatusToken = "status-secret"
	if w := get(statusLogs(o)); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "envoy's log") {
		t.Fatalf("an agent with a status token: %d %q; want Envoy's log", w.Code, w.Body.String())
	}
}

// TestAnMTLSAgentServesLogsToTheControllerAlone: with mTLS the status
// token reads the metrics (Prometheus) and the load, never a log; the
// controller, known by its certificate, reads everything (issue 58, M2).
func TestAnMTLSAgentServesLogsToTheControllerAlone(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	fromController := func(r *http.Request) bool { return r.Header.Get("X-Test-Controller") == "yes" }
	h := statusAccess("status-secret", fromController, ok)
	for _, c := range []struct {
		path, token string
		controller  bool
		want        int
	}{
		{wire.LogsPath, "", true, http.StatusOK},
		{wire.LogsPath, "status-secret", false, http.StatusForbidden},
		{wire.LogsPath, "", false, http.StatusForbidden},
		{"/metrics", "status-secret", false, http.StatusOK},
		{"/metrics", "", false, http.StatusUnauthorized},
		{wire.LoadPath, "status-secret", false, http.StatusOK},
		{wire.LoadPath, "", true, http.StatusOK},
	} {
		r := httptest.NewRequestWithContext(t.Context(), http.MethodGet, c.path, nil)
		if c.token != "" {
			r.Header.Set("Authorization", "Bearer "+c.token)
		}
		if c.controller {
			r.Header.Set("X-Test-Controller", "yes")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s, token %q, from the controller %v: %d; want %d", c.path, c.token, c.controller, w.Code, c.want)
		}
	}
}
