//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/servemesh/servemesh/dev/devconsul"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// Bounds the Consul-cluster test states and checks.
const (
	// leaderLossBound: after the Consul leader server is killed, the
	// controller accepts writes again within this (Raft elects a new
	// leader in seconds; the controller keeps or retakes its lock).
	leaderLossBound = 30 * time.Second
	// clientRestartBound: after a node's Consul client agent restarts, its
	// replicas are ready again in the catalog within this.
	clientRestartBound = 60 * time.Second
)

// TestConsulCluster runs servemesh as production does: three Consul
// servers (Raft, data on disk, the Connect CA) and a Consul client agent
// for the controller and for each node, on loopback addresses, ACLs on with
// default deny and each daemon's own token, in the default mode (mTLS).
// Under a steady load through both nodes and a stream of writes, the
// leader server is killed with SIGKILL: every write the API acknowledged
// is there afterwards and none that was not attempted is, the mesh serves
// with no failed request, and the controller takes writes again within
// leaderLossBound. Then a node's client agent is killed and restarted: no
// request fails, and its replicas are ready again within
// clientRestartBound.
func TestConsulCluster(t *testing.T) {
	t.Parallel()
	const token = "root-token-for-the-cluster-test"
	nodes := map[string]string{"cc-1": "127.0.0.2", "cc-2": "127.0.0.3"}
	const ctlAddr = "127.0.0.4"
	cluster, err := devconsul.StartCluster(t.TempDir(), devconsul.ClusterOptions{
		ServerAddrs: []string{"127.0.0.10", "127.0.0.11", "127.0.0.12"}, ClientAddrs: []string{"127.0.0.2", "127.0.0.3", ctlAddr},
		ManagementToken: token})
	if err != nil {
		t.Fatalf("the real Consul is required: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, s := range cluster.Servers {
				t.Logf("consul server %s log tail:\n%s", s.HTTPAddr, s.LogTail())
			}
		}
		cluster.Stop()
	})
	// The test's own view of Consul: the controller's client agent (a
	// server it asked may be the one killed).
	admin, err := cluster.Clients[ctlAddr].Client()
	if err != nil {
		t.Fatal(err)
	}
	ctlToken := controllerToken(t, admin, devconsul.ClientNodeName(ctlAddr))
	ctl := startController(t, cluster.Clients[ctlAddr], "cc-ctl", []string{"--insecure-consul=false"}, "CONSUL_HTTP_TOKEN="+ctlToken)
	ctl.waitLeading(30 * time.Second)
	var agents []*agentProc
	for _, id := range []string{"cc-1", "cc-2"} {
		addr := nodes[id]
		agents = append(agents, startAgentArgs(t, cluster.Clients[addr], id, addr, ctl.xdsAddr, 4,
			[]string{"--insecure-consul=false"}, "CONSUL_HTTP_TOKEN="+nodeTokenOn(t, admin, devconsul.ClientNodeName(addr), id)))
	}
	c := ctl.client("")
	ctx := context.Background()
	b := meshspec.Backend{Name: "cc", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3}, Process: demoProcess("cc", false)}
	testutil.WaitFor(t, 30*time.Second, "both nodes to register and the backend to be placed", func() bool {
		_, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(b))
		return err == nil
	})
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "cc", Route: "/cc", Traffic: map[string]float64{"cc": 1}}); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		waitReplicasAnswer(t, "both replicas to answer through "+a.id, "http://"+a.public+"/cc", 2, 40)
	}
	var events []event
	load := startLoad("http://"+agents[0].public+"/cc", 2)
	runLoad(load, http.MethodGet, "http://"+agents[1].public+"/cc", 2)

	t.Run("the Consul leader server is killed under writes and traffic", func(t *testing.T) {
		w := startWrites(c)
		time.Sleep(2 * time.Second)
		leader, err := cluster.Leader()
		if err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		leader.Stop()
		events = append(events, event{at: killed, what: "Consul leader server killed"})
		t.Logf("killed the Consul leader server %s", leader.HTTPAddr)
		testutil.WaitFor(t, leaderLossBound, "the controller to take a write after the leader server's loss", func() bool {
			_, err := c.CreateBackend(ctx, meshspec.BackendSpec{Name: "after-leader-loss"})
			return err == nil
		})
		back := time.Since(killed)
		time.Sleep(2 * time.Second)
		acked, tried := w.stop()
		t.Logf("the controller took writes again %s after the kill; %d writes acknowledged of %d tried", back.Round(time.Millisecond), len(acked), len(tried))
		if len(acked) < 5 {
			t.Fatalf("only %d writes were acknowledged: the write stream did not run", len(acked))
		}
		stored, err := c.ListBackends(ctx)
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for _, b := range stored {
			have[b.Name] = true
		}
		for _, name := range acked {
			if !have[name] {
				t.Errorf("acknowledged write %s is lost", name)
			}
		}
		for name := range have {
			if name != "cc" && name != "after-leader-loss" && !slices.Contains(tried, name) {
				t.Errorf("backend %s is stored but was never written", name)
			}
		}
	})

	t.Run("a node's Consul client agent is killed and restarted under traffic", func(t *testing.T) {
		client := cluster.Clients[nodes["cc-2"]]
		client.Stop()
		events = append(events, event{at: time.Now(), what: "cc-2's Consul client agent killed"})
		// The servers find the agent gone (its serfHealth check turns
		// critical, and with it every check on its node).
		consulNode := devconsul.ClientNodeName(nodes["cc-2"])
		testutil.WaitFor(t, 60*time.Second, "the servers to see "+consulNode+" fail", func() bool {
			checks, _, err := admin.Health().Node(consulNode, nil)
			if err != nil {
				return false
			}
			for _, ch := range checks {
				if ch.CheckID == "serfHealth" {
					return ch.Status == "critical"
				}
			}
			return false
		})
		// The controller follows: cc-2's replica is no longer ready (its
		// node's checks failed), and the traffic goes on (checked below).
		testutil.WaitFor(t, 10*time.Second, "the status to count one replica ready", func() bool {
			bs, _, err := backendStatus(ctx, c, "cc")
			return err == nil && bs.Ready == 1
		})
		events = append(events, event{at: time.Now(), what: "cc-2's Consul client agent restarting"})
		if err := client.Restart(clientRestartBound); err != nil {
			t.Fatal(err)
		}
		restarted := time.Now()
		testutil.WaitFor(t, clientRestartBound, "both replicas to be ready again", func() bool {
			bs, _, err := backendStatus(ctx, c, "cc")
			return err == nil && bs.Ready == 2
		})
		t.Logf("both replicas ready %s after the client agent restarted", time.Since(restarted).Round(time.Millisecond))
		waitReplicasAnswer(t, "both replicas to answer through cc-1 again", "http://"+agents[0].public+"/cc", 2, 40)
	})
	for _, f := range load.recorded() {
		t.Logf("failed at %s: %s", f.at.Format(time.TimeOnly+".000"), f.what)
	}
	for _, e := range events {
		t.Logf("%s: %s", e.at.Format(time.TimeOnly+".000"), e.what)
	}
	load.finish(t)
}

// writes is a stream of writes through the API, each creating a backend
// of its own, and what became of them.
type writes struct {
	mu           sync.Mutex
	acked, tried []string
	done         chan struct{}
	wg           sync.WaitGroup
}

func startWrites(c interface {
	CreateBackend(context.Context, meshspec.BackendSpec) (bool, error)
}) *writes {
	w := &writes{done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for i := 0; ; i++ {
			select {
			case <-w.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			name := fmt.Sprintf("w-%d", i)
			w.mu.Lock()
			w.tried = append(w.tried, name)
			w.mu.Unlock()
			if _, err := c.CreateBackend(context.Background(), meshspec.BackendSpec{Name: name}); err == nil {
				w.mu.Lock()
				w.acked = append(w.acked, name)
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *writes) stop() (acked, tried []string) {
	close(w.done)
	w.wg.Wait()
	return w.acked, w.tried
}
