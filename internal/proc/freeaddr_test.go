package proc

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// isolateClaims gives the test a claims file of its own, so go test
// -count runs do not fill the shared one.
func isolateClaims(t *testing.T) {
	t.Helper()
	saved := handedOut
	handedOut = newPortClaims(filepath.Join(t.TempDir(), "claims"))
	t.Cleanup(func() { handedOut = saved })
}

func TestFreeAddrIsBelowTheKernelsEphemeralRange(t *testing.T) {
	isolateClaims(t)
	lo, hi := fixedRange()
	if hi != ephemeralLow() || lo >= hi {
		t.Fatalf("range [%d, %d) with the ephemeral range from %d", lo, hi, ephemeralLow())
	}
	for range 50 {
		addr, err := FreeAddr(context.Background(), "127.0.0.1")
		if err != nil || !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Fatalf("FreeAddr = %q, %v", addr, err)
		}
		if p := portOf(addr); p < lo || p >= hi {
			t.Fatalf("FreeAddr gave port %d, outside [%d, %d)", p, lo, hi)
		}
	}
}

// The kernel may give a just-closed port to the next bind to port 0; a
// node's mesh and status listeners once got the same port that way.
// FreeAddr never returns a port twice within HandedOutFor.
func TestFreeAddrNeverHandsOutAPortTwice(t *testing.T) {
	isolateClaims(t)
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

// FreeAddr skips a port something listens on.
func TestFreeAddrSkipsAPortInUse(t *testing.T) {
	isolateClaims(t)
	lo, _ := fixedRange()
	held := 0
	for p := lo; held == 0; p++ {
		if l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			t.Cleanup(func() { _ = l.Close() })
			held = p
		}
	}
	for range 200 {
		_, err := candidate(context.Background(), "127.0.0.1", held, held+1)
		if err == nil {
			t.Fatalf("a candidate was port %d, which is in use", held)
		}
	}
}

// A demo stack's Jaeger once took the public port its test had been
// handed, and two agents' replicas the same port: FreeAddr's memory was
// the process's own. Here a second process hands out ports beside this
// one, and none is handed out by both.
func TestFreeAddrNeverHandsOutAPortTwiceAcrossProcesses(t *testing.T) {
	claims := filepath.Join(t.TempDir(), "claims")
	saved := handedOut
	handedOut = newPortClaims(claims)
	t.Cleanup(func() { handedOut = saved })
	child := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), freeAddrChildEnv+"="+claims)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	mine := map[int]bool{}
	for range 400 {
		addr, err := FreeAddr(context.Background(), "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		mine[portOf(addr)] = true
	}
	theirs := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		p, err := strconv.Atoi(strings.TrimPrefix(sc.Text(), "port "))
		if err != nil || !strings.HasPrefix(sc.Text(), "port ") {
			continue
		}
		theirs++
		if mine[p] {
			t.Fatalf("port %d was handed out to both processes", p)
		}
	}
	if err := child.Wait(); err != nil {
		t.Fatalf("the other process: %v", err)
	}
	if theirs != 400 {
		t.Fatalf("the other process handed out %d ports, want 400", theirs)
	}
}

// freeAddrChildEnv makes the test binary the other process of the test
// above: it hands out 400 ports from the claims file the variable names,
// prints them and exits.
const freeAddrChildEnv = "PROC_TEST_FREEADDR_CHILD"

func freeAddrChild(claims string) int {
	handedOut = newPortClaims(claims)
	for range 400 {
		addr, err := FreeAddr(context.Background(), "127.0.0.1")
		if err != nil {
			_, _ = os.Stderr.WriteString(err.Error() + "\n")
			return 2
		}
		_, _ = os.Stdout.WriteString("port " + strconv.Itoa(portOf(addr)) + "\n")
	}
	return 0
}

func TestPortClaimsForgetAfterTheWindow(t *testing.T) {
	c := newPortClaims(filepath.Join(t.TempDir(), "claims"))
	other := newPortClaims(c.path) // another process's view of the same file
	t0 := time.Unix(1000, 0)
	if !c.claim(5000, t0) {
		t.Fatal("a first claim was refused")
	}
	if c.claim(5000, t0.Add(HandedOutFor-time.Second)) || other.claim(5000, t0.Add(HandedOutFor-time.Second)) {
		t.Fatal("a port was handed out twice within the window")
	}
	if !other.claim(5001, t0.Add(time.Second)) {
		t.Fatal("another port was refused")
	}
	if !other.claim(5000, t0.Add(HandedOutFor)) {
		t.Fatal("a port was still refused after the window")
	}
	f, err := os.Open(c.path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if at := readClaims(f); len(at) != 2 {
		t.Fatalf("the file holds %d ports, want 2 (the old entry replaced): %v", len(at), at)
	}
}

// A claims file that cannot be opened leaves this process's memory.
func TestPortClaimsWithoutTheirFile(t *testing.T) {
	c := newPortClaims(filepath.Join(t.TempDir(), "no-such-folder", "claims"))
	if !c.claim(5000, time.Now()) || c.claim(5000, time.Now()) {
		t.Fatal("without a file, claims are not this process's memory")
	}
}
