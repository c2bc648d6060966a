package envoy

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
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
