package testutil

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
)

// UnixServer serves h on a Unix socket in a temporary folder, as Envoy's
// admin API listens, until the test ends, and returns the socket's path.
func UnixServer(t testing.TB, h http.Handler) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.sock")
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return path
}
