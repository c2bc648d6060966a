//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// Bounds of the node-loss test.
const (
	lossNodes  = 20
	lossKilled = 5
	// routingBound: after the kill, the entry node's Envoy routes to no
	// killed node within this: the agents' TTL (3 s) and a publish.
	routingBound = 10 * time.Second
	// replaceBound: the killed nodes' replicas run elsewhere within this:
	// --replace-after (5 s here), a placement, a start.
	replaceBound = 30 * time.Second
)

// TestNodeLossAtScale runs 20 real agents (each with its Envoy, in the
// default mode, mTLS) on loopback addresses and a backend with a replica on
// every node; under load through the first node (GETs, and POSTs, which
// are not retried once they reached a replica), five nodes are killed at
// once (each agent with its Envoy and its replica). The entry node stops
// routing to them within routingBound, their replicas are placed and run
// elsewhere within replaceBound, and the only failed requests are POSTs
// that were in flight on the killed nodes (counted).
//
// Runs alone: its 20 Envoys hold about 100 of the 128 inotify instances
// the kernel lets one user hold by default (fs.inotify.max_user_instances;
// each Envoy takes five), and beside other tests' Envoys every Envoy that
// then starts aborts on its first file watch ("assert failure:
// inotify_fd_ >= 0", the cause its node's agent logs).
func TestNodeLossAtScale(t *testing.T) {
	consul := startConsul(t)
	ctl := startController(t, consul, "loss", []string{"--replace-after", "5s"})
	ctl.waitLeading(20 * time.Second)
	agents := make([]*agentProc, lossNodes)
	for i := range agents {
		agents[i] = startAgentArgs(t, consul, fmt.Sprintf("loss-%02d", i+1), fmt.Sprintf("127.0.0.%d", i+2), ctl.xdsAddr, 2, nil)
	}
	c, ctx := ctl.client(""), context.Background()
	b := meshspec.Backend{Name: "wide", Config: meshspec.BackendConfig{NumReplicas: lossNodes, CPUs: 1}, Process: demoProcess("wide", false)}
	testutil.WaitFor(t, 30*time.Second, "the backend to be placed on every node", func() bool {
		_, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(b))
		return err == nil
	})
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "wide", Route: "/wide", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"wide": 1}}); err != nil {
		t.Fatal(err)
	}
	entry := agents[0]
	killedAddrs := map[string]bool{}
	for _, a := range agents[lossNodes-lossKilled:] {
		killedAddrs[a.address] = true
	}
	// routedTo counts the hosts of wide the entry node's Envoy routes to
	// (healthy ones), and those of them on killed nodes.
	routedTo := func() (all, killed int) {
		out, err := envoy.Admin{Socket: entry.admin}.Get(ctx, "/clusters")
		if err != nil {
			return -1, -1
		}
		for _, line := range strings.Split(string(out), "\n") {
			parts := strings.Split(line, "::")
			if len(parts) != 4 || parts[0] != "wide" || parts[2] != "health_flags" || parts[3] != "healthy" {
				continue
			}
			all++
			if host, _, err := net.SplitHostPort(parts[1]); err == nil && killedAddrs[host] {
				killed++
			}
		}
		return all, killed
	}
	testutil.WaitFor(t, 60*time.Second, "every node's replica to be ready in the entry node's Envoy", func() bool {
		all, _ := routedTo()
		return all == lossNodes // the other nodes by their inbound listeners, its own replica on loopback
	})
	gets := startLoad("http://"+entry.public+"/wide", 3)
	posts := startLoadMethod(http.MethodPost, "http://"+entry.public+"/wide", 1)
	time.Sleep(2 * time.Second)

	killed := time.Now()
	for _, a := range agents[lossNodes-lossKilled:] {
		a.killNode(t) // the agent, its Envoy and its replica, as a power loss would
	}
	testutil.WaitFor(t, routingBound, "the entry node's Envoy to stop routing to the killed nodes", func() bool {
		all, killed := routedTo()
		return all > 0 && killed == 0
	})
	stopped := time.Since(killed)
	var last string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last seen: %s", last)
		}
	})
	testutil.WaitFor(t, replaceBound, "the killed nodes' replicas to run elsewhere", func() bool {
		bs, problems, err := backendStatus(ctx, c, "wide")
		all, killed := routedTo()
		last = fmt.Sprintf("ready %d, running %d, draining %d, hosts routed to %d (%d on killed nodes), problems %v, err %v",
			bs.Ready, bs.Running, bs.Draining, all, killed, problems, err)
		return err == nil && bs.Ready == lossNodes && bs.Running == lossNodes && killed == 0
	})
	replaced := time.Since(killed)
	time.Sleep(2 * time.Second)
	gets.finish(t)
	posts.finishAllowingReached(t, true)
	t.Logf("%d of %d nodes killed at once: routing stopped after %s, their replicas ran elsewhere after %s; %d POSTs in flight on them failed",
		lossKilled, lossNodes, stopped.Round(time.Millisecond), replaced.Round(time.Millisecond), posts.reached.Load())
	for _, p := range placements(t, c, "wide") {
		for _, a := range agents[lossNodes-lossKilled:] {
			if p.Node == a.id && p.State == meshspec.Running {
				t.Errorf("replica %s still placed on killed node %s", p.Tag, a.id)
			}
		}
	}
}
