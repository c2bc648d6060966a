package docs

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// layoutRow is one row of DEVELOPING.md's layout table: its folders and
// the names its description gives in backticks.
type layoutRow struct {
	folders, names []string
}

var subName = regexp.MustCompile(`^[a-z][a-z0-9]*$`)

// parseLayout reads the table of DEVELOPING.md's "## Layout" section.
func parseLayout(t *testing.T) []layoutRow {
	t.Helper()
	b, err := os.ReadFile("../DEVELOPING.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []layoutRow
	for _, line := range strings.Split(section(t, string(b), "Layout"), "\n") {
		cells := strings.Split(strings.Trim(line, "| "), "|")
		if !strings.HasPrefix(line, "| `") || len(cells) != 2 {
			continue
		}
		var r layoutRow
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			r.folders = append(r.folders, strings.TrimSuffix(m[1], "/"))
		}
		for _, m := range backticked.FindAllStringSubmatch(cells[1], -1) {
			if subName.MatchString(m[1]) {
				r.names = append(r.names, m[1])
			}
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatal("DEVELOPING.md's layout table has no rows")
	}
	return rows
}

// TestDevelopingLayout holds DEVELOPING.md's layout table to go list:
// every package is under a row's folder, and a row that names its
// folder's sub-packages names every one of them and no other.
func TestDevelopingLayout(t *testing.T) {
	rows := parseLayout(t)
	pkgs := listPackages(t)
	subs := map[string][]string{} // row folder: its packages' first names below it
	for _, p := range pkgs {
		if p.Path == "." {
			continue
		}
		folder := ""
		for _, r := range rows {
			for _, f := range r.folders {
				if (p.Path == f || strings.HasPrefix(p.Path, f+"/")) && len(f) > len(folder) {
					folder = f
				}
			}
		}
		if folder == "" {
			t.Errorf("package %s is under no folder of DEVELOPING.md's layout table: add a row, or name its folder in one", p.Path)
			continue
		}
		if rest, ok := strings.CutPrefix(p.Path, folder+"/"); ok {
			name, _, _ := strings.Cut(rest, "/")
			if !slices.Contains(subs[folder], name) {
				subs[folder] = append(subs[folder], name)
			}
		}
	}
	for _, r := range rows {
		if len(r.names) == 0 {
			continue // the row describes its folder without naming packages
		}
		var all []string
		for _, f := range r.folders {
			all = append(all, subs[f]...)
		}
		for _, s := range all {
			if !slices.Contains(r.names, s) {
				t.Errorf("DEVELOPING.md's layout row for %v names some of its packages but not `%s`", r.folders, s)
			}
		}
		for _, n := range r.names {
			if !slices.Contains(all, n) {
				t.Errorf("DEVELOPING.md's layout row for %v names `%s`, which is not a package under it", r.folders, n)
			}
		}
	}
}
