package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// definedMetrics finds every servemesh_* name the Go code writes (its
// metrics among them).
func definedMetrics(t *testing.T) map[string]bool {
	return namesInCode(t, regexp.MustCompile(`"(servemesh_[a-z_]+)"`))
}

// declaredMetrics are the metrics the Go code declares: a collector's
// Name, a descriptor's.
func declaredMetrics(t *testing.T) map[string]bool {
	return namesInCode(t, regexp.MustCompile(`(?:Name: *|NewDesc\()"(servemesh_[a-z_]+)"`))
}

// namesInCode are decl's first group's matches in the Go code (not its
// tests).
func namesInCode(t *testing.T, decl *regexp.Regexp) map[string]bool {
	t.Helper()
	defined := map[string]bool{}
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

// TestMetricsReferenceIsTheCode: docs/metrics.md, the docs site's metrics
// reference, names every servemesh_* metric the code defines, and none it
// does not (a metric renamed or removed).
func TestMetricsReferenceIsTheCode(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, name := range regexp.MustCompile(`servemesh_[a-z_]+[a-z]`).FindAllString(string(text), -1) {
		documented[name] = true
	}
	defined := declaredMetrics(t)
	if len(defined) < 40 {
		t.Fatalf("found %d metrics declared in the code; the pattern is off", len(defined))
	}
	for name := range defined {
		if !documented[name] {
			t.Errorf("docs/metrics.md does not name %s, which servemesh defines", name)
		}
	}
	for name := range documented {
		if !defined[name] && !defined[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")] {
			t.Errorf("docs/metrics.md names %s, which servemesh does not define", name)
		}
	}
}
