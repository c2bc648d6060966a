package wire

import (
	"reflect"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

func TestParseStat(t *testing.T) {
	for stat, want := range map[string]Stat{
		"cluster.model-v1.upstream_rq_total":          {Backend: "model-v1", Name: StatRequests},
		"cluster.model.v1.upstream_rq_pending_active": {Backend: "model.v1", Name: StatPending},
		"vhost._public.route.model.upstream_rq_5xx":   {Endpoint: "model", Listener: PublicListener, Name: StatErrors},
		"vhost.model.route.model.upstream_rq_total":   {Endpoint: "model", Listener: MeshListener, Name: StatRequests},
		// An endpoint named "public" is served on the mesh listener under a
		// virtual host of its own name: its figures stay the mesh's.
		"vhost.public.route.public.upstream_rq_total":  {Endpoint: "public", Listener: MeshListener, Name: StatRequests},
		"vhost._public.route.public.upstream_rq_total": {Endpoint: "public", Listener: PublicListener, Name: StatRequests},
		// Names with dots, even ".route.", keep their figures.
		"vhost.a.route.b.route.a.route.b.upstream_rq_total": {Endpoint: "a.route.b", Listener: MeshListener, Name: StatRequests},
		"vhost._public.route.a.route.b.upstream_rq_5xx":     {Endpoint: "a.route.b", Listener: PublicListener, Name: StatErrors},
		"vhost.m.v1.route.m.v1.upstream_rq_total":           {Endpoint: "m.v1", Listener: MeshListener, Name: StatRequests},
		// A rate limit's refusals are the node's, over its listeners.
		"servemesh_rate_limit.api.v1.http_local_rate_limit.rate_limited": {Endpoint: "api.v1", Name: StatRateLimited},
	} {
		got, ok := ParseStat(stat)
		if !ok || got != want {
			t.Errorf("ParseStat(%q) = %+v, %v; want %+v", stat, got, ok, want)
		}
	}
	for _, stat := range []string{
		"cluster._servemesh_xds.upstream_rq_total", // the control plane's cluster is no backend
		"cluster.model.upstream_cx_total",
		"cluster..upstream_rq_total",
		"vhost._public.route..upstream_rq_total",
		"http.public.downstream_rq_total",
		"vhost.model.vcluster.other.upstream_rq_total",
		"vhost.a.route.b.upstream_rq_total", // a virtual host is its endpoint's
		"servemesh_rate_limit.api.http_local_rate_limit.ok",
		"servemesh_rate_limit..http_local_rate_limit.rate_limited",
	} {
		if got, ok := ParseStat(stat); ok {
			t.Errorf("ParseStat(%q) = %+v; want no match", stat, got)
		}
	}
}

func TestNewLoad(t *testing.T) {
	at := time.Unix(100, 0)
	latency := make([]uint64, len(LatencyBoundsMs))
	for i := range latency {
		latency[i] = uint64(5 + i)
	}
	l := NewLoad("n1", at, map[string]uint64{
		"cluster.a.upstream_rq_total": 10, "cluster.a.upstream_rq_5xx": 2, "cluster.a.upstream_rq_active": 3,
		"cluster.a.upstream_rq_pending_active": 4, "cluster.g.upstream_rq_total": 9, "cluster.g.grpc.failure": 3, "vhost._public.route.e.upstream_rq_total": 7,
		"vhost.e.route.e.upstream_rq_total": 5, "vhost.e.route.e.upstream_rq_5xx": 1, "server.uptime": 9,
		"servemesh_rate_limit.e.http_local_rate_limit.rate_limited": 6,
	}, map[string][]uint64{
		"cluster.a.upstream_rq_time": latency, "cluster._inbound_a.upstream_rq_time": latency,
		"cluster.b.upstream_rq_time": latency[:3], // not at LatencyBoundsMs: left out
	})
	if l.Node != "n1" || !l.At.Equal(at) {
		t.Fatalf("node %q at %v", l.Node, l.At)
	}
	if got, want := l.Backends["a"], (BackendLoad{Requests: 10, Errors: 2, Active: 3, Pending: 4, Latency: latency}); !reflect.DeepEqual(got, want) || len(l.Backends) != 2 {
		t.Errorf("backends %+v, want a=%+v", l.Backends, want)
	}
	if g := l.Backends["g"]; g.Requests != 9 || g.Errors != 3 {
		t.Errorf("failed gRPC calls are errors: %+v", g)
	}
	if l.RateLimited["e"] != 6 || len(l.RateLimited) != 1 {
		t.Errorf("rate limited %v, want e's 6", l.RateLimited)
	}
	if l.Routes[RouteKey("e", PublicListener)].Requests != 7 || !reflect.DeepEqual(l.Routes[RouteKey("e", MeshListener)], BackendLoad{Requests: 5, Errors: 1}) || len(l.Routes) != 2 {
		t.Errorf("routes %+v", l.Routes)
	}
}

func TestNodeInfoMetaRoundTrip(t *testing.T) {
	n := NodeInfo{ID: "n1", Address: "127.0.0.2", CPUs: 2.5, MemoryMB: 4096, StatusAddr: "127.0.0.2:9000",
		AllowedCommands: []string{"/opt/models/*/serve", "/usr/bin/servemesh"}, Version: "v-test", Protocol: Protocol}
	got, err := NodeInfoFromMeta(n.Address, n.Meta())
	if err != nil || !reflect.DeepEqual(got, n) {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, n)
	}
	// An agent of a release that announced no protocol is protocol 1.
	old := n
	old.Version, old.Protocol = "", 0
	if got, err := NodeInfoFromMeta(n.Address, old.Meta()); err != nil || got.Protocol != UnannouncedProtocol || got.Version != "" {
		t.Fatalf("an unannounced agent read as %+v, %v", got, err)
	}
	for cmd, want := range map[string]bool{"/opt/models/bert/serve": true, "/usr/bin/servemesh": true, "/bin/sh": false, "/opt/models/a/b/serve": false} {
		if got.Allows(cmd) != want {
			t.Errorf("Allows(%q) = %v", cmd, !want)
		}
	}
	if (NodeInfo{}).Allows("/bin/true") {
		t.Error("a node that allows nothing allowed a command")
	}
	if err := CheckAllowedCommands([]string{"relative/path"}); err == nil {
		t.Error("a relative path was accepted")
	}
	if err := CheckAllowedCommands([]string{"/opt/[bad"}); err == nil {
		t.Error("a malformed pattern was accepted")
	}
	for name, meta := range map[string]map[string]string{
		"no id":      {MetaCPUs: "1", MetaMemoryMB: "1"},
		"bad cpus":   {MetaNodeID: "n", MetaCPUs: "many", MetaMemoryMB: "1"},
		"bad memory": {MetaNodeID: "n", MetaCPUs: "1", MetaMemoryMB: ""},
	} {
		if _, err := NodeInfoFromMeta("127.0.0.1", meta); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

func TestProxyNodeMetadataRoundTrip(t *testing.T) {
	n := ProxyNode{ID: "n1", PublicAddress: "0.0.0.0", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001}
	md, err := n.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ProxyNodeFromEnvoy(&core.Node{Id: n.ID, Metadata: md})
	if err != nil || !got.Equal(n) {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, n)
	}
	tls := n
	tls.PublicTLS = "/var/lib/servemesh/n1/public-tls-sds.yaml"
	md, err = tls.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ProxyNodeFromEnvoy(&core.Node{Id: n.ID, Metadata: md}); err != nil || !got.Equal(tls) {
		t.Fatalf("round trip with TLS: %+v, %v", got, err)
	}
	quiet := n
	quiet.NoAccessLog = true
	if md, err = quiet.Metadata(); err != nil {
		t.Fatal(err)
	}
	if got, err := ProxyNodeFromEnvoy(&core.Node{Id: n.ID, Metadata: md}); err != nil || !got.Equal(quiet) {
		t.Fatalf("round trip without an access log: %+v, %v", got, err)
	}
	onDemand := n
	onDemand.ClustersOnDemand = true
	if md, err = onDemand.Metadata(); err != nil {
		t.Fatal(err)
	}
	if got, err := ProxyNodeFromEnvoy(&core.Node{Id: n.ID, Metadata: md}); err != nil || !got.Equal(onDemand) {
		t.Fatalf("round trip with clusters on demand: %+v, %v", got, err)
	}
	meshOnly := ProxyNode{ID: "n2", MeshAddress: "127.0.0.1", MeshPort: 15001}
	if md, err = meshOnly.Metadata(); err != nil {
		t.Fatal(err)
	}
	if _, found := md.GetFields()[MetaPublicPort]; found {
		t.Fatalf("a mesh-only node announces a public port: %v", md)
	}
	if got, err := ProxyNodeFromEnvoy(&core.Node{Id: meshOnly.ID, Metadata: md}); err != nil || !got.Equal(meshOnly) || got.Public() {
		t.Fatalf("round trip of a mesh-only node: %+v, %v", got, err)
	}
	if _, err := ProxyNodeFromEnvoy(&core.Node{Id: "foreign"}); err == nil || !strings.Contains(err.Error(), "servemesh bootstrap") {
		t.Fatalf("got %v, want a node without servemesh metadata refused, pointing at `servemesh bootstrap`", err)
	}
	if _, err := ProxyNodeFromEnvoy(nil); err == nil {
		t.Fatal("a request without a node must be refused")
	}
}

func TestProxyNodeValidate(t *testing.T) {
	for name, n := range map[string]ProxyNode{
		"no id":                   {PublicAddress: "0.0.0.0", PublicPort: 1, MeshAddress: "127.0.0.1", MeshPort: 2},
		"bad ip":                  {ID: "n", PublicAddress: "example.com", PublicPort: 1, MeshAddress: "127.0.0.1", MeshPort: 2},
		"no port":                 {ID: "n", PublicAddress: "0.0.0.0", MeshAddress: "127.0.0.1", MeshPort: 2},
		"same place":              {ID: "n", PublicAddress: "127.0.0.1", PublicPort: 2, MeshAddress: "127.0.0.1", MeshPort: 2},
		"no mesh":                 {ID: "n", PublicAddress: "0.0.0.0", PublicPort: 1},
		"tls, no public listener": {ID: "n", MeshAddress: "127.0.0.1", MeshPort: 2, PublicTLS: "/etc/sds.yaml"},
	} {
		if err := n.Validate(); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

func TestNodeSkew(t *testing.T) {
	for _, c := range []struct {
		protocol int
		want     string
	}{
		{Protocol + 1, "upgrade the controllers first"},
		{MinNodeProtocol - 1, "upgrade the node's agent, one release at a time"},
		{MinNodeProtocol, ""},
		{Protocol, ""},
	} {
		got := NodeSkew("n1", c.protocol, "v-test")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("NodeSkew(protocol %d) = %q, want %q", c.protocol, got, c.want)
		}
	}
	if p, err := ParseProtocol(""); err != nil || p != UnannouncedProtocol {
		t.Errorf(`ParseProtocol("") = %d, %v`, p, err)
	}
	if _, err := ParseProtocol("x"); err == nil {
		t.Error(`ParseProtocol("x") took it`)
	}
}

// PublicRouteKey gives a route the key Envoy reads from a request's path
// (fragment 1 of PublicRouteKeyFormat: the path's first segment, the
// query cut off), so each case is both.
func TestPublicRouteKey(t *testing.T) {
	for path, want := range map[string]string{
		"/":             PublicRootKey,
		"":              PublicRootKey,
		"/?a=1":         PublicRootKey,
		"/api":          "api",
		"/api/v1":       "api",
		"/api?x=1":      "api",
		"/api#f":        "api",
		"/a,b;c/d":      "a,b;c",
		"/api/v1?x=/y/": "api",
	} {
		if got := PublicRouteKey(path); got != want {
			t.Errorf("PublicRouteKey(%q) = %q; want %q", path, got, want)
		}
	}
	if got := PublicRouteName(PublicRouteKey("/api/v2")); got != "public/api" || !IsPublicRouteName(got) || IsPublicRouteName(MeshRouteName("api")) {
		t.Errorf("PublicRouteName = %q, or IsPublicRouteName is wrong", got)
	}
	if got := PublicRouteName(PublicRootKey); got != "public/" {
		t.Errorf("the root's route configuration is %q; want public/", got)
	}
}
