package proc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestStopEndsTheWholeGroup starts a shell that starts a grandchild, then
// stops the shell: the grandchild must be gone too.
func TestStopEndsTheWholeGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "grandchild")
	p, err := Start(Spec{Path: "/bin/sh", Args: []string{"-c", "sleep 60 & echo $! > " + pidFile + "; wait"}})
	if err != nil {
		t.Fatal(err)
	}
	var grandchild int
	deadline := time.Now().Add(5 * time.Second)
	for grandchild == 0 && time.Now().Before(deadline) {
		b, _ := os.ReadFile(pidFile)
		grandchild, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		time.Sleep(10 * time.Millisecond)
	}
	if grandchild == 0 {
		t.Fatal("the grandchild never started")
	}
	_ = p.Stop(2 * time.Second)
	deadline = time.Now().Add(5 * time.Second)
	for alive(grandchild) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(grandchild) {
		_ = syscall.Kill(grandchild, syscall.SIGKILL)
		t.Fatal("the grandchild survived Stop of its parent")
	}
}

func TestStopKillsAChildThatIgnoresTERM(t *testing.T) {
	p, err := Start(Spec{Path: "/bin/sh", Args: []string{"-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let the trap be set
	start := time.Now()
	err = p.Stop(300 * time.Millisecond)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("exit %v, want killed by SIGKILL", err)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatal("SIGKILL came before the grace period")
	}
}

func TestFreeAddr(t *testing.T) {
	addr, err := FreeAddr(context.Background(), "127.0.0.1")
	if err != nil || !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("FreeAddr = %q, %v", addr, err)
	}
}

// The kernel may give a just-closed port to the next bind to port 0; a
// node's mesh and status listeners once got the same port that way.
// FreeAddr never returns a port twice within HandedOutFor.
func TestFreeAddrNeverHandsOutAPortTwice(t *testing.T) {
	// Each run hands out 500 ports from a memory of its own, which it
	// leaves behind: go test -count runs it tens of times within
	// HandedOutFor, and the process's memory would hold more ports than
	// the kernel's ephemeral range, failing every FreeAddr after it.
	saved := handedOut
	handedOut = &recentPorts{at: map[string]time.Time{}}
	t.Cleanup(func() { handedOut = saved })
	seen := map[string]bool{}
	for range 500 {
		addr, err := FreeAddr(context.Background(), "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("FreeAddr handed out %s twice", addr)
		}
		seen[addr] = true
	}
}

func TestRecentPortsForgetsAfterTheWindow(t *testing.T) {
	r := &recentPorts{at: map[string]time.Time{}}
	t0 := time.Unix(1000, 0)
	if !r.claim("127.0.0.1:5000", t0) {
		t.Fatal("a first claim was refused")
	}
	if r.claim("127.0.0.1:5000", t0.Add(HandedOutFor-time.Second)) {
		t.Fatal("a port was handed out twice within the window")
	}
	if !r.claim("127.0.0.1:5001", t0.Add(time.Second)) {
		t.Fatal("another port was refused")
	}
	if !r.claim("127.0.0.1:5000", t0.Add(HandedOutFor)) {
		t.Fatal("a port was still refused after the window")
	}
	if len(r.at) != 2 {
		t.Fatalf("remembers %d ports, want 2 (the old entry replaced)", len(r.at))
	}
}
