package daemon

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// TestDaemonsLeaveNoGoroutine starts and stops the controller, an agent,
// a demo replica and a file plane against a real Consul, each doing some work first, and
// checks that nothing any of them started outlives it (RunAgent used to
// start goroutines it never joined; a failed xDS server was only logged).
func TestDaemonsLeaveNoGoroutine(t *testing.T) {
	consul := testutil.MustStartConsul(t)
	t.Setenv("CONSUL_HTTP_ADDR", consul.HTTPAddr)
	before := goleak.IgnoreCurrent()

	ctx, cancel := context.WithCancel(context.Background())
	_, _, ctlDone := startLeadingController(ctx, t, ControllerOptions{ID: "leak", Plaintext: true})

	statusAddr, _ := proc.FreeAddr(ctx, "127.0.0.1")
	// The agent's work folder is in it, not in the source tree; replicas'
	// users pass through it.
	workDir := t.TempDir()
	for _, d := range []string{filepath.Dir(workDir), workDir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	agentDone := make(chan error, 1)
	go func() {
		agentDone <- RunAgent(ctx, quiet(), AgentOptions{Node: wire.NodeInfo{ID: "leak-node", Address: "127.0.0.1", CPUs: 1, MemoryMB: 512},
			NoEnvoy: true, Plaintext: true, ConsulPrefix: "servemesh", StatusListen: statusAddr, DrainGrace: time.Second,
			Envoy: envoy.Launcher{WorkDir: workDir}})
	}()
	testutil.WaitFor(t, 20*time.Second, "the agent's status listener", func() bool {
		resp, err := http.Get("http://" + statusAddr + "/metrics") //nolint:noctx // a test's probe
		if err == nil {
			_ = resp.Body.Close()
		}
		select {
		case err := <-agentDone:
			t.Fatalf("the agent exited: %v", err)
		default:
		}
		return err == nil
	})
	replicaAddr, _ := proc.FreeAddr(ctx, "127.0.0.1")
	replicaDone := make(chan error, 1)
	go func() { replicaDone <- RunDemoReplica(ctx, quiet(), "leak", "leak#1", replicaAddr, false, 0) }()
	testutil.WaitFor(t, 10*time.Second, "the demo replica", func() bool {
		resp, err := http.Get("http://" + replicaAddr + "/") //nolint:noctx // a test's probe
		if err == nil {
			_ = resp.Body.Close()
		}
		return err == nil
	})
	file, err := StartFilePlane(ctx, quiet(), FilePlaneOptions{ConfigPath: "../examples/demo.yaml", XDSListen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}

	cancel()
	for what, done := range map[string]<-chan error{"controller": ctlDone, "agent": agentDone, "demo replica": replicaDone} {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the %s stopped with %v", what, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the %s did not stop within 30 s of its context's end", what)
		}
	}
	file.Stop()
	http.DefaultClient.CloseIdleConnections()
	goleak.VerifyNone(t, before)
}

// startLeadingController runs a controller on loopback against the
// Consul of CONSUL_HTTP_ADDR, with o's other settings, until ctx ends, and
// waits until it leads. It returns its API client and address, and where
// RunController's result arrives.
func startLeadingController(ctx context.Context, t *testing.T, o ControllerOptions) (*api.Client, string, <-chan error) {
	t.Helper()
	apiAddr, _ := proc.FreeAddr(ctx, "127.0.0.1")
	o.APIListen, o.XDSListen, o.Advertise, o.ConsulPrefix = apiAddr, "127.0.0.1:0", apiAddr, "servemesh"
	o.DrainGrace, o.ReplaceAfter = time.Second, time.Second
	// Its log is printed if the test fails: a controller that does not
	// come to lead says why there.
	var logs testutil.SyncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller %s log:\n%s", o.ID, logs.String())
		}
	})
	done := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		err := RunController(ctx, slog.New(slog.NewTextHandler(&logs, nil)), o)
		exited <- err
		done <- err
	}()
	c := api.NewClient(apiAddr, "")
	testutil.WaitFor(t, 20*time.Second, "the controller to lead", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("the controller exited before it led: %v", err)
		default:
		}
		info, err := c.Leader(ctx)
		return err == nil && info.Leading
	})
	return c, apiAddr, done
}
