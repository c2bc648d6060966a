package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/internal/testutil"
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
func TestNodeLossAtScale(t *testing.T) {
	consul := startConsul(t)
	ctl := startController(t, consul, "loss", []string{"--replace-after", "5s"})
	ctl.waitLeading(20 * time.Second)
	agents := make([]*agentProc, lossNodes)
	for i := range agents {
		agents[i] = startAgentArgs(t, consul, fmt.Sprintf("loss-%02d", i+1), fmt.Sprintf("127.0.0.%d", i+2), ctl.xdsAddr, 2, nil)
	}
	c, ctx := ctl.client(""), context.Background()
	b := model.Backend{Name: "wide", Config: model.BackendConfig{NumReplicas: lossNodes, CPUs: 1}, Process: demoProcess("wide", false)}
	testutil.WaitFor(t, 30*time.Second, "the backend to be placed on every node", func() bool {
		_, err := c.CreateBackend(ctx, model.BackendSpecOf(b))
		return err == nil
	})
	if _, err := c.CreateEndpoint(ctx, model.Endpoint{Name: "wide", Route: "/wide", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"wide": 1}}); err != nil {
		t.Fatal(err)
	}
	entry := agents[0]
	healthy := func() float64 { return envoyStat(t, entry.admin, "cluster.wide.membership_healthy") }
	testutil.WaitFor(t, 60*time.Second, "every node's replica to be ready in the entry node's Envoy", func() bool {
		return healthy() == lossNodes
	})
	gets := startLoad("http://"+entry.public+"/wide", 3)
	posts := startLoadMethod(http.MethodPost, "http://"+entry.public+"/wide", 1)
	time.Sleep(2 * time.Second)

	killed := time.Now()
	for _, a := range agents[lossNodes-lossKilled:] {
		_ = a.child.Kill() // the agent's process group: its Envoy and its replica die with it
	}
	testutil.WaitFor(t, routingBound, "the entry node's Envoy to stop routing to the killed nodes", func() bool {
		return healthy() == lossNodes-lossKilled
	})
	stopped := time.Since(killed)
	testutil.WaitFor(t, replaceBound, "the killed nodes' replicas to run elsewhere", func() bool {
		bs, _, err := backendStatus(ctx, c, "wide")
		return err == nil && bs.Ready == lossNodes && bs.Running == lossNodes && healthy() == lossNodes-lossKilled
	})
	replaced := time.Since(killed)
	time.Sleep(2 * time.Second)
	gets.finish(t)
	posts.finishAllowingReached(t, true)
	t.Logf("%d of %d nodes killed at once: routing stopped after %s, their replicas ran elsewhere after %s; %d POSTs in flight on them failed",
		lossKilled, lossNodes, stopped.Round(time.Millisecond), replaced.Round(time.Millisecond), posts.reached.Load())
	for _, p := range placements(t, c, "wide") {
		for _, a := range agents[lossNodes-lossKilled:] {
			if p.Node == a.id && p.State == model.Running {
				t.Errorf("replica %s still placed on killed node %s", p.Tag, a.id)
			}
		}
	}
}
