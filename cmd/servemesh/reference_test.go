package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/spf13/cobra/doc"

	"github.com/servemesh/servemesh/internal/testutil"
)

// cliReference is where the docs site's CLI reference is, a page per
// command.
var cliReference = filepath.Join("..", "..", "docs", "reference", "cli")

// TestCLIReferenceIsTheCode: the docs site's CLI reference is what cobra's
// generator makes of the commands themselves, a page per command, none
// missing and none left from a command that is gone (make testdata
// rewrites it).
func TestCLIReferenceIsTheCode(t *testing.T) {
	unsetClientEnv(t)
	root := newRootCommand(slog.New(slog.NewTextHandler(io.Discard, nil)))
	root.DisableAutoGenTag = true // no date: the pages are the code's alone
	made := t.TempDir()
	if err := doc.GenMarkdownTree(root, made); err != nil {
		t.Fatal(err)
	}
	pages := markdownIn(t, made)
	if *update {
		for _, old := range markdownIn(t, cliReference) {
			if err := os.Remove(filepath.Join(cliReference, old)); err != nil {
				t.Fatal(err)
			}
		}
	} else if kept := markdownIn(t, cliReference); !slices.Equal(kept, pages) {
		t.Errorf("docs/reference/cli has pages %v; the commands make %v (run make testdata)", kept, pages)
	}
	for _, page := range pages {
		text, err := os.ReadFile(filepath.Join(made, page))
		if err != nil {
			t.Fatal(err)
		}
		testutil.Golden(t, filepath.Join(cliReference, page), text, *update)
	}
}

// markdownIn are the names of dir's Markdown files, sorted (none if dir is
// not there).
func markdownIn(t *testing.T, dir string) []string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range found {
		out = append(out, filepath.Base(f))
	}
	slices.Sort(out)
	return out
}
