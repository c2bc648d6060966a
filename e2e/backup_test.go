//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/dev/devconsul"
	"github.com/servemesh/servemesh/meshspec"
)

// TestExportRoundTripsAndABackupRestores: `servemesh export` writes the
// live state (static and process backends, a split, a shadow, match rules,
// retries, the mesh's tracing) as a config file that `apply -f` takes back
// with no change; a
// backup of the state's keys (`consul kv export servemesh/`) imported into
// a fresh Consul, and a Consul snapshot restored into a fresh cluster, each
// give a new controller the very same state (docs/upgrading.md says how).
func TestExportRoundTripsAndABackupRestores(t *testing.T) {
	t.Parallel()
	m := startTwoNodeMesh(t, "backup")
	ctx := context.Background()
	env := []string{"SERVEMESH_SERVER=" + m.ctl.apiAddr}
	if code, out, errOut := cli(t, env, "apply", "-f", "../examples/demo.yaml"); code != 0 {
		t.Fatalf("apply demo.yaml: %d %s%s", code, out, errOut)
	}
	m.createBackends(t, meshspec.Backend{Name: "bk", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1, MaxConcurrentQueries: 8},
		Process: demoProcess("bk", false)})
	if _, err := m.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "bk", Route: "/bk", Methods: []string{"GET", "POST"},
		Traffic: map[string]float64{"bk": 0.75, "model-v2": 0.25}, Shadows: map[string]float64{"model-v3-candidate": 0.1},
		Match: []meshspec.RequestMatch{{Header: "x-canary", Exact: "true", Backend: "model-v2"}},
		Retry: &meshspec.RetryPolicy{On: []string{"503"}, Attempts: 2}}); err != nil {
		t.Fatal(err)
	}
	pct := 2.5
	if _, err := m.c.SetTracing(ctx, &meshspec.Tracing{Collector: "127.0.0.1:4317", SamplingPercent: &pct}); err != nil {
		t.Fatal(err)
	}
	code, exported, errOut := cli(t, env, "export")
	if code != 0 || !strings.Contains(exported, "name: bk") || strings.Contains(exported, "placements") ||
		!strings.Contains(exported, "collector: 127.0.0.1:4317") || !strings.Contains(exported, "sampling_percent: 2.5") {
		t.Fatalf("servemesh export: exit %d\n%s%s", code, exported, errOut)
	}
	file := filepath.Join(t.TempDir(), "exported.yaml")
	if err := os.WriteFile(file, []byte(exported), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := cli(t, env, "apply", "-f", file); code != 0 || !strings.Contains(out, "no changes") {
		t.Fatalf("apply -f of the export: exit %d\n%s%s; want no changes", code, out, errOut)
	}
	if code, out, _ := cli(t, env, "validate", file); code != 0 {
		t.Fatalf("validate the export: %s", out)
	}

	consulBin, err := devconsul.Find()
	if err != nil {
		t.Fatal(err)
	}
	consul := func(addr string, stdin string, args ...string) string {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, consulBin, args...)
		cmd.Env = append(os.Environ(), "CONSUL_HTTP_ADDR="+addr)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("consul %v: %v", args, err)
		}
		return string(out)
	}
	backup := consul(m.consul.HTTPAddr, "", "kv", "export", "servemesh/")
	fresh := startConsul(t)
	consul(fresh.HTTPAddr, backup, "kv", "import", "-")
	restored := startController(t, fresh, "restored", nil)
	restored.waitLeading(30 * time.Second)
	code, again, errOut := cli(t, []string{"SERVEMESH_SERVER=" + restored.apiAddr}, "export")
	if code != 0 || again != exported {
		t.Fatalf("the controller on the restored Consul exports (exit %d, %s):\n%s\nwant what the first exported:\n%s", code, errOut, again, exported)
	}

	// A whole-cluster snapshot (consul snapshot save) restored into a
	// fresh cluster (a server with its data on disk, and a client agent
	// for the controller), the server restarted as docs/upgrading.md says,
	// gives a controller in the default mode the same state.
	snap := filepath.Join(t.TempDir(), "mesh.snap")
	consul(m.consul.HTTPAddr, "", "snapshot", "save", snap)
	cluster, err := devconsul.StartCluster(t.TempDir(), devconsul.ClusterOptions{ServerAddrs: []string{"127.0.0.90"}, ClientAddrs: []string{"127.0.0.91"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	consul(cluster.Servers[0].HTTPAddr, "", "snapshot", "restore", snap)
	cluster.Servers[0].Stop()
	if err := cluster.Servers[0].Restart(time.Minute); err != nil {
		t.Fatal(err)
	}
	fromSnapshot := startController(t, cluster.Clients["127.0.0.91"], "from-snapshot", nil)
	fromSnapshot.waitLeading(time.Minute)
	code, again, errOut = cli(t, []string{"SERVEMESH_SERVER=" + fromSnapshot.apiAddr}, "export")
	if code != 0 || again != exported {
		t.Fatalf("the controller on the cluster restored from a snapshot exports (exit %d, %s):\n%s\nwant:\n%s", code, errOut, again, exported)
	}
}
