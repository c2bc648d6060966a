package envoy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
)

func fakeEnvoy(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("testdata/fake-envoy.sh")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startFake starts the fake Envoy with its state in a temp folder.
func startFake(t *testing.T, admin string) (*Process, string) {
	t.Helper()
	state := t.TempDir()
	t.Setenv("FAKE_ENVOY_STATE", state)
	p, err := Start(Config{
		Binary: fakeEnvoy(t), ConfigPath: "/etc/bootstrap.yaml", AdminSocket: admin,
		LogPath: filepath.Join(state, "envoy.log"), Logger: quietLogger(), Concurrency: 2,
		StopGrace: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.child.Kill() })
	waitFile(t, filepath.Join(state, "pid"))
	return p, state
}

func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestFind(t *testing.T) {
	fake := fakeEnvoy(t)
	if got, err := Find(fake); err != nil || got != fake {
		t.Fatalf("Find(explicit) = %q, %v", got, err)
	}
	t.Setenv(EnvVar, fake)
	if got, err := Find(""); err != nil || got != fake {
		t.Fatalf("Find via %s = %q, %v", EnvVar, got, err)
	}
	t.Setenv(EnvVar, "/nonexistent/envoy")
	if _, err := Find(""); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "/nonexistent/envoy") {
		t.Fatalf("a missing $%s gave %v, want ErrNotFound naming the path", EnvVar, err)
	}
	t.Setenv(EnvVar, "")
	t.Setenv("PATH", t.TempDir())
	t.Chdir(t.TempDir())
	if _, err := Find(""); err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatalf("got %v, want ErrNotFound or a tools-folder Envoy", err)
	}
}

func TestCheckVersion(t *testing.T) {
	v, err := CheckVersion(context.Background(), fakeEnvoy(t))
	if err != nil || v != (Version{1, 40, 0}) {
		t.Fatalf("CheckVersion = %v, %v; want 1.40.0", v, err)
	}
	t.Setenv("FAKE_ENVOY_VERSION", "1.20.3")
	if _, err := CheckVersion(context.Background(), fakeEnvoy(t)); err == nil || !strings.Contains(err.Error(), "needs 1.30.0 or newer") {
		t.Fatalf("an old Envoy gave %v, want a refusal", err)
	}
	if _, err := ParseVersion("not envoy"); err == nil {
		t.Fatal("garbage parsed as a version")
	}
}

func TestStartPassesExplicitArgsAndStopTerminates(t *testing.T) {
	p, state := startFake(t, "127.0.0.1:1")
	args := waitFile(t, filepath.Join(state, "args"))
	want := "-c /etc/bootstrap.yaml --log-level warning --drain-time-s 5 --concurrency 2 --disable-hot-restart"
	if args != want {
		t.Fatalf("args %q, want %q", args, want)
	}
	if err := p.Stop(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if got := waitFile(t, filepath.Join(state, "signal")); got != "terminated" {
		t.Fatalf("fake envoy recorded %q, want terminated", got)
	}
}

func TestStopKillsAnEnvoyThatIgnoresTERM(t *testing.T) {
	t.Setenv("FAKE_ENVOY_IGNORE_TERM", "1")
	p, _ := startFake(t, "127.0.0.1:1")
	if err := p.Stop(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := p.ExitErr(); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("exit %v, want killed by SIGKILL", err)
	}
}

func TestStopDrainsThroughAdminFirst(t *testing.T) {
	var drained atomic.Bool
	admin := testutil.UnixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/drain_listeners" && r.URL.Query().Has("graceful") {
			drained.Store(true)
		}
	}))
	p, state := startFake(t, admin)
	if err := p.Stop(context.Background(), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if !drained.Load() {
		t.Fatal("Stop did not ask Envoy to drain")
	}
	waitFile(t, filepath.Join(state, "signal"))
}

func TestWaitReadyPollsAdmin(t *testing.T) {
	var calls atomic.Int32
	admin := testutil.UnixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ready" && calls.Add(1) >= 3 {
			_, _ = io.WriteString(w, "LIVE\n")
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "PRE_INITIALIZING\n")
	}))
	p, _ := startFake(t, admin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if calls.Load() < 3 {
		t.Fatalf("ready after %d polls, want 3", calls.Load())
	}
}

func TestWaitReadyReportsACrashWithItsLog(t *testing.T) {
	t.Setenv("FAKE_ENVOY_CRASH", "1")
	state := t.TempDir()
	t.Setenv("FAKE_ENVOY_STATE", state)
	p, err := Start(Config{Binary: fakeEnvoy(t), ConfigPath: "x", AdminSocket: "/nonexistent/admin.sock", LogPath: filepath.Join(state, "log"), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = p.WaitReady(ctx)
	if err == nil || !strings.Contains(err.Error(), "crashed on purpose") {
		t.Fatalf("got %v, want the crash with the log's message", err)
	}
}

// TestChildDiesWithParent runs a helper process that starts the fake Envoy,
// kills the helper with SIGKILL, and expects the fake Envoy to die too.
func TestChildDiesWithParent(t *testing.T) {
	if os.Getenv("SERVEMESH_ENVOY_HELPER") == "1" {
		if _, err := Start(Config{Binary: fakeEnvoy(t), ConfigPath: "x", AdminSocket: "/nonexistent/admin.sock",
			LogPath: filepath.Join(os.Getenv("FAKE_ENVOY_STATE"), "log"), Logger: quietLogger()}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute) // until the parent test kills us
		return
	}
	state := t.TempDir()
	helper := exec.CommandContext(context.Background(), os.Args[0], "-test.run=^TestChildDiesWithParent$")
	helper.Env = append(os.Environ(), "SERVEMESH_ENVOY_HELPER=1", "FAKE_ENVOY_STATE="+state)
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(waitFile(t, filepath.Join(state, "pid")))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("fake envoy %d not running: %v", pid, err)
	}
	_ = helper.Process.Kill()
	_ = helper.Wait()
	deadline := time.Now().Add(3 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("fake envoy %d outlived its killed parent", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSupervisorRestartsACrashedEnvoy(t *testing.T) {
	t.Setenv("FAKE_ENVOY_CRASH", "1")
	state := t.TempDir()
	t.Setenv("FAKE_ENVOY_STATE", state)
	var starts atomic.Int32
	s := &Supervisor{
		Config:     Config{Binary: fakeEnvoy(t), ConfigPath: "x", AdminSocket: "/nonexistent/admin.sock", LogPath: filepath.Join(state, "log"), Logger: quietLogger()},
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		OnStart: func(*Process) { starts.Add(1) },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for starts.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d starts of a crashing envoy", starts.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestSupervisorRefusesAListenerAnotherProcessHolds: Envoy binds its
// listeners with SO_REUSEPORT, so a second node's Envoy on the same
// addresses (a second demo-stack) started and shared the port with the
// first, each answering some of its requests.
func TestSupervisorRefusesAListenerAnotherProcessHolds(t *testing.T) {
	var lc net.ListenConfig
	l, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	state := t.TempDir()
	t.Setenv("FAKE_ENVOY_STATE", state)
	var starts atomic.Int32
	s := &Supervisor{
		Config:    Config{Binary: fakeEnvoy(t), ConfigPath: "x", AdminSocket: "/nonexistent/admin.sock", LogPath: filepath.Join(state, "log"), Logger: quietLogger()},
		Listeners: []Listener{{What: "the node's public listener", Addr: l.Addr().String()}},
		OnStart:   func(*Process) { starts.Add(1) },
	}
	err = s.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "the node's public listener "+l.Addr().String()+" is in use by pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("Run with its public listener held: %v; want it refused, naming the holder", err)
	}
	if starts.Load() != 0 {
		t.Fatalf("envoy was started %d times", starts.Load())
	}
}
