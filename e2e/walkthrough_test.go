//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/dev/devconsul"
)

// TestDeployWalkthrough runs deploy/walkthrough.sh, the commands of
// deploy/README.md, on loopback addresses as hosts: three Consul servers
// with ACLs bootstrapped and default deny, a Consul client agent on every
// other host, the policies and a token per daemon, the API's tokens and
// TLS certificate, two controllers and two nodes in the default mode; a
// backend created with the CLI answers through every node. Then `down`
// removes the nodes as a node is removed (agent stopped, --stop-all), and
// nothing of theirs is left running.
func TestDeployWalkthrough(t *testing.T) {
	t.Parallel()
	consulBin, err := devconsul.Find()
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	passThrough(t, work)
	env := append(os.Environ(), "SERVERS=127.0.0.50 127.0.0.51 127.0.0.52", "CONTROLLERS=127.0.0.60 127.0.0.61",
		"NODES=127.0.0.70 127.0.0.71", "WORK="+work, "CONSUL="+consulBin, "SERVEMESH="+servemeshBin, "SERVEMESH_ENVOY="+envoyBin,
		"CONSUL_HTTP_ADDR=", "CONSUL_HTTP_TOKEN=")
	run := func(step string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", "../deploy/walkthrough.sh", step)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			logs, _ := filepath.Glob(filepath.Join(work, "*", "*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("%s:\n%s", l, b)
			}
			t.Fatalf("walkthrough.sh %s: %v\n%s", step, err, out)
		}
		return string(out)
	}
	t.Cleanup(func() { run("down") })
	out := run("up")
	if !strings.Contains(out, "the mesh serves /hello on every node") || !strings.Contains(out, "hello") {
		t.Fatalf("walkthrough.sh up:\n%s", out)
	}
	// Issue 62, 4: its last status, asked of both controllers, listed no
	// node when the one that answered had none connected to it.
	for _, n := range []string{"n1", "n2"} {
		if !regexp.MustCompile(`(?m)^` + n + `\s+true`).MatchString(out) {
			t.Errorf("the walkthrough's status does not list node %s as connected:\n%s", n, out)
		}
	}
	// Issue 58, M8: the daemons' Consul tokens were 0644, in folders
	// anyone enters; the controller's writes the mesh's state.
	secrets, _ := filepath.Glob(filepath.Join(work, "*", "*.token"))
	keys, _ := filepath.Glob(filepath.Join(work, "*", "*key*.pem"))
	if len(secrets) < 2+2+4 { // a Consul token per controller and node, the API's four scopes
		t.Fatalf("the walkthrough wrote the secrets %v; want each daemon's Consul token and the API's tokens", secrets)
	}
	for _, f := range append(secrets, keys...) {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600, readable by its owner alone", f, err, fi.Mode().Perm())
		}
	}
	run("down")
	for _, n := range []string{"127.0.0.70", "127.0.0.71"} {
		if pid := envoyPid(t, filepath.Join(work, n, "agent")); pid != 0 {
			t.Errorf("node %s's Envoy (pid %d) outlived the node's removal", n, pid)
		}
	}
}
