//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/backoff"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
)

func startConsul(t *testing.T) *testutil.Consul {
	t.Helper()
	c, err := testutil.StartConsul(t.TempDir())
	if err != nil {
		t.Fatalf("the real Consul is required (`make tools` installs it): %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("consul log tail:\n%s", c.LogTail())
		}
		c.Stop()
	})
	return c
}

// ctlProc is a `servemesh controller` subprocess that tests can kill and restart.
type ctlProc struct {
	t                *testing.T
	id               string
	apiAddr, xdsAddr string
	env              []string
	args             []string
	child            *proc.Process
	stderr           *testutil.SyncBuffer
	logs             []string // stderr of earlier incarnations
	bin              string   // the servemesh binary; servemeshBin when empty
}

func startController(t *testing.T, consul *testutil.Consul, id string, extraArgs []string, extraEnv ...string) *ctlProc {
	t.Helper()
	c := &ctlProc{t: t, id: id, apiAddr: freeAddr(t), xdsAddr: freeAddr(t), args: extraArgs,
		env: append([]string{"CONSUL_HTTP_ADDR=" + consul.HTTPAddr}, extraEnv...)}
	t.Cleanup(func() { // before it starts, so a start that fails prints its log too
		c.kill()
		failOnRace(t, "controller "+c.id, strings.Join(c.logs, "")+c.stderr.String())
		if t.Failed() {
			t.Logf("controller %s log:\n%s%s", c.id, strings.Join(c.logs, ""), c.stderr.String())
		}
	})
	c.start()
	return c
}

func (c *ctlProc) start() {
	c.t.Helper()
	if c.stderr != nil {
		c.logs = append(c.logs, c.stderr.String())
	}
	c.stderr = &testutil.SyncBuffer{}
	// The default mode (mTLS) unless the test chooses --plaintext, on a
	// Consul without ACLs unless it says --insecure-consul=false: a later
	// flag wins.
	args := []string{"controller", "--insecure-consul", "--id", c.id, "--api-listen", c.apiAddr, "--xds-listen", c.xdsAddr}
	if !slices.ContainsFunc(c.args, func(a string) bool { return strings.HasPrefix(a, "--allow-replica-cidr") }) {
		args = append(args, "--allow-replica-cidr", "127.0.0.0/8") // the tests' static replicas listen on loopback
	}
	args = append(args, c.args...)
	var err error
	c.child, err = proc.Start(proc.Spec{Path: orServemesh(c.bin), Args: args, Env: append(os.Environ(), c.env...), Stderr: c.stderr})
	if err != nil {
		c.t.Fatal(err)
	}
	health, client := "http://"+c.apiAddr+"/healthz", httpClient()
	if slices.Contains(c.args, "--api-tls-cert") { // the test checks the certificate itself
		health = "https://" + c.apiAddr + "/healthz"
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a readiness probe only
	}
	// The controller serves once it has its identity from Consul's CA,
	// asking again at the pauses of backoff.Consul (up to 10 s apart)
	// while Consul is not up: so up to that long after Consul is, on top
	// of what Consul takes. One that exits fails the test at once.
	testutil.WaitFor(c.t, 20*time.Second+backoff.Consul().Max, "controller "+c.id+" /healthz", func() bool {
		if c.child.Exited() {
			c.t.Fatalf("controller %s exited while starting", c.id)
		}
		r := do(client, "GET", health, "")
		return r.err == nil && r.status == 200
	})
}

// orServemesh is bin, or the servemesh binary under test when empty.
func orServemesh(bin string) string {
	if bin == "" {
		return servemeshBin
	}
	return bin
}

func (c *ctlProc) kill() {
	if c.child == nil {
		return
	}
	_ = c.child.Kill()
}

func (c *ctlProc) exited() bool {
	select {
	case <-c.child.Done():
		return true
	default:
		return false
	}
}

func (c *ctlProc) client(token string) *api.Client { return api.NewClient(c.apiAddr, token) }

// waitLeading waits until this controller leads, and reports how long it took.
func (c *ctlProc) waitLeading(timeout time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	testutil.WaitFor(c.t, timeout, "controller "+c.id+" to lead", func() bool {
		info, err := c.client(readFileOr(c.t, c.tokenFile())).Leader(context.Background())
		return err == nil && info.Leading
	})
	return time.Since(start)
}

func (c *ctlProc) tokenFile() string {
	for i, a := range c.args {
		if a == "--token-file" && i+1 < len(c.args) {
			return c.args[i+1]
		}
	}
	return ""
}

func readFileOr(t *testing.T, path string) string {
	t.Helper()
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// waitServingTLS waits until a controller serving HTTPS answers the CLI's
// status, checking its certificate against caFile.
func (c *ctlProc) waitServingTLS(t *testing.T, caFile string) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "controller "+c.id+" to answer over HTTPS", func() bool {
		code, _, _ := cli(t, nil, "status", "--server", "https://"+c.apiAddr, "--ca-file", caFile, "--failover-wait", "0")
		return code == 0
	})
}

// cli runs the servemesh CLI against a controller.
func cli(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return cliWithInput(t, env, "", args...)
}

// cliWithInput is cli with stdin as the command's standard input.
func cliWithInput(t *testing.T, env []string, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), servemeshBin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code = 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

func writeToken(t *testing.T, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
