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
	"strconv"
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
	case imp == "daemon" && !strings.HasPrefix(from, "cmd/"):
		return fmt.Sprintf("%s imports daemon: only cmd/ assembles the daemons", from)
	case (imp == "internal/testutil" || imp == "internal/modelgen") && !testOnly:
		return fmt.Sprintf("%s imports %s: test helpers stay out of the product", from, imp)
	case (strings.HasPrefix(from, "xds/") || from == "bootstrap" || from == "envoy" || from == "meshspec" || from == "wire" || from == "ir" ||
		from == "agent" || strings.HasPrefix(from, "agent/")) && strings.HasPrefix(imp, "controlplane/"):
		return fmt.Sprintf("%s imports %s: the vocabulary, the node side, translation and Envoy see nothing of the controller's tree (their types are meshspec's and wire's)", from, imp)
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
		{"xds/server", "dev/devconsul"},
		{"controlplane/store", "daemon"},
		{"xds/translate", "controlplane/dataplane"},
		{"agent", "controlplane/store"},
		{"agent/picker", "controlplane/model"},
	} {
		if v := layerViolations(rules, []pkg{{Path: imp[0], Imports: []string{imp[1]}}}); len(v) == 0 {
			t.Errorf("%s importing %s breaks no rule", imp[0], imp[1])
		}
	}
	if v := layerViolations(rules, []pkg{{Path: "controlplane/brandnew"}}); len(v) != 1 || !strings.Contains(v[0], "no row") {
		t.Errorf("a package without a row: %v, want it refused", v)
	}
}

var (
	stepLine = regexp.MustCompile(`^(\d+)\. (.*)`)
	// citation is a doc comment's "docs/architecture.md ... steps 2, 4 to 6
	// and 9", within one sentence.
	citation = regexp.MustCompile(`docs/architecture\.md[^.]*?\bsteps? (\d+(?:(?:, | and | to )\d+)*)`)
	number   = regexp.MustCompile(`\d+|to`)
)

// parseFlow returns the numbered steps of the flow, by number.
func parseFlow(t *testing.T, text string) map[int]string {
	t.Helper()
	steps := map[int]string{}
	current := 0
	for _, line := range strings.Split(text, "\n") {
		if m := stepLine.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1]) // digits, by the pattern
			if n != current+1 {
				t.Fatalf("the flow's step %d follows step %d: number the steps 1, 2, 3, ...", n, current)
			}
			current, steps[n] = n, m[2]
			continue
		}
		if current > 0 && strings.HasPrefix(line, "   ") {
			steps[current] += " " + strings.TrimSpace(line)
		}
	}
	if len(steps) == 0 {
		t.Fatal("the flow in docs/architecture.md has no numbered steps")
	}
	return steps
}

// cited returns the step numbers doc cites, and whether it cites any.
func cited(doc string) ([]int, bool) {
	m := citation.FindStringSubmatch(doc)
	if m == nil {
		return nil, false
	}
	var out []int
	tokens := number.FindAllString(m[1], -1)
	for i := 0; i < len(tokens); i++ {
		n, _ := strconv.Atoi(tokens[i]) // digits, by the pattern
		if i+2 < len(tokens) && tokens[i+1] == "to" {
			last, _ := strconv.Atoi(tokens[i+2])
			for k := n; k <= last; k++ {
				out = append(out, k)
			}
			i += 2
			continue
		}
		out = append(out, n)
	}
	return out, true
}

// docComment returns the text of the package comment in dir's doc.go, its
// lines joined, or "" if there is none.
func docComment(dir string) string {
	b, err := os.ReadFile(dir + "/doc.go")
	if err != nil {
		return ""
	}
	var lines []string
	for _, line := range strings.Split(string(b), "\n") {
		if text, ok := strings.CutPrefix(line, "//"); ok {
			lines = append(lines, strings.TrimSpace(text))
		}
	}
	return strings.Join(lines, " ")
}

// TestFlow holds the numbered flow of docs/architecture.md and the doc
// comments that cite it to each other and to the code.
func TestFlow(t *testing.T) {
	steps := parseFlow(t, section(t, readArchitecture(t), "From a command to Envoy serving it"))
	pkgs := listPackages(t)
	exists := map[string]pkg{}
	for _, p := range pkgs {
		exists[p.Path] = p
	}
	naming := map[string][]int{} // package: the steps that name it
	for n := 1; n <= len(steps); n++ {
		for _, m := range backticked.FindAllStringSubmatch(steps[n], -1) {
			if !packagePath.MatchString(m[1]) {
				continue
			}
			if _, ok := exists[m[1]]; !ok {
				t.Errorf("step %d names `%s`, which is not a package of the module", n, m[1])
				continue
			}
			if !slices.Contains(naming[m[1]], n) {
				naming[m[1]] = append(naming[m[1]], n)
			}
		}
	}
	off := offTheFlow(t, exists)
	for _, p := range pkgs {
		want, composite := naming[p.Path], false
		if len(want) == 0 {
			want, composite = subPackageSteps(p.Path, naming), true
		}
		if len(want) > 0 && off[p.Path] {
			t.Errorf("%s is listed under \"Off the flow\" in docs/architecture.md, but the flow names it (or its sub-packages) in steps %v", p.Path, want)
		}
		if len(want) == 0 {
			if !off[p.Path] {
				t.Errorf("%s is neither named by a step of the flow nor listed under \"Off the flow\" in docs/architecture.md: add it to one", p.Path)
			}
			continue
		}
		got, ok := cited(docComment(p.Dir))
		what := "the steps that name it"
		if composite {
			what = "the steps that name its sub-packages"
		}
		switch {
		case !ok:
			t.Errorf("%s/doc.go cites no step of the flow; say \"In the flow of docs/architecture.md: steps %v.\"", p.Path, want)
		case !slices.Equal(got, want):
			t.Errorf("%s/doc.go cites steps %v of docs/architecture.md, but %s are %v", p.Path, got, what, want)
		}
	}
	for _, p := range pkgs {
		got, _ := cited(docComment(p.Dir))
		for _, n := range got {
			if n < 1 || n > len(steps) {
				t.Errorf("%s/doc.go cites step %d; the flow has steps 1 to %d", p.Path, n, len(steps))
			}
		}
	}
}

// subPackageSteps are the steps that name p's sub-packages, sorted: what
// a composite package's doc cites.
func subPackageSteps(p string, naming map[string][]int) []int {
	var out []int
	for q, steps := range naming {
		if strings.HasPrefix(q, p+"/") {
			for _, n := range steps {
				if !slices.Contains(out, n) {
					out = append(out, n)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// offTheFlow are the packages the "Off the flow" section lists: those no
// request or change goes through (helpers, tests, benchmarks, tools).
func offTheFlow(t *testing.T, exists map[string]pkg) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, m := range backticked.FindAllStringSubmatch(section(t, readArchitecture(t), "Off the flow"), -1) {
		if !packagePath.MatchString(m[1]) {
			continue
		}
		if strings.HasSuffix(m[1], "/*") {
			for q := range exists {
				if matches(m[1], q) {
					out[q] = true
				}
			}
			continue
		}
		if _, ok := exists[m[1]]; !ok {
			t.Errorf("\"Off the flow\" in docs/architecture.md lists `%s`, which is not a package of the module", m[1])
		}
		out[m[1]] = true
	}
	return out
}

func TestCited(t *testing.T) {
	for doc, want := range map[string][]int{
		"In the flow of docs/architecture.md: step 4.":                {4},
		"In the flow of docs/architecture.md: steps 2 and 11.":        {2, 11},
		"In the flow of docs/architecture.md: steps 1, 4 to 6 and 9.": {1, 4, 5, 6, 9},
		"See docs/architecture.md. Step 3 is elsewhere.":              nil,
	} {
		if got, _ := cited(doc); !slices.Equal(got, want) {
			t.Errorf("cited(%q) = %v, want %v", doc, got, want)
		}
	}
}
