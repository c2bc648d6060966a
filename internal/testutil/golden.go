package testutil

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Golden compares got with the golden file at path; with update set it
// rewrites the file instead. The failure message says how to accept a change.
func Golden(t testing.TB, path string, got []byte, update bool) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
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

// GoldenCases runs one subtest per input file inDir/<case>.yaml. render
// turns an input into output files by suffix ("routes.yaml"), each compared
// with outDir/<case>.<suffix> and rewritten when update is set.
//
// What is stale is decided from the inputs alone, as Envoy Gateway does, so
// running some cases (-run TestX/one-case) never touches or reports the
// others: a case's own output file that render no longer produces is
// stale, and an output file whose case has no input is an orphan. Both are
// removed with update and reported without it.
func GoldenCases(t *testing.T, inDir, outDir string, update bool, render func(t *testing.T, input []byte) map[string][]byte) {
	t.Helper()
	inputs, err := filepath.Glob(filepath.Join(inDir, "*.yaml"))
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no golden inputs in %s (err %v)", inDir, err)
	}
	cases := map[string]bool{}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		if strings.Contains(name, ".") {
			t.Fatalf("golden input %s: a case name has no '.', which separates it from the output suffix", in)
		}
		cases[name] = true
		t.Run(name, func(t *testing.T) {
			input, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			outputs := render(t, input)
			for suffix, got := range outputs {
				Golden(t, filepath.Join(outDir, name+"."+suffix), got, update)
			}
			existing, _ := filepath.Glob(filepath.Join(outDir, name+".*"))
			for _, path := range existing {
				if _, made := outputs[strings.TrimPrefix(filepath.Base(path), name+".")]; !made {
					removeStale(t, path, "case "+name+" no longer produces it", update)
				}
			}
		})
	}
	outputs, _ := filepath.Glob(filepath.Join(outDir, "*"))
	sort.Strings(outputs)
	for _, path := range outputs {
		name, _, _ := strings.Cut(filepath.Base(path), ".")
		if !cases[name] {
			removeStale(t, path, "no input "+filepath.Join(inDir, name+".yaml"), update)
		}
	}
}

func removeStale(t *testing.T, path, why string, update bool) {
	t.Helper()
	if !update {
		t.Errorf("golden file %s is stale (%s); run `make testdata` to remove it", path, why)
		return
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	t.Logf("removed stale golden file %s (%s)", path, why)
}
