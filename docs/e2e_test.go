package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2ETestsRunInParallelOrSayWhy: every end-to-end test starts with
// t.Parallel() (it shares nothing with another: e2e/doc.go), or its doc
// comment says "Runs alone:" and why; go test then runs it before the
// parallel ones, with the machine to itself.
func TestE2ETestsRunInParallelOrSayWhy(t *testing.T) {
	files, err := filepath.Glob("../e2e/*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no e2e test files found (%v)", err)
	}
	tests := 0
	for _, path := range files {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
				continue
			}
			tests++
			if startsParallel(fn) || strings.Contains(fn.Doc.Text(), "Runs alone:") {
				continue
			}
			t.Errorf("%s: %s neither starts with t.Parallel() nor says in its doc comment \"Runs alone:\" and why (e2e/doc.go)",
				filepath.Base(path), fn.Name.Name)
		}
	}
	if tests < 50 {
		t.Fatalf("found %d e2e tests; the e2e package has more: is the parse reading the right files?", tests)
	}
}

// startsParallel reports whether fn's first statement is t.Parallel().
func startsParallel(fn *ast.FuncDecl) bool {
	if fn.Body == nil || len(fn.Body.List) == 0 {
		return false
	}
	expr, ok := fn.Body.List[0].(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := expr.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Parallel" && len(call.Args) == 0
}
