package agent

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/backoff"
)

// AccessLogMaxBytes is the size at which a node's access log is rotated:
// the full file is kept as <path>.1 (replacing the one before), and Envoy
// reopens a new one.
const AccessLogMaxBytes = 64 << 20

// RotateAccessLog checks the node's access log at path every interval
// until ctx ends, and rotates it when it reaches maxBytes, preparing the
// new file before Envoy reopens it.
func RotateAccessLog(ctx context.Context, log *slog.Logger, path string, admin envoy.Admin, maxBytes int64, interval time.Duration) {
	for backoff.Sleep(ctx, interval) {
		info, err := os.Stat(path)
		if err != nil || info.Size() < maxBytes {
			continue
		}
		if err := os.Rename(path, path+".1"); err != nil {
			log.Warn("rotating the access log failed", "path", path, "err", err)
			continue
		}
		if err := envoy.PrepareAccessLog(path); err != nil {
			log.Warn("Envoy will create the new access log itself, readable by others", "path", path, "err", err)
		}
		if err := admin.ReopenLogs(ctx); err != nil {
			log.Warn("Envoy did not reopen its access log; it writes to the rotated file until it does", "path", path, "err", err)
		}
	}
}
