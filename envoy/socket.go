package envoy

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// UnixPathMax is the longest path a unix socket may have on Linux.
const UnixPathMax = 107

// ListenSocket listens on the unix socket name in dir, the folder
// the node's Envoy runs in, replacing a previous agent's: the activator's
// and the picker's sockets. Only the agent's user (the node's Envoy's) may
// connect. The socket is bound in a fresh
// owner-only folder, made 0600 there and only then moved into place, so
// it never exists at its path with a mode a replica could connect through.
// It returns the socket's path.
func ListenSocket(ctx context.Context, dir, name string) (net.Listener, string, error) {
	path, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		return nil, "", fmt.Errorf("socket %s: %w", name, err)
	}
	if len(path) > UnixPathMax {
		return nil, "", fmt.Errorf("socket %s: the path is %d bytes, longer than a unix socket's %d; give the node's Envoy a shorter folder", path, len(path), UnixPathMax)
	}
	private, err := os.MkdirTemp(filepath.Dir(path), ".s")
	if err != nil {
		return nil, "", fmt.Errorf("socket %s: %w", path, err)
	}
	defer func() { _ = os.RemoveAll(private) }()
	folder, err := os.Open(private)
	if err != nil {
		return nil, "", fmt.Errorf("socket %s: %w", path, err)
	}
	defer func() { _ = folder.Close() }()
	// Bound through the folder's descriptor, the path is short whatever
	// the folder's own length.
	l, err := (&net.ListenConfig{}).Listen(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", folder.Fd(), name))
	if err != nil {
		return nil, "", fmt.Errorf("socket %s: %w", path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false) // it is moved; a later agent replaces it
	bound := filepath.Join(private, name)
	if err := os.Chmod(bound, 0o600); err != nil {
		_ = l.Close()
		return nil, "", fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Rename(bound, path); err != nil { // replaces a previous agent's
		_ = l.Close()
		return nil, "", fmt.Errorf("socket %s: %w", path, err)
	}
	return l, path, nil
}
