package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestOnlyThePreviousRunIsKept: each start keeps the previous run's replica
// folders and logs in previous-run and drops the run before it.
func TestOnlyThePreviousRunIsKept(t *testing.T) {
	dir := t.TempDir()
	run := func(files ...string) {
		t.Helper()
		for _, f := range files {
			if err := os.MkdirAll(filepath.Join(dir, f+".d"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f+".log"), []byte(f), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	names := func(d string) []string {
		entries, _ := os.ReadDir(d)
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	run("first-a", "first-b")
	if err := keepOnlyPreviousRun(dir, nil); err != nil {
		t.Fatal(err)
	}
	run("second")
	if err := keepOnlyPreviousRun(dir, nil); err != nil {
		t.Fatal(err)
	}
	if got := names(dir); !slices.Equal(got, []string{previousRun}) {
		t.Fatalf("the work folder holds %v; want only %s", got, previousRun)
	}
	if got := names(filepath.Join(dir, previousRun)); !slices.Equal(got, []string{"second.d", "second.log"}) {
		t.Fatalf("previous-run holds %v; want the second run's only", got)
	}
	if err := keepOnlyPreviousRun(t.TempDir(), nil); err != nil {
		t.Fatalf("an empty work folder: %v", err)
	}
}
