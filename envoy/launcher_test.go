package envoy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/internal/protoyaml"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// TestLauncherRendersAndStarts: StartReady renders the node's bootstrap
// into the work folder, starts Envoy with it and returns once /ready says
// LIVE.
func TestLauncherRendersAndStarts(t *testing.T) {
	admin := testutil.UnixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ready" {
			_, _ = w.Write([]byte("LIVE\n"))
			return
		}
		http.NotFound(w, r)
	}))
	state, work := t.TempDir(), t.TempDir()
	t.Setenv("FAKE_ENVOY_STATE", state)
	l := Launcher{Binary: fakeEnvoy(t), WorkDir: work, Logger: quietLogger(), Drain: time.Second, Bootstrap: bootstrap.Options{
		Node:       wire.ProxyNode{ID: "n1", PublicAddress: "127.0.0.1", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001},
		XDSAddress: "127.0.0.1:18000", AdminSocket: admin,
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := l.StartReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop(context.Background(), 0) }()
	b, err := os.ReadFile(filepath.Join(work, "bootstrap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var boot bootstrapv3.Bootstrap
	if err := protoyaml.Unmarshal(b, &boot); err != nil || boot.GetNode().GetId() != "n1" {
		t.Fatalf("bootstrap in the work folder: node %q, %v", boot.GetNode().GetId(), err)
	}
	args := waitFile(t, filepath.Join(state, "args"))
	if !strings.Contains(args, "-c "+filepath.Join(work, "bootstrap.yaml")) || !strings.Contains(args, "--drain-time-s 1") {
		t.Fatalf("envoy started with %q", args)
	}
	if p.Admin().Socket != admin {
		t.Fatalf("admin %q, want the bootstrap's %q", p.Admin().Socket, admin)
	}
	// At debug levels Envoy logs requests' headers: only the node's user
	// reads its log.
	if fi, err := os.Stat(filepath.Join(work, "envoy.log")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("envoy.log: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
}

// TestLauncherPutsTheAdminSocketInAPrivateFolder: by default the admin API
// listens on a Unix socket in the work folder's admin/, which only the
// node's user may enter: a replica (another user) cannot reach it.
func TestLauncherPutsTheAdminSocketInAPrivateFolder(t *testing.T) {
	work := t.TempDir()
	if err := os.MkdirAll(filepath.Join(work, AdminSocketFolder), 0o777); err != nil { // as an older version left it
		t.Fatal(err)
	}
	l := Launcher{Binary: fakeEnvoy(t), WorkDir: work, Logger: quietLogger(), Bootstrap: bootstrap.Options{
		Node:       wire.ProxyNode{ID: "n1", PublicAddress: "127.0.0.1", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001},
		XDSAddress: "127.0.0.1:18000",
	}}
	cfg, err := l.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(work, "admin", "envoy.sock"); cfg.AdminSocket != want {
		t.Fatalf("admin socket %q, want %q", cfg.AdminSocket, want)
	}
	if fi, err := os.Stat(filepath.Dir(cfg.AdminSocket)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the admin socket's folder: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	b, err := os.ReadFile(cfg.ConfigPath)
	if err != nil || !strings.Contains(string(b), "path: "+cfg.AdminSocket) || !strings.Contains(string(b), "mode: 384") {
		t.Fatalf("the bootstrap does not put the admin API on the socket with mode 0600: %v\n%s", err, b)
	}
}

func TestLauncherRefusesABadNode(t *testing.T) {
	l := Launcher{Binary: fakeEnvoy(t), WorkDir: t.TempDir(), Logger: quietLogger(),
		Bootstrap: bootstrap.Options{Node: wire.ProxyNode{ID: "n1"}, XDSAddress: "127.0.0.1:1", AdminSocket: "admin.sock"}}
	if _, err := l.Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), "not an IP address") {
		t.Fatalf("got %v, want the node's listener addresses refused", err)
	}
}

// TestHotRestartSocketsArePrivate: a node's hot-restartable Envoy makes its
// hot restart sockets in the work folder's hot-restart/, which only the
// node's user may enter, mode 0600 (issue 58: Envoy's default, the
// abstract namespace, let a replica take Envoy's listening sockets and
// stop it); its path is relative to the work folder, where Envoy runs, so
// that no work folder's length passes a Unix socket's limit.
func TestHotRestartSocketsArePrivate(t *testing.T) {
	work := filepath.Join(t.TempDir(), "a-long-work-folder") // its admin socket fits; absolute hot restart sockets would not
	l := Launcher{Binary: fakeEnvoy(t), WorkDir: work, Logger: quietLogger(), Parent: "/usr/bin/servemesh", Bootstrap: bootstrap.Options{
		Node:       wire.ProxyNode{ID: "n1", PublicAddress: "127.0.0.1", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001},
		XDSAddress: "127.0.0.1:18000",
	}}
	s, err := l.Supervise(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.Config.SocketPath != filepath.Join(HotRestartFolder, "envoy") || s.Config.Dir != work {
		t.Fatalf("hot restart sockets at %q in %q; want %s/envoy in the work folder %s", s.Config.SocketPath, s.Config.Dir, HotRestartFolder, work)
	}
	if fi, err := os.Stat(filepath.Join(work, HotRestartFolder)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the hot restart sockets' folder: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	for _, epoch := range []int{0, 3} {
		cfg := s.Config
		cfg.Epoch = epoch
		if args := strings.Join(cfg.Args(), " "); !strings.Contains(args, "--socket-path hot-restart/envoy --socket-mode 600") {
			t.Errorf("epoch %d: envoy %s; want its hot restart sockets in hot-restart/, mode 0600", epoch, args)
		}
	}
	cfg := s.Config
	cfg.HotRestart = false
	if args := strings.Join(cfg.Args(), " "); strings.Contains(args, "--socket-path") || !strings.Contains(args, "--disable-hot-restart") {
		t.Errorf("without hot restart: envoy %s; want hot restart off and no socket", args)
	}
}

// TestAFreshEnvoyRemovesTheLastOnesSharedMemory: Envoy leaves its hot
// restart's shared memory region in /dev/shm when it exits, and each
// fresh start picks a new base id, so every restart of a node's Envoy
// left a file there (issue 58, a low: 2,100 of them on a test machine).
// Starting afresh removes the region of the base id the last one wrote.
func TestAFreshEnvoyRemovesTheLastOnesSharedMemory(t *testing.T) {
	work := t.TempDir()
	t.Setenv("FAKE_ENVOY_STATE", t.TempDir())
	id := 100_000 + os.Getpid()%100_000
	region := filepath.Join(SharedMemoryDir, fmt.Sprintf("envoy_shared_memory_%d", id*10))
	if err := os.WriteFile(region, []byte("left by an exited envoy"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(region) })
	parent := filepath.Join(work, "parent.sh") // as servemesh envoy-parent -- envoy ARGS, without the waiting
	if err := os.WriteFile(parent, []byte("#!/bin/sh\nshift 2\nexec \"$@\"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	s := &Supervisor{Config: Config{Binary: fakeEnvoy(t), Parent: parent, ConfigPath: "x", AdminSocket: filepath.Join(work, "admin.sock"),
		LogPath: filepath.Join(work, "log"), Logger: quietLogger(), HotRestart: true, BaseIDPath: filepath.Join(work, baseIDFile),
		StopGrace: 300 * time.Millisecond}}
	if err := os.WriteFile(s.Config.BaseIDPath, []byte(strconv.Itoa(id)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := s.start(0, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.child.Kill() })
	if _, err := os.Stat(region); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the last envoy's shared memory region after a fresh start: %v; want it removed", err)
	}
}
