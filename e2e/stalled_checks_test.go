//go:build e2e

package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
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
	t.Parallel()
	mesh := startTwoNodeMesh(t, "stall")
	consul, n1, n2 := mesh.consul, mesh.n1, mesh.n2
	mesh.createBackends(t, meshspec.Backend{Name: "p", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3}, // one per node: each offers 4 CPUs
		Process: demoProcess("p", false)})
	if _, err := mesh.c.CreateEndpoint(context.Background(), meshspec.Endpoint{Name: "p", Route: "/p", Traffic: map[string]float64{"p": 1}}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + n1.public + "/p"
	waitReplicasAnswer(t, "both replicas of p to answer through stall-n1", url, 2, 20)

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
