package configfile

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

const good = `
backends: [{name: a}, {name: b}]
endpoints: [{name: e, route: /e, traffic: {a: 1}}]
`

func TestWatcherAppliesChangesAndReportsBadEdits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	m, sum, err := LoadForWatch(path)
	if err != nil || len(m.Endpoints) != 1 {
		t.Fatalf("LoadForWatch = %v, %v", m, err)
	}
	applied := make(chan *meshspec.Model, 4)
	var logs testutil.SyncBuffer
	w := &Watcher{Path: path, Interval: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Apply: func(m *meshspec.Model) error { applied <- m; return nil }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx, sum) }()

	select {
	case <-applied:
		t.Fatal("the initial content was applied twice")
	case <-time.After(100 * time.Millisecond):
	}

	// A file caught empty (an in-place save, half done) is never applied.
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "the file is empty") {
		if time.Now().After(deadline) {
			t.Fatalf("the empty file was not reported; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case m := <-applied:
		t.Fatalf("an empty file was applied as %+v", m)
	default:
	}

	// An invalid edit is logged and not applied.
	bad := strings.Replace(good, "{a: 1}", "{a: 0.5}", 1)
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "sum to 1") {
		if time.Now().After(deadline) {
			t.Fatalf("the invalid edit was not reported; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case m := <-applied:
		t.Fatalf("an invalid model was applied: %+v", m)
	default:
	}

	// A valid edit, saved by rename as editors do, is applied.
	next := strings.Replace(good, "{a: 1}", "{a: 0.25, b: 0.75}", 1)
	tmp := path + ".swp"
	if err := os.WriteFile(tmp, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-applied:
		if m.Endpoints[0].Traffic["b"] != 0.75 {
			t.Fatalf("applied %+v, want the new weights", m.Endpoints[0].Traffic)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a valid edit was not applied")
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(path, []byte("backends: [{name: a, bogus: 1}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("got %v, want an error naming the file and the unknown field", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("a missing file loaded")
	}
}

// TestHTTPRoutesInAConfigFile: a config's other YAML documents may be
// Gateway API HTTPRoutes, each an endpoint validated with the rest; a
// second servemesh document, or an HTTPRoute servemesh cannot serve, is
// refused naming its document and line.
func TestHTTPRoutesInAConfigFile(t *testing.T) {
	const route = `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r}
spec:
  rules:
    - matches: [{path: {value: /r}}]
      backendRefs: [{name: a, weight: 3}, {name: b}]
`
	s, err := ParseSpec([]byte(good + "---\n" + route))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Endpoints) != 2 || s.Endpoints[1].Name != "r" || s.Endpoints[1].Traffic["a"] != 0.75 || s.Endpoints[1].Route != "/r" {
		t.Fatalf("endpoints %+v", s.Endpoints)
	}
	for _, tc := range []struct{ file, want string }{
		{good + "---\n" + good, "document 2 (line 5): a second servemesh document"},
		{good + "---\n# the route\n---\n" + strings.Replace(route, "[{path: {value: /r}}]", "[{path: {type: Exact, value: /r}}]", 1),
			`document 2 (line 7): HTTPRoute "r":` + "\n  - spec.rules[0].matches[0].path.type: Exact"},
		{"backends: [{name: a}]\n---\n" + strings.Replace(route, "name: a, weight: 3", "name: zz", 1), `backend "zz" is not defined`},
	} {
		if _, err := ParseSpec([]byte(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v; want an error with %q", err, tc.want)
		}
	}
}
