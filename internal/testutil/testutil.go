package testutil

import (
	"bytes"
	"os"
	"sync"
	"testing"
)

// Golden compares got with the golden file at path; with update set it
// rewrites the file instead. The failure message says how to accept a change.
func Golden(t testing.TB, path string, got []byte, update bool) {
	t.Helper()
	if update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("missing golden file (run `make testdata`): %v", err)
	}
	if !bytes.Equal(want, got) {
		t.Errorf("%s differs from the output; if the change is intended run `make testdata` and review the diff\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers, such as a logger
// and a test reading what it logged.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
