// Package docs holds the tests that keep docs/architecture.md true: its
// layer table is the import rule of the code, and its numbered flow is
// what the packages' docs cite.
package docs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/servemesh/servemesh/"

// pkg is one package of the module as go list sees it.
type pkg struct {
	Path    string   // relative to the module, such as "controlplane/api"
	Imports []string // the module's packages its non-test files import
	Dir     string
	Doc     string // the package comment
}

// listPackages lists the module's packages.
func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-e", "-json", "./...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			ImportPath, Dir, Doc string
			Imports              []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		q := pkg{Path: strings.TrimPrefix(p.ImportPath, module), Dir: p.Dir, Doc: p.Doc}
		if p.ImportPath == strings.TrimSuffix(module, "/") {
			q.Path = "."
		}
		for _, imp := range p.Imports {
			if rel, ok := strings.CutPrefix(imp, module); ok {
				q.Imports = append(q.Imports, rel)
			}
		}
		pkgs = append(pkgs, q)
	}
	return pkgs
}

func readArchitecture(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the text of the "## title" section of doc.
func section(t *testing.T, doc, title string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n## "+title+"\n")
	if !ok {
		t.Fatalf("docs/architecture.md has no section %q", title)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// rule is one row of the layer table: packages (a trailing /* matches a
// subtree) and what they may import ("anything" for all).
type rule struct {
	packages, allowed []string
	anything          bool
}

var (
	backticked  = regexp.MustCompile("`([^`]+)`")
	packagePath = regexp.MustCompile(`^[a-z][a-z0-9]*(/[a-z][a-z0-9]*)*(/\*)?$`)
)

// parseLayers reads the layer table.
func parseLayers(t *testing.T, text string) []rule {
	t.Helper()
	var rules []rule
	for _, line := range strings.Split(text, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), "|")
		if !strings.HasPrefix(line, "| `") || len(cells) != 2 {
			continue
		}
		r := rule{anything: strings.TrimSpace(cells[1]) == "anything"}
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			r.packages = append(r.packages, m[1])
		}
		for _, m := range backticked.FindAllStringSubmatch(cells[1], -1) {
			if packagePath.MatchString(m[1]) { // not a type named in passing
				r.allowed = append(r.allowed, m[1])
			}
		}
		rules = append(rules, r)
	}
	if len(rules) == 0 {
		t.Fatal("docs/architecture.md's layer table has no rows")
	}
	return rules
}

func matches(pattern, p string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "/*"); ok {
		return strings.HasPrefix(p, prefix+"/")
	}
	return pattern == p
}

// layerViolations checks pkgs against rules and the rules that hold
// whatever the table says; it returns one line per violation.
func layerViolations(rules []rule, pkgs []pkg) []string {
	var out []string
	for _, p := range pkgs {
		var r *rule
		for i := range rules {
			if slices.ContainsFunc(rules[i].packages, func(pattern string) bool { return matches(pattern, p.Path) }) {
				r = &rules[i]
				break
			}
		}
		if r == nil {
			out = append(out, fmt.Sprintf("%s has no row in the layer table of docs/architecture.md: add one listing what it may import", p.Path))
			continue
		}
		for _, imp := range p.Imports {
			if !r.anything && !slices.ContainsFunc(r.allowed, func(pattern string) bool { return matches(pattern, imp) }) {
				out = append(out, fmt.Sprintf("%s imports %s, which its row of the layer table in docs/architecture.md does not allow", p.Path, imp))
			}
			if v := blanketViolation(p.Path, imp); v != "" {
				out = append(out, v)
			}
		}
	}
	return out
}

// blanketViolation is the rule an import breaks whatever the table says,
// or "".
func blanketViolation(from, imp string) string {
	testOnly := from == "e2e" || strings.HasPrefix(from, "bench/") || from == "internal/testutil"
	switch {
	case imp == "internal/daemon" && !strings.HasPrefix(from, "cmd/"):
		return fmt.Sprintf("%s imports internal/daemon: only cmd/ assembles the daemons", from)
	case (imp == "internal/testutil" || imp == "internal/modelgen") && !testOnly:
		return fmt.Sprintf("%s imports %s: test helpers stay out of the product", from, imp)
	case (strings.HasPrefix(from, "xds/") || from == "bootstrap" || from == "envoy") &&
		strings.HasPrefix(imp, "controlplane/") && imp != "controlplane/model":
		return fmt.Sprintf("%s imports %s: translation and Envoy see nothing of the controller but its model", from, imp)
	}
	return ""
}

// TestLayers holds every package of the module to the layer table.
func TestLayers(t *testing.T) {
	rules := parseLayers(t, section(t, readArchitecture(t), "Layers"))
	pkgs := listPackages(t)
	if !slices.ContainsFunc(pkgs, func(p pkg) bool { return p.Path == "agent" && len(p.Imports) > 0 }) {
		t.Fatalf("go list found no agent package importing anything (%d packages): the test would check nothing", len(pkgs))
	}
	for _, v := range layerViolations(rules, pkgs) {
		t.Error(v)
	}
}

// TestLayersRefuseWrongWayImports: imports that once passed the lint (a
// deny-list with holes) each break the table now.
func TestLayersRefuseWrongWayImports(t *testing.T) {
	rules := parseLayers(t, section(t, readArchitecture(t), "Layers"))
	for _, imp := range [][2]string{
		{"controlplane/leader", "controlplane/api"},
		{"internal/connect", "envoy"},
		{"agent", "internal/testutil"},
		{"agent", "controlplane/configfile"},
		{"xds/server", "internal/devconsul"},
		{"controlplane/store", "internal/daemon"},
		{"xds/translate", "controlplane/dataplane"},
	} {
		if v := layerViolations(rules, []pkg{{Path: imp[0], Imports: []string{imp[1]}}}); len(v) == 0 {
			t.Errorf("%s importing %s breaks no rule", imp[0], imp[1])
		}
	}
	if v := layerViolations(rules, []pkg{{Path: "controlplane/brandnew"}}); len(v) != 1 || !strings.Contains(v[0], "no row") {
		t.Errorf("a package without a row: %v, want it refused", v)
	}
}
