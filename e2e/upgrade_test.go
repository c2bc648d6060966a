//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// previousRelease is the commit of servemesh's previous release, the
// newest RELEASES names, upgraded from and downgraded to. (v0.1.0's agents
// already leave their Envoy and replicas serving when they stop, and it
// announces no version: protocol 1, which this release's controllers
// serve.)
func previousRelease(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../RELEASES")
	if err != nil {
		t.Fatalf("the releases file: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && !strings.HasPrefix(f[0], "#") {
			return f[1]
		}
	}
	t.Fatal("RELEASES names no release")
	return ""
}

// buildRelease builds servemesh at commit from this clone's history (git
// archive, then go build), once: the binary is kept in .tools/releases.
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, ".tools", "releases", "servemesh-"+commit)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("the previous release's commit %s is not in this clone's history (a shallow clone? git fetch --unshallow): %v: %s", commit, err, out)
	}
	src := t.TempDir()
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v: %s", commit, err, out)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", bin+".tmp", "./cmd/servemesh")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build servemesh %s: %v: %s", commit, err, out)
	}
	if err := os.Rename(bin+".tmp", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// upgradeMesh is the mesh the upgrade tests move between releases: two
// controllers and three nodes in the default mode, a split with a shadow
// under steady load, and a writer changing the split all along.
type upgradeMesh struct {
	consul *testutil.Consul
	ctls   []*ctlProc
	nodes  []*agentProc
	c      *api.Client
	pids   map[string]int // replica address -> pid, when the mesh came up
}

func startUpgradeMesh(t *testing.T, bin string) *upgradeMesh {
	t.Helper()
	consul := startConsul(t)
	m := &upgradeMesh{consul: consul}
	for _, id := range []string{"up-c1", "up-c2"} {
		c := &ctlProc{t: t, id: id, apiAddr: freeAddr(t), xdsAddr: freeAddr(t), bin: bin,
			args: []string{"--replace-after", "30s", "--drain-grace", "1s"}, env: []string{"CONSUL_HTTP_ADDR=" + consul.HTTPAddr}}
		c.start()
		t.Cleanup(func() {
			c.kill()
			if t.Failed() {
				t.Logf("controller %s log:\n%s%s", c.id, strings.Join(c.logs, ""), c.stderr.String())
			}
		})
		m.ctls = append(m.ctls, c)
	}
	m.ctls[0].waitLeading(20 * time.Second)
	xds := m.ctls[0].xdsAddr + "," + m.ctls[1].xdsAddr
	for i, addr := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		dir := t.TempDir()
		m.nodes = append(m.nodes, startAgentBin(t, consul, bin, fmt.Sprintf("up-n%d", i+1), addr, xds, 4,
			[]string{"--inbound", freeAddrOn(t, addr), "--work-dir", dir}))
	}
	m.c = api.NewClient(m.ctls[0].apiAddr+","+m.ctls[1].apiAddr, "")
	m.c.FailoverWait = 30 * time.Second
	ctx := context.Background()
	for _, b := range []meshspec.Backend{
		{Name: "up-a", Config: meshspec.BackendConfig{NumReplicas: 3, CPUs: 1}, Process: demoProcess("up-a", false)},
		{Name: "up-b", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1}, Process: demoProcess("up-b", false)},
	} {
		testutil.WaitFor(t, 20*time.Second, "backend "+b.Name+" to be placed", func() bool {
			_, err := m.c.CreateBackend(ctx, meshspec.BackendSpecOf(b))
			return err == nil
		})
	}
	if _, err := m.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "up", Route: "/up", Traffic: map[string]float64{"up-a": 0.7, "up-b": 0.3},
		Shadows: map[string]float64{"up-b": 0.5}}); err != nil {
		t.Fatal(err)
	}
	waitReplicasAnswer(t, "the five replicas to answer through n1", "http://"+m.nodes[0].public+"/up", 5, 60)
	m.pids = m.replicaPids(t)
	if len(m.pids) != 5 {
		t.Fatalf("replica processes %v, want 5", m.pids)
	}
	return m
}

// replicaPids finds, from Consul's catalog, the process listening at each
// replica's address.
func (m *upgradeMesh) replicaPids(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	client, err := m.consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"up-a", "up-b"} {
		entries, _, err := client.Health().Service(wire.BackendService(b), "", false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			addr := e.Service.Address + ":" + strconv.Itoa(e.Service.Port)
			out[e.Service.Meta[wire.MetaReplicaNode]+"/"+addr] = testutil.PidListening(addr)
		}
	}
	return out
}

// samePids fails t unless every replica runs in the process it ran in
// when the mesh came up: none was restarted.
func (m *upgradeMesh) samePids(t *testing.T) {
	t.Helper()
	now := m.replicaPids(t)
	for addr, pid := range m.pids {
		if now[addr] != pid || pid == 0 {
			t.Errorf("the replica at %s was pid %d, now %d: restarted", addr, pid, now[addr])
		}
	}
	if len(now) != len(m.pids) {
		t.Errorf("replicas %v, at the start %v", now, m.pids)
	}
}

// writer changes the split every 200 ms through both controllers, and
// remembers the last split a controller acknowledged.
type writer struct {
	stop      chan struct{}
	done      sync.WaitGroup
	acked     atomic.Int64
	refused   atomic.Int64
	mu        sync.Mutex
	lastAcked map[string]float64
}

func startWriter(c *api.Client) *writer {
	w := &writer{stop: make(chan struct{})}
	w.done.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			a := 0.5 + float64(i%5)/10
			split := map[string]float64{"up-a": a, "up-b": 1 - a}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, err := c.SetTraffic(ctx, "up", split)
			cancel()
			if err != nil {
				w.refused.Add(1)
				continue
			}
			w.acked.Add(1)
			w.mu.Lock()
			w.lastAcked = split
			w.mu.Unlock()
		}
	})
	return w
}

// finish stops the writer and checks that the stored split is the last
// one acknowledged.
func (w *writer) finish(t *testing.T, c *api.Client) {
	t.Helper()
	close(w.stop)
	w.done.Wait()
	e, err := c.GetEndpoint(context.Background(), "up")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("writes: %d acknowledged, %d not (while a controller restarted)", w.acked.Load(), w.refused.Load())
	if w.acked.Load() == 0 {
		t.Fatal("no write was acknowledged")
	}
	for b, weight := range w.lastAcked {
		if e.Traffic[b] != weight {
			t.Fatalf("stored split %v, the last acknowledged %v: an acknowledged write was lost", e.Traffic, w.lastAcked)
		}
	}
}

// replaceAgent stops a node's agent and starts bin's in its place, with
// the same arguments, waiting until it adopted what the last one left.
func replaceAgent(t *testing.T, n *agentProc, bin string, replicas int) {
	t.Helper()
	n.bin = bin
	restartAgent(t, n, false, replicas, nil)
}

// replicasOn counts the replicas placed on each node.
func (m *upgradeMesh) replicasOn(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, b := range []string{"up-a", "up-b"} {
		for _, p := range placements(t, m.c, b) {
			out[p.Node]++
		}
	}
	return out
}

// TestRollingUpgradeAndDowngrade: a mesh of the previous release (two
// controllers, three nodes, mTLS) under steady load through a split and
// shadow, with a writer changing the split throughout, is upgraded in
// place: the controllers one by one, then the agents one by one (each
// adopting its node's replicas and hot restarting its Envoy, whose node
// metadata now carries a version), answers streaming through two nodes
// all the while and ending whole. No request fails, no replica restarts,
// every acknowledged write is stored, and status shows every node and the
// controller on this release. Then the agents are downgraded back one by
// one, with the same guarantees.
func TestRollingUpgradeAndDowngrade(t *testing.T) {
	t.Parallel()
	old := buildRelease(t, previousRelease(t))
	m := startUpgradeMesh(t, old)
	on := m.replicasOn(t)
	url := "http://" + m.nodes[0].public + "/up"

	t.Run("upgrade: controllers, then agents, one by one", func(t *testing.T) {
		refuseNewerAgent(t, m, m.ctls[0].xdsAddr)
		l := startLoad(url, 4)
		w := startWriter(m.c)
		for _, c := range m.ctls {
			if err := c.child.Stop(15 * time.Second); err != nil {
				t.Fatalf("controller %s: %v", c.id, err)
			}
			c.bin = ""
			c.start()
			time.Sleep(2 * time.Second) // let it take part before the next goes
		}
		// Answers stream through two nodes while every agent is upgraded
		// (each hot restarting its Envoy): they end whole (issue 59).
		streams, _ := openLongStreams(t, []string{m.nodes[0].public, m.nodes[1].public}, "/up")
		for _, n := range m.nodes {
			replaceAgent(t, n, "", on[n.id])
			time.Sleep(time.Second)
			if log := n.stderr.String(); !strings.Contains(log, `msg="envoy hot restarting"`) || !strings.Contains(log, "changed=bootstrap") {
				t.Errorf("agent %s did not hot restart its envoy for its new bootstrap (its node metadata names the release):\n%s", n.id, log)
			}
		}
		time.Sleep(2 * time.Second)
		w.finish(t, m.c)
		l.finish(t)
		wantWhole(t, streams)
		m.samePids(t)
		for _, c := range m.ctls {
			st, err := c.client("").Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if st.Version != wire.Version || st.Protocol != wire.Protocol {
				t.Errorf("controller %s answers as %s (protocol %d), want this release's %s (%d)", c.id, st.Version, st.Protocol, wire.Version, wire.Protocol)
			}
		}
		m.nodesOn(t, wire.Version, wire.Protocol)
	})
	t.Run("downgrade: agents back to the previous release, one by one", func(t *testing.T) {
		l := startLoad(url, 4)
		w := startWriter(m.c)
		for _, n := range m.nodes {
			replaceAgent(t, n, old, on[n.id])
			time.Sleep(time.Second)
		}
		time.Sleep(2 * time.Second)
		w.finish(t, m.c)
		l.finish(t)
		m.samePids(t)
		m.nodesOn(t, "", wire.UnannouncedProtocol)
	})
}

// refuseNewerAgent starts this release's agent on a fourth node while the
// previous release's controllers lead: it refuses to start, naming the
// policy and the fix.
func refuseNewerAgent(t *testing.T, m *upgradeMesh, xds string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, servemeshBin, "agent", "--insecure-consul", "--node-id", "up-n4", "--address", "127.0.0.5",
		"--inbound", freeAddrOn(t, "127.0.0.5"), "--xds", xds, "--public", freeAddrOn(t, "127.0.0.5"), "--mesh", freeAddr(t), "--work-dir", dir)
	cmd.Env = append(os.Environ(), "CONSUL_HTTP_ADDR="+m.consul.HTTPAddr, "SERVEMESH_ENVOY="+envoyBin)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "an agent may not be newer than its controller; upgrade the controllers first") {
		t.Fatalf("this release's agent against the previous release's controllers: %v\n%s\nwant it refused, naming the fix", err, out)
	}
}

// nodesOn checks that every node announces version and protocol, both in
// the Consul registration of its agent and, in servemesh status, to the
// controller its Envoy is connected to (each controller lists what its own
// xDS streams announced), and that no controller refuses a node or reports
// a problem.
func (m *upgradeMesh) nodesOn(t *testing.T, version string, protocol int) {
	t.Helper()
	client, err := m.consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range m.nodes {
		services, _, err := client.Health().Service(wire.NodeService(n.id), "", false, nil)
		if err != nil || len(services) != 1 {
			t.Fatalf("node %s's registration: %v, %v", n.id, services, err)
		}
		meta := services[0].Service.Meta
		if got, _ := wire.ParseProtocol(meta[wire.MetaProtocol]); got != protocol || meta[wire.MetaVersion] != version {
			t.Errorf("node %s registers version %q protocol %q; want %q, %d", n.id, meta[wire.MetaVersion], meta[wire.MetaProtocol], version, protocol)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "every node connected to a controller, announcing its release", func() bool {
		connected := map[string]bool{}
		for _, c := range m.ctls {
			st, err := c.client("").Status(context.Background())
			if err != nil || len(st.Problems) != 0 {
				return false
			}
			for _, n := range st.Nodes {
				if n.Connected && n.Version == version && n.Protocol == protocol && n.Skew == "" {
					connected[n.ID] = true
				}
			}
		}
		return len(connected) == len(m.nodes)
	})
}
