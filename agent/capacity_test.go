package agent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMemoryMB(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(path, []byte("MemFree:  1000 kB\nMemTotal:       25165824 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := memoryMB(path); got != 24576 {
		t.Fatalf("memoryMB = %d, want 24576", got)
	}
	if got := memoryMB(filepath.Join(t.TempDir(), "missing")); got != 1024 {
		t.Fatalf("without /proc/meminfo: %d, want the 1024 fallback", got)
	}
}
