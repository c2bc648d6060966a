package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// definedMetrics finds every servemesh_* metric name the Go code defines.
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	defined := map[string]bool{}
	decl := regexp.MustCompile(`"(servemesh_[a-z_]+)"`)
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".tools" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return defined
}

func TestDashboardQueriesOnlyDefinedMetrics(t *testing.T) {
	queries, err := DashboardQueries("grafana/servemesh.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(queries) < 10 {
		t.Fatalf("the dashboard has %d queries", len(queries))
	}
	defined := definedMetrics(t)
	used := regexp.MustCompile(`servemesh_[a-z_]+`)
	for _, q := range queries {
		for _, name := range used.FindAllString(q.Expr, -1) {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
			if !defined[name] && !defined[base] {
				t.Errorf("panel %q queries %s, which servemesh does not define", q.Panel, name)
			}
		}
	}
}
