//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestHAFailover runs two controllers on one Consul and kills the leader
// with SIGKILL under a stream of writes and reads. The follower must take
// over, no accepted write may be lost, reads keep working on the follower,
// and Envoy (bootstrapped to both) serves with zero failed requests.
func TestHAFailover(t *testing.T) {
	t.Parallel()
	consul, a, b := startLeaderAndFollower(t, "ctl")
	ctx := context.Background()

	x := startReplicas(t, "x", 2)
	both := api.NewClient(a.apiAddr+","+b.apiAddr, "")
	if _, err := both.Apply(ctx, meshspec.SpecOf(&meshspec.Model{
		Backends:  []meshspec.Backend{x.backendModel()},
		Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"x": 1}}},
	}), api.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	n := startEnvoy(t, "ha-node", a.xdsAddr+","+b.xdsAddr, bootstrap.ProtocolSotW)
	testutil.WaitFor(t, 10*time.Second, "Envoy to serve /svc", func() bool {
		return do(httpClient(), "GET", "http://"+n.public+"/svc", "").status == 200
	})
	traffic := startLoad("http://"+n.public+"/svc", 4)

	// Writes: create backends w0, w1, ... through a client that knows both
	// controllers, and c0, c1, ... through the CLI given both (as
	// SERVEMESH_SERVER=a,b). Each must succeed at its first call: a write
	// that reached no leader is sent again until the takeover is done.
	var accepted, cliAccepted []string
	var writeErrs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("w%d", i)
			if _, err := both.CreateBackend(ctx, meshspec.BackendSpec{Name: name}); err != nil {
				writeErrs.Add(1)
				t.Errorf("write %s failed during the failover: %v", name, err)
				return
			}
			accepted = append(accepted, name)
		}
	}()
	go func() {
		defer wg.Done()
		env := []string{"SERVEMESH_SERVER=" + a.apiAddr + "," + b.apiAddr}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("c%d", i)
			if code, out, errOut := cli(t, env, "backend", "create", name, "--replica", x.addrs[0]); code != 0 {
				writeErrs.Add(1)
				t.Errorf("servemesh backend create %s failed during the failover: exit %d %s%s", name, code, out, errOut)
				return
			}
			cliAccepted = append(cliAccepted, name)
		}
	}()
	// Reads from the follower keep working throughout.
	var reads, readErrs atomic.Int64
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := b.client("").ListBackends(ctx); err != nil {
				readErrs.Add(1)
			}
			reads.Add(1)
			time.Sleep(10 * time.Millisecond)
		}
	}()

	time.Sleep(time.Second)
	killed := time.Now()
	a.kill()
	testutil.WaitFor(t, 30*time.Second, "ctl-b to lead", func() bool {
		info, err := b.client("").Leader(ctx)
		return err == nil && info.Leading
	})
	takeover := time.Since(killed)
	testutil.WaitFor(t, 30*time.Second, "a write to be accepted after the takeover", func() bool {
		_, err := b.client("").CreateBackend(ctx, meshspec.BackendSpec{Name: "after-takeover"})
		return err == nil
	})
	writable := time.Since(killed)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	traffic.finish(t)
	t.Logf("leader killed: ctl-b leads after %s, accepts writes after %s; %d client and %d CLI writes accepted, %d failed; %d reads on the follower, %d failed",
		takeover.Round(time.Millisecond), writable.Round(time.Millisecond), len(accepted), len(cliAccepted), writeErrs.Load(), reads.Load(), readErrs.Load())
	if readErrs.Load() != 0 {
		t.Fatalf("%d reads from the follower failed", readErrs.Load())
	}
	if len(accepted) < 10 || len(cliAccepted) < 1 { // a CLI call is a process start: few, under -race
		t.Fatalf("only %d client and %d CLI writes were accepted; the write streams did not run", len(accepted), len(cliAccepted))
	}

	// No accepted write is lost: every one is in Consul and in the new leader's answers.
	consulClient, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	stored, _, err := store.NewConsul(consulClient, "servemesh", slog.New(slog.DiscardHandler)).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	backends, err := b.client("").ListBackends(ctx)
	if err != nil {
		t.Fatal(err)
	}
	has := func(list []meshspec.Backend, name string) bool {
		for _, x := range list {
			if x.Name == name {
				return true
			}
		}
		return false
	}
	for _, name := range append(append(accepted, cliAccepted...), "after-takeover") {
		if !has(stored.Backends, name) || !has(backends, name) {
			t.Fatalf("accepted write %s is lost (in Consul: %v, from the leader: %v)", name, has(stored.Backends, name), has(backends, name))
		}
	}
	// Envoy follows the new leader's xDS.
	waitNodeInSync(t, b.apiAddr)
}

// TestStatusListsTheNodesOfEveryController: with two controllers, a node
// whose Envoy holds its stream to the follower alone is unknown to the
// leader, which answers status; `servemesh status` given both controllers
// lists it as connected, to the follower (issue 62, 4: status in HA
// listed only the answering controller's nodes).
func TestStatusListsTheNodesOfEveryController(t *testing.T) {
	t.Parallel()
	_, a, b := startLeaderAndFollower(t, "st")
	ctx := context.Background()
	startEnvoy(t, "st-node", b.xdsAddr, bootstrap.ProtocolDelta)
	testutil.WaitFor(t, 20*time.Second, "the node to connect to st-b", func() bool {
		nodes := api.NewClient(b.apiAddr, "").NodesOfEach(ctx)
		return nodes[0].Err == nil && len(nodes[0].Nodes) == 1 && nodes[0].Nodes[0].Connected
	})
	line := regexp.MustCompile(`(?m)^st-node\s+true \(to ` + regexp.QuoteMeta(b.apiAddr) + `\)`)
	code, out, errOut := cli(t, []string{"SERVEMESH_SERVER=" + a.apiAddr + "," + b.apiAddr}, "status")
	if code != 0 || !line.MatchString(out) {
		t.Fatalf("status given both controllers: exit %d\n%s%s\nwant st-node connected to %s", code, out, errOut, b.apiAddr)
	}
}

// startLeaderAndFollower starts a Consul and two plaintext controllers on
// it, prefix-a leading and prefix-b following it.
func startLeaderAndFollower(t *testing.T, prefix string) (consul *testutil.Consul, a, b *ctlProc) {
	t.Helper()
	consul = startConsul(t)
	a = startController(t, consul, prefix+"-a", []string{"--plaintext"})
	a.waitLeading(20 * time.Second)
	b = startController(t, consul, prefix+"-b", []string{"--plaintext"})
	testutil.WaitFor(t, 10*time.Second, prefix+"-b to follow "+prefix+"-a", func() bool {
		info, err := b.client("").Leader(context.Background())
		return err == nil && !info.Leading && info.Leader == a.apiAddr
	})
	return consul, a, b
}
