package testutil

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/proc"
)

// FreeAddr is proc.FreeAddr: a port nothing listens on, not handed out
// in the last minute by any servemesh process here.
func FreeAddr(host string) (string, error) {
	return proc.FreeAddr(context.Background(), host)
}

// MustFreeAddr is FreeAddr for programs that cannot go on without one.
func MustFreeAddr(host string) string {
	addr, err := FreeAddr(host)
	if err != nil {
		panic(err)
	}
	return addr
}

// Port returns the port of a host:port address (0 if there is none).
func Port(addr string) uint32 {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return uint32(n)
}

// Until polls cond every 10ms until it holds or timeout passes.
func Until(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// BuildServemesh builds the servemesh binary into dir from the repository
// root (the working directory) and returns its path.
func BuildServemesh(ctx context.Context, dir string) (string, error) {
	if err := os.Chmod(dir, 0o755); err != nil { // replicas run as nobody must reach it
		return "", err
	}
	bin := filepath.Join(dir, "servemesh")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/servemesh").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build servemesh (run from the repository root): %w: %s", err, out)
	}
	return bin, nil
}

// CPUSeconds is a process's user plus system CPU time so far.
func CPUSeconds(pid int) float64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // clock ticks of 10ms
}

// RSSMiB is a process's resident memory in MiB (0 when it cannot be read).
func RSSMiB(pid int) float64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb float64
			_, _ = fmt.Sscan(rest, &kb)
			return kb / 1024
		}
	}
	return 0
}

// PidListening finds the process whose command line has `--listen addr`
// (how demo replicas are started), or 0.
func PidListening(addr string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if strings.Contains(string(cmdline), "--listen\x00"+addr+"\x00") {
			return pid
		}
	}
	return 0
}

// WaitForProgress polls step every 10ms until it reports done, and fails
// t only when step's progress (a count that grows as the awaited state
// comes about, such as replicas answering) has not grown for stall, or
// when limit has passed: a loaded machine that brings the state about
// slowly passes, one where it stopped coming about fails after stall.
func WaitForProgress(t testing.TB, stall, limit time.Duration, what string, step func() (done bool, progress int)) {
	t.Helper()
	start := time.Now()
	last, best := start, -1
	for {
		done, progress := step()
		if done {
			return
		}
		now := time.Now()
		if progress > best {
			last, best = now, progress
		}
		switch {
		case now.Sub(last) > stall:
			t.Fatalf("waiting for %s: no progress for %s (at %d after %s)", what, stall, best, now.Sub(start).Round(time.Millisecond))
		case now.Sub(start) > limit:
			t.Fatalf("waiting for %s: not within %s (at %d)", what, limit, best)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WaitFor polls cond every 10ms until it holds, and fails t if it does not
// within timeout, naming what it waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := Until(timeout, cond); err != nil {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}
