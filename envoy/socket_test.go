package envoy

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnvoySocketsAppearOwnerOnly: a socket is bound in a private folder,
// made 0600 there and moved into place, so no replica can connect in the
// moment between bind and chmod (issue 34); a path of exactly the longest
// a socket may have still works, and no folder is left behind.
func TestEnvoySocketsAppearOwnerOnly(t *testing.T) {
	base, err := os.MkdirTemp("", "s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	name := "x.sock"
	dir := filepath.Join(base, strings.Repeat("d", UnixPathMax-len(base)-len(name)-2))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, path, err := ListenSocket(context.Background(), dir, name)
	if err != nil {
		t.Fatalf("a %d-byte socket path: %v", len(filepath.Join(dir, name)), err)
	}
	defer func() { _ = l.Close() }()
	if fi, err := os.Stat(path); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the socket: %v, %v; want a socket, 0600", fi, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".s*")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
	if conn, err := (&net.Dialer{}).DialContext(context.Background(), "unix", path); err != nil {
		t.Fatalf("connecting: %v", err)
	} else {
		_ = conn.Close()
	}
	if _, _, err := ListenSocket(context.Background(), dir+"d", name); err == nil {
		t.Fatal("a path over the limit was taken")
	}
}
