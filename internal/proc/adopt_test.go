package proc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary a parent that starts a child (detached
// or not), prints its Identity and exits at once.
const helperEnv = "PROC_TEST_START_CHILD"

func TestMain(m *testing.M) {
	if claims := os.Getenv(freeAddrChildEnv); claims != "" {
		os.Exit(freeAddrChild(claims))
	}
	if mode := os.Getenv(helperEnv); mode != "" {
		p, err := Start(Spec{Path: "/bin/sleep", Args: []string{"30"}, Detached: mode == "detached"})
		if err != nil {
			os.Exit(2)
		}
		_ = json.NewEncoder(os.Stdout).Encode(p.Identity())
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childOfExitedParent runs the helper and returns the Identity of the
// child it started before it exited.
func childOfExitedParent(t *testing.T, mode string) Identity {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var id Identity
	if err := json.NewDecoder(bufio.NewReader(out)).Decode(&id); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if id.Pid == 0 || id.Start == 0 {
		t.Fatalf("helper printed %+v", id)
	}
	return id
}

func TestDetachedChildOutlivesItsParentAndIsAdopted(t *testing.T) {
	id := childOfExitedParent(t, "detached")
	time.Sleep(100 * time.Millisecond)
	if !id.Alive() {
		t.Fatal("a detached child died with its parent")
	}
	p, err := Adopt(id)
	if err != nil {
		t.Fatal(err)
	}
	if p.Exited() {
		t.Fatal("adopted process reported exited while it runs")
	}
	start := time.Now()
	if err := p.Stop(2 * time.Second); !errors.Is(err, ErrExitUnknown) {
		t.Fatalf("Stop of an adopted process = %v, want ErrExitUnknown", err)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("the adopted process's exit was seen after %s; SIGTERM should end sleep at once", time.Since(start))
	}
	if id.Alive() {
		t.Fatal("the adopted process survived Stop")
	}
}

func TestChildDiesWithItsParentUnlessDetached(t *testing.T) {
	id := childOfExitedParent(t, "attached")
	deadline := time.Now().Add(3 * time.Second)
	for id.Alive() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if id.Alive() {
		_ = syscall.Kill(id.Pid, syscall.SIGKILL)
		t.Fatal("a child that is not detached outlived its parent")
	}
}

func TestAdoptRefusesAnotherProcess(t *testing.T) {
	p, err := Start(Spec{Path: "/bin/sleep", Args: []string{"30"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Kill() }()
	id := p.Identity()
	if _, err := Adopt(Identity{Pid: id.Pid, Start: id.Start + 1}); err == nil {
		t.Fatal("Adopt took a process whose start time differs from the record (a reused pid)")
	}
	if _, err := Adopt(Identity{Pid: os.Getpid(), Start: 1}); err == nil {
		t.Fatal("Adopt took this very process under a wrong identity")
	}
	_ = p.Kill()
	if _, err := Adopt(id); err == nil {
		t.Fatal("Adopt took a process that has exited")
	}
}
