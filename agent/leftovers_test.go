package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/proc"
)

// TestLeftoversOfAKilledAgentAreKilled: a replica that started a process of
// its own is killed as its agent would be by SIGKILL (the replica dies, its
// child lives on); the next incarnation's killLeftovers finds the child by
// its environment and kills it, and leaves another node's alone (and, by
// the agent's work folder, another agent's of the same node id).
func TestLeftoversOfAKilledAgentAreKilled(t *testing.T) {
	dir := t.TempDir()
	start := func(node string) (*proc.Process, int) {
		pidFile := filepath.Join(dir, node)
		p, err := proc.Start(proc.Spec{Path: "/bin/sh", Args: []string{"-c", "sleep 60 & echo $! > " + pidFile + "; wait"},
			Env: append(os.Environ(), "SERVEMESH_NODE="+node, agentMarkVar+"="+agentMark(node, dir), "SERVEMESH_REPLICA_TAG=b#000001")})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if b, err := os.ReadFile(pidFile); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					return p, pid
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("the replica's child did not start")
		return nil, 0
	}
	replica, child := start("leftover-node")
	other, otherChild := start("another-node")
	defer func() { _ = other.Kill(); _ = syscall.Kill(otherChild, syscall.SIGKILL) }()
	_ = syscall.Kill(replica.Pid(), syscall.SIGKILL) // the replica alone dies, as by Pdeathsig
	_ = replica.Wait()
	if syscall.Kill(child, 0) != nil {
		t.Fatal("the replica's child did not outlive it; the test shows nothing")
	}
	killed := killLeftovers("leftover-node", dir, nil)
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(child, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if syscall.Kill(child, 0) == nil {
		t.Fatalf("the leftover %d survives (killed %v)", child, killed)
	}
	if syscall.Kill(otherChild, 0) != nil {
		t.Fatal("another node's replica was killed")
	}
}
