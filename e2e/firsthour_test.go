//go:build e2e

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestFirstHour runs the CLI as a new user would against a live controller:
// an update a backend's kind cannot take is refused with the fix, the
// addresses of a backend of listed replicas change with --replica, a dry
// run shows each field it would change, and completion offers the names
// the controller holds.
func TestFirstHour(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "first-hour", nil)
	ctl.waitLeading(20 * time.Second)
	sm := func(args ...string) (int, string, string) {
		t.Helper()
		return cli(t, nil, append(args, "--server", ctl.apiAddr)...)
	}
	mustRun := func(args ...string) string {
		t.Helper()
		code, out, errOut := sm(args...)
		if code != 0 {
			t.Fatalf("servemesh %v: code %d, stderr %s", args, code, errOut)
		}
		return out
	}
	mustRun("backend", "create", "v1", "--replica", "127.0.0.1:9001")
	mustRun("backend", "create", "v2", "--replica", "127.0.0.1:9002")
	mustRun("endpoint", "create", "model", "--route", "/model", "--traffic", "v1=1")
	backend := func(name string) meshspec.Backend {
		t.Helper()
		var b meshspec.Backend
		if err := json.Unmarshal([]byte(mustRun("backend", "get", name, "-o", "json")), &b); err != nil {
			t.Fatal(err)
		}
		return b
	}

	t.Run("an update the backend's kind cannot take is refused with the fix", func(t *testing.T) {
		for _, flag := range [][]string{{"--num-replicas", "5"}, {"--cpus", "3"}, {"--memory-mb", "64"}} {
			code, _, errOut := sm(append([]string{"backend", "update", "v1"}, flag...)...)
			field := strings.ReplaceAll(strings.TrimPrefix(flag[0], "--"), "-", "_")
			if code != 1 || !strings.Contains(errOut, field+": is set on a backend of listed replicas") || !strings.Contains(errOut, "--replica") {
				t.Errorf("backend update v1 %v: code %d, stderr %q; want it refused, naming %s, the kind and the fix", flag, code, errOut, field)
			}
		}
		if b := backend("v1"); b.Config.NumReplicas != 0 || b.Config.CPUs != 0 || b.Config.MemoryMB != 0 {
			t.Fatalf("a refused update was stored: %+v", b.Config)
		}
	})

	t.Run("--replica sets the addresses of a backend of listed replicas", func(t *testing.T) {
		if out := mustRun("backend", "update", "v2", "--replica", "127.0.0.1:9003", "--replica", "127.0.0.1:9004"); !strings.Contains(out, "backend v2 updated") {
			t.Fatalf("update: %q", out)
		}
		if b := backend("v2"); len(b.Replicas) != 2 || b.Replicas[0].Address != "127.0.0.1:9003" || b.Replicas[1].Address != "127.0.0.1:9004" {
			t.Fatalf("v2's replicas: %+v", b.Replicas)
		}
	})

	t.Run("a dry run shows each field it would change, and changes nothing", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "mesh.yaml")
		spec := `
backends:
  - {name: v1, replicas: [{address: "127.0.0.1:9001"}]}
  - {name: v2, replicas: [{address: "127.0.0.1:9003"}, {address: "127.0.0.1:9004"}]}
endpoints:
  - {name: model, route: /model, traffic: {v1: 0.3, v2: 0.7}}
`
		if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
		out := mustRun("apply", "-f", file, "--dry-run")
		for _, want := range []string{"(dry run) would update endpoint model", "    traffic.v1: 1 -> 0.3", "    traffic.v2: (none) -> 0.7"} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("dry run output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "backend") {
			t.Errorf("the dry run lists backends the file does not change:\n%s", out)
		}
		var res struct {
			Diff []struct {
				Action, Kind, Name string
				Fields             []struct {
					Field    string
					From, To json.RawMessage
				}
			}
		}
		if err := json.Unmarshal([]byte(mustRun("apply", "-f", file, "--dry-run", "-o", "json")), &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Diff) != 1 || len(res.Diff[0].Fields) != 2 || res.Diff[0].Fields[0].Field != "traffic.v1" || string(res.Diff[0].Fields[0].To) != "0.3" {
			t.Fatalf("dry run as JSON: %+v", res.Diff)
		}
		if out := mustRun("endpoint", "get", "model"); !strings.Contains(out, "v1=1") {
			t.Fatalf("the dry run changed the endpoint:\n%s", out)
		}
	})

	t.Run("completion offers the names the controller holds", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want []string
		}{
			{[]string{"backend", "update", ""}, []string{"v1", "v2"}},
			{[]string{"backend", "get", "v"}, []string{"v1", "v2"}},
			{[]string{"endpoint", "delete", ""}, []string{"model"}},
			{[]string{"traffic", "set", ""}, []string{"model"}},
			{[]string{"traffic", "set", "model", "v1=0.5", ""}, []string{"v1=", "v2="}},
			{[]string{"shadow", "set", "model", "v"}, []string{"v1=", "v2="}},
		} {
			// The word being completed comes last, after --server.
			last := len(tc.args) - 1
			args := append(append([]string{"__complete"}, tc.args[:last]...), "--server", ctl.apiAddr, tc.args[last])
			_, out, errOut := cli(t, nil, args...)
			var got []string
			for _, line := range strings.Split(out, "\n") {
				if line != "" && !strings.HasPrefix(line, ":") && !strings.HasPrefix(line, "Completion ended") {
					got = append(got, line)
				}
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("completing %q: %q (stderr %q), want %q", tc.args, got, errOut, tc.want)
			}
		}
	})

	t.Run("status marks the replicas of a stopped agent, and placing says no node is connected", func(t *testing.T) {
		n := startMTLSNode(t, consul, "first-hour-n1", "127.0.0.2", ctl.xdsAddr)
		mustRun("backend", "create", "p", "--command", servemeshBin, "--arg=demo-replica", "--arg=--backend", "--arg=p", "--arg=--listen", "--arg=${HOST}:${PORT}",
			"--health-path", "/", "--num-replicas", "1", "--cpus", "1")
		status := func() api.StatusReport {
			var r api.StatusReport
			if err := json.Unmarshal([]byte(mustRun("status", "-o", "json")), &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
		backendOf := func(r api.StatusReport) api.BackendStatus {
			for _, b := range r.Backends {
				if b.Name == "p" {
					return b
				}
			}
			t.Fatalf("status has no backend p: %+v", r.Backends)
			return api.BackendStatus{}
		}
		testutil.WaitFor(t, 30*time.Second, "p's replica to be ready", func() bool { return backendOf(status()).Ready == 1 })
		if log := n.stderr.String(); !strings.Contains(log, `msg="agent status listener serving" cmd=agent status=`+n.metr) {
			t.Errorf("the agent does not log its status listener's address %s:\n%s", n.metr, log)
		}
		n.killNode(t) // kill -9 of the agent, its replica and Envoy: the node is gone
		testutil.WaitFor(t, 10*time.Second, "status to mark p's replica not heard from", func() bool {
			r := status()
			b := backendOf(r)
			return b.Ready == 0 && b.Unheard == 1 && b.Running == 1 &&
				strings.Contains(strings.Join(r.Problems, "\n"), `backend "p": 1 of 1 placed replicas are not ready; 1 not heard from`)
		})
		if out := mustRun("status"); !strings.Contains(out, "0/1/1") {
			t.Errorf("the status table does not show p as 0 ready of 1 running:\n%s", out)
		}
		testutil.WaitFor(t, 10*time.Second, "scaling p to say no node is connected", func() bool {
			code, _, errOut := sm("backend", "update", "p", "--num-replicas", "2")
			return code == 1 && strings.Contains(errOut, "no node is connected") && strings.Contains(errOut, "servemesh agent")
		})
	})

	t.Run("the controller says it stopped", func(t *testing.T) {
		if err := ctl.child.Stop(15 * time.Second); err != nil {
			t.Logf("controller exit: %v", err)
		}
		if !strings.Contains(ctl.stderr.String(), `msg="controller stopped"`) {
			t.Errorf("the controller logged nothing at shutdown:\n%s", ctl.stderr.String())
		}
	})
}
