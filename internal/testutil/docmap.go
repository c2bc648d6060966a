package testutil

import (
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// PackageDocNamesEveryFile fails t unless the package doc in the current
// folder's doc.go names every non-test file of the package, and no file
// that is not there: a newcomer finds each part from the doc.
func PackageDocNamesEveryFile(t *testing.T) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile(`\b[a-z]+\.go\b`).FindAllString(f.Doc.Text(), -1) {
		named[m] = true
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if name := e.Name(); strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") && name != "doc.go" {
			files = append(files, name)
			if !named[name] {
				t.Errorf("%s is not in the package doc's file map (doc.go): say what it holds there", name)
			}
		}
	}
	for name := range named {
		if !slices.Contains(files, name) {
			t.Errorf("the package doc names %s, which is not a file of the package", name)
		}
	}
}
