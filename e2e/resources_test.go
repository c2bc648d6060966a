//go:build e2e

package e2e

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestGPUsArePlacedAndHandedOut runs two nodes in the default mode, one
// offering two GPUs (declared: no device is needed): replicas asking for a
// GPU go to it only, each gets its own device in CUDA_VISIBLE_DEVICES, a
// third does not fit (and changes nothing), a device freed by a replica
// that stopped is handed out again, and an agent killed and started again
// adopts its replicas, which keep their devices.
func TestGPUsArePlacedAndHandedOut(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "gpus", nil)
	ctl.waitLeading(20 * time.Second)
	gpuDir := t.TempDir()
	gpuArgs := []string{"--resource", "gpu=2", "--work-dir", gpuDir}
	gpuNode := startAgentArgs(t, consul, "gpu-node", "127.0.0.2", ctl.xdsAddr, 4, gpuArgs)
	cpuNode := startAgentArgs(t, consul, "cpu-node", "127.0.0.3", ctl.xdsAddr, 4, nil)
	c := ctl.client("")
	ctx := context.Background()
	testutil.WaitFor(t, 20*time.Second, "llm to be placed", func() bool {
		_, err := c.CreateBackend(ctx, meshspec.BackendSpec{Name: "llm", Process: demoProcess("llm", false),
			Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 0.5, Resources: map[string]int{"gpu": 1}}})
		return err == nil
	})
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "llm", Route: "/llm", Traffic: map[string]float64{"llm": 1}}); err != nil {
		t.Fatal(err)
	}
	// devices lists the GPU of each running replica process of llm, once
	// there are want of them.
	devices := func(want int) []string {
		t.Helper()
		var got []string
		testutil.WaitFor(t, 30*time.Second, "llm's replica processes and their GPUs", func() bool {
			got = nil
			for _, pid := range replicaPids("llm", gpuDir, cpuNode.workDir) {
				env := envOf(pid)
				if env["SERVEMESH_NODE"] != "gpu-node" || env["CUDA_VISIBLE_DEVICES"] == "" || env["CUDA_VISIBLE_DEVICES"] != env["SERVEMESH_GPU_DEVICES"] {
					return false
				}
				got = append(got, env["CUDA_VISIBLE_DEVICES"])
			}
			slices.Sort(got)
			return len(got) == want
		})
		return got
	}
	if got := devices(2); !slices.Equal(got, []string{"0", "1"}) {
		t.Fatalf("two replicas on a node with two GPUs got devices %v; want 0 and 1", got)
	}
	waitReplicasAnswer(t, "both replicas to answer through the node without GPUs", "http://"+cpuNode.public+"/llm", 2, 40)

	three := 3
	_, err := c.UpdateBackend(ctx, "llm", meshspec.BackendConfigPatch{NumReplicas: &three})
	if err == nil || !strings.Contains(err.Error(), "resources") {
		t.Fatalf("a third replica needing a GPU: %v; want refused, naming resources", err)
	}
	if n := len(placements(t, c, "llm")); n != 2 {
		t.Fatalf("the refused scale left %d placements; want 2", n)
	}

	one, two := 1, 2
	if _, err := c.UpdateBackend(ctx, "llm", meshspec.BackendConfigPatch{NumReplicas: &one}); err != nil {
		t.Fatal(err)
	}
	kept := devices(1)
	testutil.WaitFor(t, 30*time.Second, "the drained replica to be gone", func() bool { return len(placements(t, c, "llm")) == 1 })
	if _, err := c.UpdateBackend(ctx, "llm", meshspec.BackendConfigPatch{NumReplicas: &two}); err != nil {
		t.Fatal(err)
	}
	if got := devices(2); !slices.Equal(got, []string{"0", "1"}) {
		t.Fatalf("after scaling 2 -> 1 (keeping GPU %v) -> 2: devices %v; want the freed one handed out again", kept, got)
	}

	old := replicaPids("llm", gpuDir, cpuNode.workDir)
	slices.Sort(old)
	waitRecorded(t, gpuDir, len(old))
	if err := syscall.Kill(gpuNode.child.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	restarted := startAgentArgs(t, consul, "gpu-node", "127.0.0.2", ctl.xdsAddr, 4, gpuArgs)
	testutil.WaitFor(t, 20*time.Second, "the new agent to adopt both replicas", func() bool {
		return strings.Contains(restarted.stderr.String(), "replicas_adopted=2")
	})
	if got := devices(2); !slices.Equal(got, []string{"0", "1"}) {
		t.Fatalf("after the agent restarted: devices %v; want 0 and 1", got)
	}
	now := replicaPids("llm", gpuDir, cpuNode.workDir)
	slices.Sort(now)
	if !slices.Equal(now, old) {
		t.Fatalf("replica processes %v before the agent was killed, %v after it restarted; want the same: they outlive their agent and are adopted", old, now)
	}
	// The adopted replicas hold their devices: a third replica still does
	// not fit, and one scaled away frees its device for the next.
	if _, err := c.UpdateBackend(ctx, "llm", meshspec.BackendConfigPatch{NumReplicas: &three}); err == nil || !strings.Contains(err.Error(), "resources") {
		t.Fatalf("a third replica after the restart: %v; want refused, naming resources", err)
	}
}
