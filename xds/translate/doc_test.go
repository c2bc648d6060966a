package translate

import (
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestPackageDocMapsEveryFile: the package doc's file map names every
// file of the package, and no file that is not there, so a newcomer finds
// each part from the doc.
func TestPackageDocMapsEveryFile(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	doc := f.Doc.Text()
	named := map[string]bool{}
	for _, m := range regexp.MustCompile(`\b[a-z]+\.go\b`).FindAllString(doc, -1) {
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
			t.Errorf("the package doc's file map names %s, which is not a file of the package", name)
		}
	}
}
