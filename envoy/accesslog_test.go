package envoy

import (
	"os"
	"path/filepath"
	"testing"
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
