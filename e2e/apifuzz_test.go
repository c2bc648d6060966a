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

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

// schemathesisBin is the API fuzzer `make tools` installs from PyPI.
func schemathesisBin(t *testing.T) string {
	t.Helper()
	bin, err := filepath.Abs("../.tools/bin/schemathesis")
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		t.Fatalf("Schemathesis is required (`make tools` installs it from PyPI): %v", err)
	}
	return bin
}

// TestAPIFuzz runs Schemathesis, a property-based fuzzer, against a live
// controller with the real Consul, from the controller's own OpenAPI
// description: no answer is a 5xx, every status and body is one the
// description gives, and the stored state stays valid (a controller
// started afresh loads it, which validates it). SERVEMESH_API_FUZZ_TIME
// (seconds; make fuzz sets more) bounds the run: 20 s by default.
func TestAPIFuzz(t *testing.T) {
	t.Parallel()
	bin := schemathesisBin(t)
	budget := os.Getenv("SERVEMESH_API_FUZZ_TIME")
	if budget == "" {
		budget = "20"
	}
	consul := startConsul(t)
	token := "fuzz-token-0123456789abcdef"
	ctl := startController(t, consul, "fuzz", []string{"--plaintext", "--token-file", writeToken(t, token)})
	ctl.waitLeading(20 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A few objects for the fuzzer to find and change.
	c := ctl.client(token)
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpec{Name: "b1", Replicas: []meshspec.ReplicaSpec{{Address: "127.0.0.1:9"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "e1", Route: "/e1", Traffic: map[string]float64{"b1": 1}}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "run", "http://"+ctl.apiAddr+api.OpenAPIPath,
		"--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
		"--max-time", budget, "--seed", "1", "--workers", "1", "--request-timeout", "10",
		"-H", "Authorization: Bearer "+token, "--no-color")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("schemathesis: %v\n%s", err, out)
	}
	t.Logf("schemathesis:\n%s", lastLines(string(out), 15))

	// The stored state is valid: a controller started afresh loads it.
	ctl.kill()
	ctl.start()
	ctl.waitLeading(20 * time.Second)
	c = ctl.client(token)
	backends, err := c.ListBackends(ctx)
	if err != nil {
		t.Fatalf("after the fuzzing, a fresh controller reads no backends: %v", err)
	}
	endpoints, err := c.ListEndpoints(ctx)
	if err != nil {
		t.Fatalf("after the fuzzing, a fresh controller reads no endpoints: %v", err)
	}
	if err := (&meshspec.Model{Backends: backends, Endpoints: endpoints}).Validate(); err != nil {
		t.Fatalf("after the fuzzing, the stored state is not valid: %v", err)
	}
	t.Logf("after the fuzzing: %d backends and %d endpoints, valid", len(backends), len(endpoints))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
