//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// mtlsNode is a node of the mTLS mesh: its agent, inbound listener and
// secrets folder.
type mtlsNode struct {
	*agentProc
	inbound, secrets string
}

func startMTLSNode(t *testing.T, consul *testutil.Consul, id, address, xds string, extraArgs ...string) *mtlsNode {
	t.Helper()
	dir := t.TempDir()
	n := &mtlsNode{inbound: freeAddrOn(t, address), secrets: filepath.Join(dir, "secrets")}
	n.agentProc = startAgentArgs(t, consul, id, address, xds, 4, append([]string{"--inbound", n.inbound, "--work-dir", dir}, extraArgs...))
	return n
}

// inboundClient calls an inbound listener as a node would: with bundle's
// leaf (none if nil), asking for sni, and checking that the server shows
// identity wantID, signed by roots.
func inboundClient(bundle *connect.Bundle, roots *x509.CertPool, sni, wantID string) *http.Client {
	cfg := &tls.Config{ServerName: sni, MinVersion: tls.VersionTLS12,
		InsecureSkipVerify: true, //nolint:gosec // the server's identity is a SPIFFE id, checked below
		VerifyConnection: func(cs tls.ConnectionState) error {
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
				return err
			}
			for _, u := range cs.PeerCertificates[0].URIs {
				if u.String() == wantID {
					return nil
				}
			}
			return fmt.Errorf("server identity %v, want %s", cs.PeerCertificates[0].URIs, wantID)
		}}
	if bundle != nil {
		cfg.Certificates = []tls.Certificate{bundle.Leaf}
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}

// TestMeshMTLS runs three nodes with mTLS (the default): requests that
// cross nodes go Envoy to Envoy over mTLS and reach replicas listening on
// loopback only; split and shadow proportions hold; the inbound listener
// refuses callers without a node's certificate; and a rotation of the CA
// root, which re-signs every leaf, fails no request under load.
func TestMeshMTLS(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "ctl", nil)
	ctl.waitLeading(20 * time.Second)
	var nodes []*mtlsNode
	for i, addr := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		nodes = append(nodes, startMTLSNode(t, consul, fmt.Sprintf("m%d", i+1), addr, ctl.xdsAddr))
	}
	c := ctl.client("")
	ctx := context.Background()
	create := func(name string, replicas int, cpus float64) {
		b := meshspec.Backend{Name: name, Config: meshspec.BackendConfig{NumReplicas: replicas, CPUs: cpus},
			Process: &meshspec.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--backend", name, "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
		testutil.WaitFor(t, 20*time.Second, "backend "+name+" to be placed", func() bool { _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(b)); return err == nil })
	}
	create("a", 3, 3) // one per node: each node offers 4 CPUs
	create("b", 1, 1)
	create("s", 1, 1)
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "ep", Route: "/ep", Traffic: map[string]float64{"a": 0.7, "b": 0.3},
		Shadows: map[string]float64{"s": 0.4}}); err != nil {
		t.Fatal(err)
	}
	epURL := "http://" + nodes[0].public + "/ep"
	testutil.WaitFor(t, 60*time.Second, "node m1 to see every node of a, b and s healthy", func() bool {
		for backend, want := range map[string]float64{"a": 3, "b": 1, "s": 1} {
			if v, ok := readEnvoyStat(nodes[0].admin, "cluster."+backend+".membership_healthy"); !ok || v != want {
				return false
			}
		}
		return do(httpClient(), "GET", epURL, "").status == 200
	})

	t.Run("proportions hold across nodes", func(t *testing.T) {
		defer func() {
			if t.Failed() {
				dumpNodes(t, nodes)
			}
		}()
		before := shadowServed(t, nodes)
		const n = 2000
		counts := sendMany(t, epURL, n)
		checkShare(t, "a (weight 0.7)", counts["a"], n, 0.7)
		// Mirrors are sent asynchronously: wait for the count to settle.
		last := -1.0
		for cur := shadowServed(t, nodes); cur != last; cur = shadowServed(t, nodes) {
			last = cur
			time.Sleep(500 * time.Millisecond)
		}
		checkShare(t, "s (shadow 0.4)", int(shadowServed(t, nodes)-before), n, 0.4)
	})

	t.Run("traffic between nodes is mTLS, to the node's own replica direct", func(t *testing.T) {
		if v := envoyStat(t, nodes[0].admin, "cluster.a.ssl.handshake"); v < 1 {
			t.Fatalf("node m1 made %v TLS handshakes to backend a's nodes", v)
		}
		for _, n := range nodes[1:] {
			if v := envoyStat(t, n.admin, "http.inbound_a.downstream_rq_total"); v < 1 {
				t.Errorf("node %s's inbound listener served %v requests for a; m1 must reach its replica through it", n.id, v)
			}
		}
		// m1's own replica of a is called on loopback without TLS: m1's
		// inbound listener (which other nodes call) served none of m1's
		// requests, though its replica served its third of them.
		if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "only-a", Route: "/only-a", Traffic: map[string]float64{"a": 1}}); err != nil {
			t.Fatal(err)
		}
		url := "http://" + nodes[0].public + "/only-a"
		testutil.WaitFor(t, 15*time.Second, "/only-a to be served", func() bool { return do(httpClient(), "GET", url, "").status == 200 })
		const n = 900
		perReplica := map[string]int{}
		client := httpClient()
		for range n {
			tag, err := replicaOf(client, url)
			if err != nil {
				t.Fatal(err)
			}
			perReplica[tag]++
		}
		if len(perReplica) != 3 {
			t.Fatalf("a's requests from m1 reached replicas %v; want all three", perReplica)
		}
		for tag, got := range perReplica {
			checkShare(t, "replica "+tag+" of a (one of three, local or remote)", got, n, 1.0/3)
		}
		if v := envoyStat(t, nodes[0].admin, "http.inbound_a.downstream_rq_total"); v != 0 {
			t.Errorf("node m1's inbound listener served %v requests for a; m1 must call its own replica directly", v)
		}
		replicasListenOnLoopbackOnly(t, consul, nodes)
	})

	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	bundle := func(service string) *connect.Bundle {
		b, err := connect.Fetch(ctx, client, service)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	node, intruder := bundle(wire.NodeService("probe")), bundle("intruder")
	prefix := identityPrefix(t, node)
	target := "https://" + nodes[1].inbound + "/"

	t.Run("the inbound listener refuses callers without a node's certificate", func(t *testing.T) {
		if r := do(inboundClient(node, node.Roots, wire.BackendSNI("a"), prefix+wire.BackendService("a")), "GET", target, ""); r.status != 200 || r.backend != "a" {
			t.Fatalf("a node's certificate, asking for a: %+v; want a's answer", r)
		}
		for what, cl := range map[string]*http.Client{
			"no certificate":                   inboundClient(nil, node.Roots, wire.BackendSNI("a"), prefix+wire.BackendService("a")),
			"a service's, not a node's":        inboundClient(intruder, node.Roots, wire.BackendSNI("a"), prefix+wire.BackendService("a")),
			"a node's, for a backend not here": inboundClient(node, node.Roots, wire.BackendSNI("nothere"), prefix+wire.BackendService("nothere")),
		} {
			if r := do(cl, "GET", target, ""); r.err == nil {
				t.Errorf("%s: answered %d; want the connection refused", what, r.status)
			}
		}
	})

	t.Run("a CA root rotation fails no request", func(t *testing.T) {
		rotateUnderLoad(t, client, c, epURL, nodes, node, prefix)
	})

	t.Run("after the rotation, the running controller takes a node's new leaf", func(t *testing.T) {
		m3 := nodes[2]
		pid := envoyPid(t, filepath.Dir(m3.secrets))
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The new Envoy's stats start from zero: a TLS handshake with the
		// controller and a listener update are its own, with its new leaf.
		testutil.WaitFor(t, 30*time.Second, "m3's new Envoy to connect with its new leaf and get its config", func() bool {
			now := envoyPid(t, filepath.Dir(m3.secrets))
			hs, ok1 := readEnvoyStat(m3.admin, "cluster._servemesh_xds.ssl.handshake")
			lds, ok2 := readEnvoyStat(m3.admin, "listener_manager.lds.update_success")
			return now != 0 && now != pid && ok1 && ok2 && hs >= 1 && lds >= 1
		})
	})
}

// shadowServed is how many requests the nodes' inbound listeners passed to
// backend s's replicas.
func shadowServed(t *testing.T, nodes []*mtlsNode) float64 {
	t.Helper()
	var sum float64
	for _, n := range nodes {
		if v, ok := readEnvoyStat(n.admin, "cluster._inbound_s.upstream_rq_total"); ok {
			sum += v // only the node running s's replica has the cluster
		}
	}
	return sum
}

// replicasListenOnLoopbackOnly checks that each replica Consul lists is
// reachable on its node's loopback and not on the node's address.
func replicasListenOnLoopbackOnly(t *testing.T, consul *testutil.Consul, nodes []*mtlsNode) {
	t.Helper()
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	address := map[string]string{}
	for _, n := range nodes {
		address[n.id] = n.address
	}
	entries, _, err := client.Health().Service(wire.BackendService("a"), "", false, nil)
	if err != nil || len(entries) != 3 {
		t.Fatalf("replicas of a in Consul: %d, %v", len(entries), err)
	}
	d := &net.Dialer{Timeout: time.Second}
	for _, e := range entries {
		port := strconv.Itoa(e.Service.Port)
		if e.Service.Address != "127.0.0.1" {
			t.Errorf("replica %s is registered at %s; it must listen on loopback", e.Service.ID, e.Service.Address)
		}
		// Tests run side by side on these addresses, so another test's
		// process may hold the node's address at this port: the check is
		// whether this replica answers there, not whether anything does.
		around := "http://" + net.JoinHostPort(address[e.Service.Meta[wire.MetaReplicaNode]], port) + "/"
		if tag, err := replicaOf(&http.Client{Timeout: time.Second}, around); err == nil && tag == e.Service.Meta[wire.MetaReplicaTag] {
			t.Errorf("replica %s answers on its node's address: anyone could reach it around Envoy", e.Service.ID)
		}
		conn, err := d.DialContext(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			t.Errorf("replica %s does not answer on loopback: %v", e.Service.ID, err)
			continue
		}
		_ = conn.Close()
	}
}

func identityPrefix(t *testing.T, b *connect.Bundle) string {
	t.Helper()
	leaf, err := x509.ParseCertificate(b.Leaf.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	prefix, ok := connect.IdentityPrefix(leaf)
	if !ok {
		t.Fatal("the leaf names no SPIFFE id")
	}
	return prefix
}

// rotateUnderLoad gives Consul's CA a new root key under load, waits until
// every node's secrets are re-signed and its inbound listener presents a
// leaf of the new root, checks that the mesh still follows a change (xDS
// with the new leaves), and that no request failed.
func rotateUnderLoad(t *testing.T, client *consulapi.Client, c *api.Client, url string, nodes []*mtlsNode, probe *connect.Bundle, prefix string) {
	t.Helper()
	files := func(n *mtlsNode) map[string][]byte {
		out := map[string][]byte{}
		for _, name := range []string{wire.NodeSecret, wire.RootsSecret, wire.BackendSecret("a")} {
			b, err := os.ReadFile(wire.SecretFile(n.secrets, name))
			if err != nil {
				t.Fatal(err)
			}
			out[name] = b
		}
		return out
	}
	before := make([]map[string][]byte, len(nodes))
	for i, n := range nodes {
		before[i] = files(n)
	}
	oldRoot := activeRootPEM(t, client)
	load := startLoad(url, 4)
	time.Sleep(2 * time.Second)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	conf, _, err := client.Connect().CAGetConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	conf.Config["PrivateKey"] = string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	conf.Config["RootCert"] = ""
	if _, err := client.Connect().CASetConfig(conf, nil); err != nil {
		t.Fatalf("rotating the CA root: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "the CA to make the new root active", func() bool { return activeRootPEM(t, client) != oldRoot })
	newRoot := x509.NewCertPool()
	newRoot.AppendCertsFromPEM([]byte(activeRootPEM(t, client)))
	testutil.WaitFor(t, 90*time.Second, "every node's secrets to be re-signed", func() bool {
		for i, n := range nodes {
			now := files(n)
			for name := range now {
				if bytes.Equal(now[name], before[i][name]) {
					return false
				}
			}
		}
		return true
	})
	for _, n := range nodes {
		testutil.WaitFor(t, 30*time.Second, "node "+n.id+"'s inbound listener to present a leaf of the new root", func() bool {
			r := do(inboundClient(probe, newRoot, wire.BackendSNI("a"), prefix+wire.BackendService("a")), "GET", "https://"+n.inbound+"/", "")
			return r.status == 200
		})
	}
	time.Sleep(3 * time.Second) // more load on the new leaves
	if _, err := c.SetTraffic(context.Background(), "ep", map[string]float64{"a": 1}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the nodes to follow a change after the rotation", func() bool {
		counts := sendMany(t, url, 50)
		return counts["a"] == 50
	})
	load.finish(t)
}

// envoyPid is the pid of the Envoy whose bootstrap is in dir.
func envoyPid(t *testing.T, dir string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, path := range procs {
		cmdline, err := os.ReadFile(path)
		if err == nil && bytes.Contains(cmdline, []byte(filepath.Join(dir, "bootstrap.yaml"))) {
			pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			if err == nil {
				return pid
			}
		}
	}
	return 0
}

// activeRootPEM is the CA's active root.
func activeRootPEM(t *testing.T, client *consulapi.Client) string {
	t.Helper()
	roots, _, err := client.Agent().ConnectCARoots(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range roots.Roots {
		if r.Active {
			return r.RootCertPEM
		}
	}
	t.Fatal("the CA has no active root")
	return ""
}

// dumpNodes logs what each node's Envoy says of mTLS, for a failed test.
func dumpNodes(t *testing.T, nodes []*mtlsNode) {
	for _, n := range nodes {
		if b, err := os.ReadFile(filepath.Join(filepath.Dir(n.secrets), "envoy.log")); err == nil {
			var keep []string
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "[warning]") || strings.Contains(line, "[error]") || strings.Contains(line, "inbound") {
					keep = append(keep, line)
				}
			}
			t.Logf("node %s envoy.log:\n%.6000s", n.id, strings.Join(keep, "\n"))
		}
		for _, path := range []string{"/stats?filter=" + url.QueryEscape(`(ssl|inbound|connect_fail|rq_5xx|membership_healthy|cx_none_healthy|no_route|no_cluster|overflow|listener_manager)`), "/listeners"} {
			b, err := envoy.Admin{Socket: n.admin}.Get(context.Background(), path)
			if err != nil {
				continue
			}
			var keep []string
			for _, line := range strings.Split(string(b), "\n") {
				if !strings.HasSuffix(line, ": 0") && !strings.Contains(line, "::zone::") && !strings.Contains(line, "::canary::") &&
					!strings.Contains(line, "::priority::") && !strings.Contains(line, "::weight::") && !strings.Contains(line, "::region::") &&
					!strings.Contains(line, "::sub_zone::") && !strings.Contains(line, "::success_rate") && !strings.Contains(line, "::local_origin") {
					keep = append(keep, line)
				}
			}
			t.Logf("node %s %s:\n%.6000s", n.id, path, strings.Join(keep, "\n"))
		}
	}
}

// TestMTLSControllerWaitsForConsul: a controller started with mTLS before
// Consul answers waits for it (its identity comes from Consul's CA)
// instead of exiting, leads once it is up, and configures a node. (The
// agent waits the same way: agent.TestSecretsWaitForConsul.)
func TestMTLSControllerWaitsForConsul(t *testing.T) {
	t.Parallel()
	notYet := &testutil.Consul{HTTPAddr: testutil.StartConsulLater(t, 3*time.Second)}
	ctl := startController(t, notYet, "ctl", nil)
	ctl.waitLeading(30 * time.Second)
	if !strings.Contains(ctl.stderr.String(), "retrying") {
		t.Fatal("the controller never waited for Consul; the test did not start it first")
	}
	n := startMTLSNode(t, notYet, "late", "127.0.0.2", ctl.xdsAddr)
	testutil.WaitFor(t, 30*time.Second, "the node to get its configuration", func() bool {
		for _, s := range nodesOf(ctl.apiAddr) {
			if s.ID == n.id && s.Connected && s.InSync {
				return true
			}
		}
		return false
	})
}
