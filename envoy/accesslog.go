package envoy

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/servemesh/servemesh/internal/backoff"
)

// PrepareAccessLog creates the node's access log at path, or makes the one
// there, for Envoy to open: owner-only (0600). Envoy creates a missing
// log 0644, and the access log holds every tenant's paths, query strings
// (?api_key=...) and hosts, which replicas must not read. Call it before
// Envoy starts (Launcher.Prepare does).
func PrepareAccessLog(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("the access log: %w", err)
	}
	defer func() { _ = f.Close() }()
	if err := f.Chmod(0o600); err != nil { // one an older version left readable
		return fmt.Errorf("the access log: %w", err)
	}
	return nil
}

// AccessLogMaxBytes is the size at which a node's access log is rotated:
// the full file is kept as <path>.1 (replacing the one before), and Envoy
// reopens a new one.
const AccessLogMaxBytes = 64 << 20

// RotateAccessLog checks the node's access log at path every interval
// until ctx ends, and rotates it when it reaches maxBytes, preparing the
// new file before Envoy reopens it.
func RotateAccessLog(ctx context.Context, log *slog.Logger, path string, admin Admin, maxBytes int64, interval time.Duration) {
	for backoff.Sleep(ctx, interval) {
		info, err := os.Stat(path)
		if err != nil || info.Size() < maxBytes {
			continue
		}
		if err := os.Rename(path, path+".1"); err != nil {
			log.Warn("rotating the access log failed", "path", path, "err", err)
			continue
		}
		if err := PrepareAccessLog(path); err != nil {
			log.Warn("Envoy will create the new access log itself, readable by others", "path", path, "err", err)
		}
		if err := admin.ReopenLogs(ctx); err != nil {
			log.Warn("Envoy did not reopen its access log; it writes to the rotated file until it does", "path", path, "err", err)
		}
	}
}
