//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// dataPlane is what serves on a node: its Envoy's pid and restart epoch
// (from the agent's record) and, by address, the pid of the process
// listening there for each of its replicas (found from Consul's catalog
// and the processes' command lines, not from the agent's records).
type dataPlane struct {
	envoy, epoch int
	replicas     map[string]int
}

func dataPlaneOf(t *testing.T, m *twoNodeMesh, n *mtlsNode, backends ...string) dataPlane {
	t.Helper()
	var rec struct {
		Process struct{ Pid int } `json:"process"`
		Epoch   int               `json:"epoch"`
	}
	b, err := os.ReadFile(filepath.Join(n.workDir, "envoy-process.json"))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		t.Fatalf("node %s's envoy record: %v", n.id, err)
	}
	d := dataPlane{envoy: rec.Process.Pid, epoch: rec.Epoch, replicas: map[string]int{}}
	client, _ := m.consul.Client()
	for _, backend := range backends {
		entries, _, err := client.Health().Service(wire.BackendService(backend), "", false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Service.Meta[wire.MetaReplicaNode] != n.id {
				continue
			}
			addr := e.Service.Address + ":" + strconv.Itoa(e.Service.Port)
			d.replicas[addr] = testutil.PidListening(addr)
		}
	}
	return d
}

// restartAgent stops n's agent (SIGTERM, or SIGKILL if crash) and starts it
// again with args (its own when nil), waiting until it has adopted want
// replicas and its Envoy is ready.
func restartAgent(t *testing.T, n *agentProc, crash bool, want int, args []string) {
	t.Helper()
	if crash {
		waitRecorded(t, n.workDir, want)
		_ = n.child.Kill()
	} else if err := n.child.Stop(15 * time.Second); err != nil {
		t.Fatalf("agent %s: %v", n.id, err)
	}
	if args != nil {
		n.args = args
	}
	restartStopped(t, n, want)
}

// restartStopped starts n's stopped agent again, waiting until it has
// adopted want replicas and its Envoy is ready.
func restartStopped(t *testing.T, n *agentProc, want int) {
	t.Helper()
	before := len(n.stderr.String())
	n.start(t)
	testutil.WaitFor(t, 30*time.Second, "agent "+n.id+" to adopt its replicas and its envoy to be ready", func() bool {
		log := n.stderr.String()[before:]
		return strings.Contains(log, "replicas_adopted="+strconv.Itoa(want)) && strings.Contains(log, "envoy ready")
	})
}

// waitRecorded waits until the agent working in dir has recorded want
// running replica processes for its next incarnation to adopt
// (agent/adopt.go). An agent killed between starting a replica and
// recording it leaves a process the next one cannot tell from a stray
// (it stops it, and starts the replica afresh), so a test that kills an
// agent and counts what the next adopts waits for this first.
func waitRecorded(t *testing.T, dir string, want int) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, fmt.Sprintf("the agent to record its %d replica processes", want), func() bool {
		files, _ := filepath.Glob(filepath.Join(dir, "replicas", "running", "*.json")) // the agent's replicas' folder
		alive := 0
		for _, f := range files {
			var rec struct {
				Process struct {
					Pid int `json:"pid"`
				} `json:"process"`
			}
			if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &rec) == nil && rec.Process.Pid > 0 && syscall.Kill(rec.Process.Pid, 0) == nil {
				alive++
			}
		}
		return alive == want
	})
}

// TestAgentRestartKeepsTheDataPlane: on the default mesh (mTLS, two nodes)
// under steady load through a split with a shadow, each node's agent is
// stopped and started again, then killed (-9) and started again, then
// started with another Envoy setting: no request fails, no replica
// restarts (the same processes serve throughout), the node's Envoy is
// adopted (the same process) or, for the changed setting, hot restarted
// (a new process at the next epoch). Then a replica whose spec changed
// while its agent was away is replaced.
func TestAgentRestartKeepsTheDataPlane(t *testing.T) {
	t.Parallel()
	m := startTwoNodeMesh(t, "restart")
	ctx := context.Background()
	a := meshspec.Backend{Name: "ra", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1}, Process: demoProcess("ra", false)}
	b := meshspec.Backend{Name: "rb", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1}, Process: demoProcess("rb", false)}
	m.createBackends(t, a, b)
	if _, err := m.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "rs", Route: "/rs", Traffic: map[string]float64{"ra": 0.5, "rb": 0.5},
		Shadows: map[string]float64{"rb": 0.2}}); err != nil {
		t.Fatal(err)
	}
	waitReplicasAnswer(t, "the four replicas to answer through n1", "http://"+m.n1.public+"/rs", 4, 40)
	before := map[string]dataPlane{}
	for _, n := range []*mtlsNode{m.n1, m.n2} {
		before[n.id] = dataPlaneOf(t, m, n, "ra", "rb")
		if len(before[n.id].replicas) != 2 {
			t.Fatalf("node %s runs replicas %v, want 2", n.id, before[n.id].replicas)
		}
	}
	same := func(t *testing.T, n *mtlsNode, sameEnvoy bool) {
		t.Helper()
		now := dataPlaneOf(t, m, n, "ra", "rb")
		for addr, pid := range before[n.id].replicas {
			if now.replicas[addr] != pid || pid == 0 {
				t.Errorf("node %s: the replica at %s was pid %d, now %d: restarted", n.id, addr, pid, now.replicas[addr])
			}
		}
		if len(now.replicas) != len(before[n.id].replicas) {
			t.Errorf("node %s: replicas %v, before %v", n.id, now.replicas, before[n.id].replicas)
		}
		if sameEnvoy && now.envoy != before[n.id].envoy {
			t.Errorf("node %s: envoy was pid %d, now %d: not adopted", n.id, before[n.id].envoy, now.envoy)
		}
		if !sameEnvoy && (now.envoy == before[n.id].envoy || now.epoch != before[n.id].epoch+1 || syscall.Kill(now.envoy, 0) != nil) {
			t.Errorf("node %s: envoy pid %d epoch %d, before pid %d epoch %d: want a hot restart to the next epoch",
				n.id, now.envoy, now.epoch, before[n.id].envoy, before[n.id].epoch)
		}
		before[n.id] = now
	}

	t.Run("stopped and started again, each agent in turn", func(t *testing.T) {
		l := startLoad("http://"+m.n1.public+"/rs", 4)
		for _, n := range []*mtlsNode{m.n1, m.n2} {
			restartAgent(t, n.agentProc, false, 2, nil)
			time.Sleep(time.Second)
			same(t, n, true)
		}
		l.finish(t)
	})
	t.Run("killed and started again", func(t *testing.T) {
		l := startLoad("http://"+m.n1.public+"/rs", 4)
		for _, n := range []*mtlsNode{m.n2, m.n1} {
			restartAgent(t, n.agentProc, true, 2, nil)
			time.Sleep(time.Second)
			same(t, n, true)
		}
		l.finish(t)
	})
	t.Run("started with another envoy setting: envoy is hot restarted", func(t *testing.T) {
		l := startLoad("http://"+m.n1.public+"/rs", 4)
		var old []int
		for _, n := range []*mtlsNode{m.n1, m.n2} {
			old = append(old, before[n.id].envoy)
			restartAgent(t, n.agentProc, false, 2, append(append([]string{}, n.args...), "--envoy-log-level", "warning", "--envoy-upgrade-grace", "1s"))
			same(t, n, false)
		}
		// The old Envoys drain (--drain 2s) and serve what they have open
		// for the upgrade grace (1 s here), then their successors end them.
		testutil.WaitFor(t, 30*time.Second, "the hot-restarted envoys to exit", func() bool {
			for _, pid := range old {
				if _, err := proc.IdentityOf(pid); err == nil {
					return false
				}
			}
			return true
		})
		l.finish(t)
		for _, n := range []*mtlsNode{m.n1, m.n2} {
			if log := n.stderr.String(); !strings.Contains(log, "envoy hot restarting") || !strings.Contains(log, "changed=settings") {
				t.Errorf("agent %s does not say it hot restarted envoy for its settings:\n%s", n.id, log)
			}
		}
	})
	t.Run("a replica whose spec changed while its agent was away is replaced", func(t *testing.T) {
		if err := m.n2.child.Stop(15 * time.Second); err != nil {
			t.Fatal(err)
		}
		// The placement's spec is what the agent checks: rewrite rb's
		// replica on n2 as placed for another spec (what an update of the
		// backend's process leaves until its rollout reaches it).
		recs, _ := filepath.Glob(filepath.Join(m.n2.workDir, "replicas", "running", "rb-*.json"))
		if len(recs) != 1 {
			t.Fatalf("records of rb on n2: %v", recs)
		}
		var rec map[string]any
		raw, _ := os.ReadFile(recs[0])
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		rec["spec"] = "0000000000000000"
		raw, _ = json.Marshal(rec)
		if err := os.WriteFile(recs[0], raw, 0o600); err != nil {
			t.Fatal(err)
		}
		old := before[m.n2.id]
		before := len(m.n2.stderr.String())
		m.n2.start(t)
		testutil.WaitFor(t, 30*time.Second, "n2 to replace the replica of another spec", func() bool {
			return strings.Contains(m.n2.stderr.String()[before:], "an adopted replica runs another spec than its placement's; replacing it")
		})
		waitReplicasAnswer(t, "the four replicas to answer through n1", "http://"+m.n1.public+"/rs", 4, 40)
		now := dataPlaneOf(t, m, m.n2, "ra", "rb")
		changed := 0
		for addr, pid := range old.replicas {
			if now.replicas[addr] != pid {
				changed++
			}
		}
		if changed != 1 || len(now.replicas) != 2 {
			t.Fatalf("n2's replicas were %v, now %v: want rb's alone replaced", old.replicas, now.replicas)
		}
	})
}
