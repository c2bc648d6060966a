//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/server"
)

var (
	servemeshBin string // built by TestMain
	envoyBin     string
)

func TestMain(m *testing.M) {
	var err error
	envoyBin, err = envoy.Find("")
	if err == nil {
		_, err = envoy.CheckVersion(context.Background(), envoyBin)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: the real Envoy is required and was not usable: %v\nrun `make tools` (or `make test`, which does)\n", err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "servemesh-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Agents run replicas as nobody: the binary must be theirs to run.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	servemeshBin = filepath.Join(dir, "servemesh")
	args := []string{"build", "-o", servemeshBin}
	if os.Getenv("SERVEMESH_E2E_RACE") == "1" {
		args = append(args, "-race") // then any race report in a child's output fails its test
	}
	build := exec.CommandContext(context.Background(), "go", append(args, "../cmd/servemesh")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: build servemesh: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if left := leftRunning(dir); len(left) > 0 {
		// Nodes leave their Envoy and replicas serving when their agent
		// stops; every test must remove what its nodes left.
		fmt.Fprintf(os.Stderr, "e2e: processes of the tests' nodes left running after the tests (killed now):\n  %s\n", strings.Join(left, "\n  "))
		code = 1
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// leftRunning kills, and describes, the processes still running whose
// command line names a program in dir (the tests' servemesh binary: Envoys'
// parents, replicas), after giving them a few seconds to end.
func leftRunning(dir string) []string {
	find := func() map[int]string {
		out := map[int]string{}
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err == nil && bytes.Contains(cmdline, []byte(dir+"/")) {
				out[pid] = strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")
			}
		}
		return out
	}
	left := find()
	for deadline := time.Now().Add(5 * time.Second); len(left) > 0 && time.Now().Before(deadline); left = find() {
		time.Sleep(100 * time.Millisecond)
	}
	var out []string
	for pid, cmd := range left {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		out = append(out, fmt.Sprintf("%d: %s", pid, cmd))
	}
	slices.Sort(out)
	return out
}

// freeAddr returns a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := proc.FreeAddr(context.Background(), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// replicaSet is a group of demo replicas of one backend, served in-process.
type replicaSet struct {
	backend  string
	replicas []*demoreplica.Replica
	addrs    []string
}

func startReplicas(t *testing.T, backend string, n int) *replicaSet {
	t.Helper()
	rs := &replicaSet{backend: backend}
	for i := range n {
		var lc net.ListenConfig
		lis, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r := &demoreplica.Replica{Backend: backend, Name: fmt.Sprintf("%s#%d", backend, i)}
		srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(func() { _ = srv.Close() })
		rs.replicas = append(rs.replicas, r)
		rs.addrs = append(rs.addrs, lis.Addr().String())
	}
	return rs
}

func (rs *replicaSet) served() int64 {
	var n int64
	for _, r := range rs.replicas {
		n += r.Served()
	}
	return n
}

func (rs *replicaSet) backendModel() meshspec.Backend {
	b := meshspec.Backend{Name: rs.backend}
	for _, a := range rs.addrs {
		b.Replicas = append(b.Replicas, meshspec.Replica{Address: a})
	}
	return b
}

func writeModel(t *testing.T, path string, m *meshspec.Model) {
	t.Helper()
	out, err := meshspec.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, out)
}

// writeFile replaces path atomically, as editors save.
func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// controlPlane is a `servemesh serve` subprocess.
type controlPlane struct {
	t          *testing.T
	configPath string
	xdsAddr    string
	httpAddr   string
	child      *proc.Process
	stderr     *testutil.SyncBuffer
}

func startControlPlane(t *testing.T, configPath string) *controlPlane {
	t.Helper()
	cp := &controlPlane{t: t, configPath: configPath, xdsAddr: freeAddr(t), httpAddr: freeAddr(t)}
	cp.start()
	return cp
}

func (cp *controlPlane) start() {
	t := cp.t
	t.Helper()
	cp.stderr = &testutil.SyncBuffer{}
	child, err := proc.Start(proc.Spec{Path: servemeshBin, Args: []string{"serve", "--config", cp.configPath,
		"--xds-listen", cp.xdsAddr, "--http-listen", cp.httpAddr}, Stderr: cp.stderr})
	if err != nil {
		t.Fatal(err)
	}
	cp.child = child
	t.Cleanup(func() {
		_ = child.Kill()
		failOnRace(t, "control plane", cp.stderr.String())
		if t.Failed() {
			t.Logf("control plane log:\n%s", cp.stderr.String())
		}
	})
	testutil.WaitFor(t, 10*time.Second, "control plane /healthz", func() bool {
		r := do(http.DefaultClient, http.MethodGet, "http://"+cp.httpAddr+"/healthz", "")
		return r.err == nil && r.status == http.StatusOK
	})
}

// kill stops the control plane with SIGKILL, as a crash would.
func (cp *controlPlane) kill() {
	_ = cp.child.Kill()
}

// waitInSync waits until every node has ACKed model generation gen.
func (cp *controlPlane) waitInSync(gen uint64) {
	cp.t.Helper()
	testutil.WaitFor(cp.t, 15*time.Second, fmt.Sprintf("nodes in sync at generation %d", gen), func() bool {
		nodes := nodesOf(cp.httpAddr)
		if len(nodes) == 0 {
			return false
		}
		for _, n := range nodes {
			if !n.InSync || n.Generation != gen {
				return false
			}
		}
		return true
	})
}

// node is a real Envoy bootstrapped to a control plane.
type node struct {
	public, mesh string
	proc         *envoy.Process
}

func startEnvoy(t *testing.T, id, xdsAddr string, protocol bootstrap.Protocol) *node {
	t.Helper()
	return startEnvoyWithPublic(t, id, xdsAddr, protocol, freeAddr(t))
}

// startEnvoyWithPublic starts an Envoy whose public listener uses public.
func startEnvoyWithPublic(t *testing.T, id, xdsAddr string, protocol bootstrap.Protocol, public string) *node {
	t.Helper()
	n := &node{public: public, mesh: freeAddr(t)}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := envoy.Launcher{Binary: envoyBin, WorkDir: dir, LogLevel: "info", Concurrency: 1, Drain: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Bootstrap: bootstrap.Options{
			Node:       wire.ProxyNode{ID: id, PublicAddress: "127.0.0.1", PublicPort: testutil.Port(n.public), MeshAddress: "127.0.0.1", MeshPort: testutil.Port(n.mesh)},
			XDSAddress: xdsAddr, Protocol: protocol,
		}}.StartReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Stop(context.Background(), 0)
		if t.Failed() {
			t.Logf("envoy %s log tail:\n%s", id, proc.LogTail(filepath.Join(dir, "envoy.log"), 4096))
			t.Logf("envoy %s, requests that did not get a 200 (up to 40):\n%s", id, failedRequests(dir, 40))
		}
	})
	n.proc = p
	return n
}

// result is one request's outcome.
type result struct {
	status  int
	backend string
	allow   string
	err     error
	body    string // the start of the body of an error answer
}

// String says what the result was, its error's text included.
func (r result) String() string {
	if r.err != nil {
		return fmt.Sprintf("error %q", r.err.Error())
	}
	return fmt.Sprintf("status %d from %q: %q", r.status, r.backend, r.body)
}

func do(client *http.Client, method, url, host string) result {
	req, err := http.NewRequestWithContext(context.Background(), method, url, nil)
	if err != nil {
		return result{err: err}
	}
	if host != "" {
		req.Host = host
	}
	return doRequest(client, req)
}

// doRequest sends req and reads its result.
func doRequest(client *http.Client, req *http.Request) result {
	resp, err := client.Do(req)
	if err != nil {
		return result{err: err}
	}
	var body string
	if resp.StatusCode >= 400 { // who answered, and why: Envoy's own answers say so

		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		body = string(b)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return result{status: resp.StatusCode, backend: resp.Header.Get(demoreplica.BackendHeader), allow: resp.Header.Get("Allow"), body: body}
}

// sendMany sends n GETs over a few keep-alive connections and counts the
// answering backends; any error or non-200 fails the test.
func sendMany(t *testing.T, url string, n int) map[string]int {
	t.Helper()
	const workers = 8
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	jobs := make(chan struct{}, n)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	var failures []string
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 10 * time.Second}
			for range jobs {
				r := do(client, http.MethodGet, url, "")
				mu.Lock()
				if r.err != nil || r.status != http.StatusOK {
					failures = append(failures, fmt.Sprintf("status %d err %v", r.status, r.err))
				} else {
					counts[r.backend]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed, first: %s", len(failures), n, failures[0])
	}
	return counts
}

// checkShare fails unless got is within 5 standard deviations of a binomial
// draw of n trials with probability p.
func checkShare(t *testing.T, what string, got, n int, p float64) {
	t.Helper()
	mean := float64(n) * p
	sigma := math.Sqrt(float64(n) * p * (1 - p))
	if math.Abs(float64(got)-mean) > 5*sigma+1e-9 {
		t.Errorf("%s: %d of %d, want %.0f ± %.0f (p=%.2f, 5 sigma)", what, got, n, mean, 5*sigma, p)
	} else {
		t.Logf("%s: %d of %d (expected %.0f ± %.0f)", what, got, n, mean, 5*sigma)
	}
}

// failOnRace fails the test if a servemesh process built with -race
// reported a data race.
func failOnRace(t *testing.T, who, output string) {
	t.Helper()
	if i := strings.Index(output, "WARNING: DATA RACE"); i >= 0 {
		t.Errorf("%s reported a data race:\n%s", who, output[i:min(len(output), i+4000)])
	}
}

// readNodes reads the xDS node status of a controller (or of a
// standalone control plane) at addr.
func readNodes(addr string) ([]server.NodeStatus, error) {
	r, err := http.Get("http://" + addr + "/v1/xds/nodes") //nolint:noctx // test helper
	if err != nil {
		return nil, err
	}
	defer func() { _ = r.Body.Close() }()
	if r.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/xds/nodes: %s", r.Status)
	}
	var out []server.NodeStatus
	return out, json.NewDecoder(r.Body).Decode(&out)
}

// nodesOf is readNodes for a condition polled until it holds: an error
// reads as no node.
func nodesOf(addr string) []server.NodeStatus {
	nodes, _ := readNodes(addr)
	return nodes
}

// mustNodes is readNodes for an assertion: an error, or no node at all,
// fails t, so a check over the nodes never passes by checking none.
func mustNodes(t *testing.T, addr string) []server.NodeStatus {
	t.Helper()
	nodes, err := readNodes(addr)
	if err != nil || len(nodes) == 0 {
		t.Fatalf("reading the xDS node status at %s: %d nodes, err %v", addr, len(nodes), err)
	}
	return nodes
}

func waitNodeInSync(t *testing.T, apiAddr string) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "the node to be in sync with "+apiAddr, func() bool {
		nodes := nodesOf(apiAddr)
		return len(nodes) == 1 && nodes[0].Connected && nodes[0].InSync
	})
}

// passThrough lets replicas, which the agents run as nobody, pass through
// a test's work folder to their own folders below it: a test's temporary
// folders are 0700.
func passThrough(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func freeAddrOn(t *testing.T, host string) string {
	t.Helper()
	addr, err := proc.FreeAddr(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// replicaOf reads which replica answered a request.
func replicaOf(client *http.Client, url string) (string, error) {
	resp, err := client.Get(url) //nolint:noctx // test helper
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	var body struct {
		Replica string `json:"replica"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", err
	}
	return body.Replica, nil
}

// envoyStat reads one stat from an Envoy's admin API; a stat Envoy does
// not have fails the test, so no check passes by its absence.
func envoyStat(t *testing.T, admin, name string) float64 {
	t.Helper()
	v, ok := readEnvoyStat(admin, name)
	if !ok {
		t.Fatalf("Envoy at %s has no stat %s", admin, name)
	}
	return v
}

func readEnvoyStat(admin, name string) (float64, bool) {
	body, err := envoy.Admin{Socket: admin}.Get(context.Background(), "/stats?filter="+url.QueryEscape("^"+regexp.QuoteMeta(name)+"$"))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+": "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

func httpClient() *http.Client { return &http.Client{Timeout: 5 * time.Second} }

// twoNodeMesh is what the data-path tests run on: a controller and two
// nodes in the default mode (mTLS), n1 on 127.0.0.2 and n2 on 127.0.0.3,
// each offering 4 CPUs, so that requests cross the inbound hop.
type twoNodeMesh struct {
	consul *testutil.Consul
	ctl    *ctlProc
	n1, n2 *mtlsNode
	c      *api.Client
}

// startTwoNodeMesh starts a mesh whose controller is name and whose nodes
// are name-n1 and name-n2.
func startTwoNodeMesh(t *testing.T, name string) *twoNodeMesh {
	t.Helper()
	return startTwoNodeMeshWith(t, name, nil, nil)
}

// startTwoNodeMeshWith is startTwoNodeMesh with more controller arguments
// (say, --token-file: then m.c sends that token), agent arguments and
// controller environment variables.
func startTwoNodeMeshWith(t *testing.T, name string, ctlArgs, agentArgs []string, ctlEnv ...string) *twoNodeMesh {
	t.Helper()
	m := &twoNodeMesh{consul: startConsul(t)}
	m.ctl = startController(t, m.consul, name, ctlArgs, ctlEnv...)
	m.ctl.waitLeading(20 * time.Second)
	m.n1 = startMTLSNode(t, m.consul, name+"-n1", "127.0.0.2", m.ctl.xdsAddr, agentArgs...)
	m.n2 = startMTLSNode(t, m.consul, name+"-n2", "127.0.0.3", m.ctl.xdsAddr, agentArgs...)
	m.c = m.ctl.client(readFileOr(t, m.ctl.tokenFile()))
	return m
}

// waitNodesServe waits until every node's Envoy has accepted the state as
// it is now (a change just made), replicas ready or not: that the nodes
// have a route, once guessed with a sleep.
func waitNodesServe(t *testing.T, c *api.Client) {
	t.Helper()
	var last api.ServedReport
	var err error
	if testutil.Until(30*time.Second, func() bool {
		last, err = c.Served(context.Background(), api.ServedQuery{})
		return err == nil && last.Served
	}) != nil {
		t.Fatalf("the nodes do not serve the state: %+v, %v", last, err)
	}
}

// replicaPids finds the demo replicas of backend on the mesh's nodes.
func (m *twoNodeMesh) replicaPids(backend string) []int {
	return replicaPids(backend, m.n1.workDir, m.n2.workDir)
}

// createBackends creates bs, each once the nodes can place it.
func (m *twoNodeMesh) createBackends(t *testing.T, bs ...meshspec.Backend) {
	t.Helper()
	for _, b := range bs {
		var last error
		defer func() {
			if t.Failed() && last != nil {
				t.Logf("the last refusal of backend %s: %v", b.Name, last)
			}
		}()
		testutil.WaitFor(t, 20*time.Second, "backend "+b.Name+" to be placed", func() bool {
			_, last = m.c.CreateBackend(context.Background(), meshspec.BackendSpecOf(b))
			return last == nil
		})
	}
}

// demoProcess runs demo replicas of backend, probed on their health path,
// or with the gRPC health service when they serve gRPC.
func demoProcess(backend string, grpc bool) *meshspec.ProcessSpec {
	if grpc {
		return &meshspec.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--grpc", "--backend", backend, "--listen", "${HOST}:${PORT}"}}
	}
	return &meshspec.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--backend", backend, "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}
}

// waitReplicasAnswer waits until n replicas answer within tries requests
// to url, sent n at a time: a load-aware backend's picker sends requests
// one after another to the same idle replica (the policy's tie goes to
// the first), so only requests in flight together show every replica.
func waitReplicasAnswer(t *testing.T, what, url string, n, tries int) []string {
	t.Helper()
	var seen map[string]bool
	// Replicas start one by one, each a process its agent starts and
	// probes: each new one that answers is progress (a machine loaded by
	// a race build starts five in more than 30 s), none for 30 s is not.
	testutil.WaitForProgress(t, 30*time.Second, 3*time.Minute, what, func() (bool, int) {
		seen = map[string]bool{}
		var mu sync.Mutex
		for sent := 0; sent < tries; sent += n {
			var batch sync.WaitGroup
			for range n {
				batch.Go(func() {
					if r, err := replicaOf(httpClient(), url); err == nil {
						mu.Lock()
						seen[r] = true
						mu.Unlock()
					}
				})
			}
			batch.Wait()
		}
		return len(seen) == n, len(seen)
	})
	return meshspec.SortedKeys(seen)
}

// accessLog is node n's access log so far, a map per line.
func accessLog(t *testing.T, n *mtlsNode) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(n.admin)), wire.AccessLogFile))
	if err != nil {
		t.Fatalf("node %s's access log: %v", n.id, err)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("node %s's access log has a line that is not JSON: %q: %v", n.id, line, err)
		}
		out = append(out, e)
	}
	return out
}

// doJSON sends req and decodes its answer, which must be 200, into out.
func doJSON(req *http.Request, out any) error {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s %s: status %d: %s", req.Method, req.URL, resp.StatusCode, body)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// checkSplitAndMirror sends n requests to url, which enters at node's
// Envoy, and checks that split's share of them is answered by split's
// backend, that none is answered by shadow, and that shadow's share of
// them was mirrored to it (counted by node's Envoy, which sends each copy
// through its cluster of shadow).
func checkSplitAndMirror(t *testing.T, node *mtlsNode, url string, n int, split string, splitShare float64, shadow string, shadowShare float64) {
	t.Helper()
	before := mirroredTo(node, shadow)
	counts := sendMany(t, url, n)
	checkShare(t, fmt.Sprintf("requests on %s", split), counts[split], n, splitShare)
	if counts[shadow] != 0 {
		t.Fatalf("%d answers came from the shadow %s, whose answers are dropped", counts[shadow], shadow)
	}
	checkShare(t, fmt.Sprintf("requests mirrored to %s", shadow), int(waitMirrored(t, node, shadow, before)-before), n, shadowShare)
}

// mirroredTo is how many requests node's Envoy has sent through its
// cluster of shadow (0 before the first).
func mirroredTo(node *mtlsNode, shadow string) float64 {
	v, _ := readEnvoyStat(node.admin, "cluster."+shadow+".upstream_rq_total")
	return v
}

// waitMirrored waits until node's count of requests sent to shadow is
// past before and holds still (mirrored copies are sent after their
// answers), and returns it.
func waitMirrored(t *testing.T, node *mtlsNode, shadow string, before float64) float64 {
	t.Helper()
	var last float64
	testutil.WaitFor(t, 10*time.Second, "the mirrored requests to be counted", func() bool {
		cur := mirroredTo(node, shadow)
		settled := cur == last && cur > before
		last = cur
		return settled
	})
	return last
}
