package meshspec

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/internal/testutil"
)

// TestConfigReferenceIsTheCode: the docs site's configuration reference
// is the file apply takes (Spec) as the code declares it: every field of
// every object, its name in the file, its type and the doc comment the
// code gives it (make testdata rewrites it).
func TestConfigReferenceIsTheCode(t *testing.T) {
	docs := fieldDocs(t)
	var b strings.Builder
	b.WriteString("# Configuration reference\n\n" +
		"What `servemesh apply -f` takes (YAML or JSON), the API's `POST /v1/apply` and `servemesh export` writes, object by object, " +
		"made from the code's types and their doc comments (`meshspec`; a test holds this page to them). " +
		"Limits and defaults are in each field's text; `servemesh validate -f` checks a file against all of them.\n")
	seen := map[reflect.Type]bool{}
	for queue := []reflect.Type{reflect.TypeFor[Spec]()}; len(queue) > 0; queue = queue[1:] {
		typ := queue[0]
		fmt.Fprintf(&b, "\n## %s\n\n", typ.Name())
		if d := docs[typ.Name()]; d != "" {
			b.WriteString(d + "\n\n")
		}
		b.WriteString("| field | type | what it is |\n| --- | --- | --- |\n")
		for _, f := range fieldsOf(typ, docs) {
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", f.name, typeText(f.typ), f.doc(docs))
			if s := structOf(f.typ); s != nil && !seen[s] {
				seen[s] = true
				queue = append(queue, s)
			}
		}
	}
	testutil.Golden(t, filepath.Join("..", "docs", "reference", "config.md"), []byte(b.String()), *update)
}

// field is one field of an object in the file: its name there, its type,
// and where its doc comment is (Type.Field) or, for one with none, the
// field before it whose comment covers it.
type field struct {
	name, owner, goName, after string
	typ                        reflect.Type
}

func (f field) doc(docs map[string]string) string {
	if d := docs[f.owner+"."+f.goName]; d != "" {
		return d
	}
	if f.after != "" {
		return "See `" + f.after + "`."
	}
	return ""
}

// fieldsOf are typ's fields as the file names them, embedded ones'
// inlined, those JSON leaves out skipped; one without a doc comment is
// taken as covered by the last one before it with one (a comment on a
// group of fields).
func fieldsOf(typ reflect.Type, docs map[string]string) []field {
	var out []field
	after := ""
	for i := range typ.NumField() {
		sf := typ.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		switch {
		case !sf.IsExported() || name == "-":
			continue
		case sf.Anonymous && name == "":
			out = append(out, fieldsOf(sf.Type, docs)...)
			continue
		case name == "":
			name = sf.Name
		}
		out = append(out, field{name: name, owner: typ.Name(), goName: sf.Name, after: after, typ: sf.Type})
		if docs[typ.Name()+"."+sf.Name] != "" {
			after = name
		}
	}
	return out
}

// structOf is the object type t holds (through pointers, lists and maps),
// if it is one of this package's structs.
func structOf(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() == reflect.Struct && t.PkgPath() == reflect.TypeFor[Spec]().PkgPath() {
		return t
	}
	return nil
}

// typeText is t as the reference shows it, an object linked to its
// section.
func typeText(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return typeText(t.Elem())
	case reflect.Slice:
		return "list of " + typeText(t.Elem())
	case reflect.Map:
		return "map of " + typeText(t.Key()) + " to " + typeText(t.Elem())
	}
	if structOf(t) != nil {
		return fmt.Sprintf("[%s](#%s)", t.Name(), strings.ToLower(t.Name()))
	}
	if t.PkgPath() != "" && t.Name() != t.Kind().String() {
		return fmt.Sprintf("%s (%s)", t.Kind(), t.Name())
	}
	return t.Kind().String()
}

// fieldDocs are the doc comments of this package's struct types, by
// Type, and of their fields, by Type.Field, each on one line.
func fieldDocs(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if gd, ok := n.(*ast.GenDecl); ok && len(gd.Specs) == 1 && gd.Doc != nil {
				if ts, ok := gd.Specs[0].(*ast.TypeSpec); ok {
					out[ts.Name.Name] = oneLine(gd.Doc.Text())
				}
				return true
			}
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return false
			}
			for _, fl := range st.Fields.List {
				text := fl.Doc.Text()
				if text == "" {
					text = fl.Comment.Text()
				}
				text = oneLine(text)
				for _, name := range fl.Names {
					out[ts.Name.Name+"."+name.Name] = text
				}
			}
			return false
		})
	}
	return out
}

// oneLine is a comment's text on one line, fit for a table's cell.
func oneLine(text string) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(text), " "), "|", "\\|")
}
