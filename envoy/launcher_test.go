package envoy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/internal/protoyaml"
	"github.com/servemesh/servemesh/wire"
)

// TestLauncherRendersAndStarts: StartReady renders the node's bootstrap
// into the work folder, starts Envoy with it and returns once /ready says
// LIVE.
func TestLauncherRendersAndStarts(t *testing.T) {
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ready" {
			_, _ = w.Write([]byte("LIVE\n"))
			return
		}
		http.NotFound(w, r)
	}))
	defer admin.Close()
	state, work := t.TempDir(), t.TempDir()
	t.Setenv("FAKE_ENVOY_STATE", state)
	adminAddr := strings.TrimPrefix(admin.URL, "http://")
	l := Launcher{Binary: fakeEnvoy(t), WorkDir: work, Logger: quietLogger(), Drain: time.Second, Bootstrap: bootstrap.Options{
		Node:       wire.ProxyNode{ID: "n1", PublicAddress: "127.0.0.1", PublicPort: 8080, MeshAddress: "127.0.0.1", MeshPort: 15001},
		XDSAddress: "127.0.0.1:18000", AdminAddress: adminAddr,
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
	if p.Admin().Address != adminAddr {
		t.Fatalf("admin %q, want the bootstrap's %q", p.Admin().Address, adminAddr)
	}
}

func TestLauncherRefusesABadNode(t *testing.T) {
	l := Launcher{Binary: fakeEnvoy(t), WorkDir: t.TempDir(), Logger: quietLogger(),
		Bootstrap: bootstrap.Options{Node: wire.ProxyNode{ID: "n1"}, XDSAddress: "127.0.0.1:1", AdminAddress: "127.0.0.1:2"}}
	if _, err := l.Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), "not an IP address") {
		t.Fatalf("got %v, want the node's listener addresses refused", err)
	}
}
