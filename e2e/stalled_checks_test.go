package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// TestStalledChecksLoseNoRequest stalls what keeps the replicas' TTL checks
// alive, under load through the mesh in the default mode, across the
// inbound hop: first every agent (SIGSTOP; their Envoys and replicas run
// on), then Consul, each for longer than the TTL. Each time every replica's
// check expires, though every replica answers: their health is then
// unknown, not unhealthy, and the data plane keeps calling them. No request
// fails.
func TestStalledChecksLoseNoRequest(t *testing.T) {
	consul := startConsul(t)
	ctl := startController(t, consul, "stall", nil)
	ctl.waitLeading(20 * time.Second)
	n1 := startMTLSNode(t, consul, "stall-n1", "127.0.0.2", ctl.xdsAddr)
	n2 := startMTLSNode(t, consul, "stall-n2", "127.0.0.3", ctl.xdsAddr)
	c := ctl.client("")
	ctx := context.Background()
	b := model.Backend{Name: "p", Config: model.BackendConfig{NumReplicas: 2, CPUs: 3}, // one per node: each offers 4 CPUs
		Process: &model.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--backend", "p", "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
	testutil.WaitFor(t, 20*time.Second, "backend p to be placed", func() bool { _, err := c.CreateBackend(ctx, model.BackendSpecOf(b)); return err == nil })
	if _, err := c.CreateEndpoint(ctx, model.Endpoint{Name: "p", Route: "/p", Traffic: map[string]float64{"p": 1}}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + n1.public + "/p"
	testutil.WaitFor(t, 30*time.Second, "both replicas of p to answer through stall-n1", func() bool {
		seen := map[string]bool{}
		for range 20 {
			if pid, err := replicaOf(httpClient(), url); err == nil {
				seen[pid] = true
			}
		}
		return len(seen) == 2
	})

	load := startLoad(url, 2)
	time.Sleep(time.Second)
	// Every agent stalls: Consul expires every replica's check.
	for _, n := range []*mtlsNode{n1, n2} {
		_ = syscall.Kill(n.child.Pid(), syscall.SIGSTOP) // the agent alone: its Envoy and replicas have their own process groups
	}
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "every replica's check to expire", func() bool {
		checks, _, err := client.Health().Checks(wire.BackendService("p"), nil)
		expired := 0
		for _, c := range checks {
			if strings.HasPrefix(c.Output, "TTL expired") {
				expired++
			}
		}
		return err == nil && len(checks) == 2 && expired == 2
	})
	time.Sleep(2 * time.Second) // the data plane follows
	for _, n := range []*mtlsNode{n1, n2} {
		_ = syscall.Kill(n.child.Pid(), syscall.SIGCONT)
	}
	time.Sleep(3 * time.Second)

	// Consul stalls: when it resumes, the checks expire before the agents'
	// beats, queued meanwhile, reach it.
	_ = syscall.Kill(consul.Pid(), syscall.SIGSTOP)
	time.Sleep(5 * time.Second) // the TTL is 3 s, and agents beat every second
	_ = syscall.Kill(consul.Pid(), syscall.SIGCONT)
	time.Sleep(5 * time.Second)
	load.finish(t)
	if log := consul.LogTail(); !strings.Contains(log, "Check missed TTL, is now critical: check=replica-p-") {
		t.Fatalf("no replica's TTL check expired while Consul was stopped; Consul's log:\n%s", log)
	}
}
