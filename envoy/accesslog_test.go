package envoy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
)

// TestPrepareAccessLog: the access log is created owner-only, and one an
// older version left readable is made so.
func TestPrepareAccessLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(path, []byte("old line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := PrepareAccessLog(path); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 || info.Size() != 9 {
		t.Fatalf("the access log: %v, %v; want the old lines kept, mode 0600", info, err)
	}
}

// TestAccessLogRotates: a full access log is kept as .1 and Envoy is asked
// to reopen a new one; a small one is left alone.
func TestAccessLogRotates(t *testing.T) {
	var reopened atomic.Int64
	socket := testutil.UnixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/reopen_logs" {
			reopened.Add(1)
		}
	}))
	path := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(path, make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go RotateAccessLog(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), path, Admin{Socket: socket}, 1000, 10*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	if reopened.Load() != 0 {
		t.Fatal("a log below the size cap was rotated")
	}
	if err := os.WriteFile(path, make([]byte, 2000), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the full log to be rotated", func() bool { return reopened.Load() == 1 })
	if info, err := os.Stat(path + ".1"); err != nil || info.Size() != 2000 {
		t.Fatalf("the rotated log: %v, %v", info, err)
	}
	// The new log is there before Envoy reopens it, empty and owner-only:
	// Envoy would create it 0644 (issue 34: replicas read every tenant's
	// paths and query strings).
	if info, err := os.Stat(path); err != nil || info.Size() != 0 || info.Mode().Perm() != 0o600 {
		t.Fatalf("the new log after the rotation: %v, %v; want an empty file, mode 0600", info, err)
	}
}
