package envoy

import (
	"fmt"
	"os"
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
