package proc

import (
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
