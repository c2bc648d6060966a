package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// pythonBin is the project's Python with pytest, which `make tools`
// installs.
func pythonBin(t *testing.T) string {
	t.Helper()
	bin, err := filepath.Abs("../.tools/py-venv/bin/python")
	if err == nil {
		err = exec.CommandContext(context.Background(), bin, "-m", "pytest", "--version").Run()
	}
	if err != nil {
		t.Fatalf("the project's Python with pytest is required (`make tools` installs it): %v", err)
	}
	return bin
}

// TestPythonClient runs the Python client's pytest suite
// (clients/python/tests) against live controllers with the real Consul: a
// leader and a standby, with a token. The suite drives Ray Serve's verbs,
// checks the typed errors, and has the client follow the leader from the
// standby and past a dead server.
func TestPythonClient(t *testing.T) {
	python := pythonBin(t)
	consul := startConsul(t)
	tokenFile := writeToken(t, "python-token-0123456789abcdef")
	args := []string{"--plaintext", "--token-file", tokenFile}
	leader := startController(t, consul, "py-c1", args)
	leader.waitLeading(20 * time.Second)
	standby := startController(t, consul, "py-c2", args)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
	cmd.Dir = "../clients/python"
	cmd.Env = append(os.Environ(), "SERVEMESH_TEST_LEADER="+leader.apiAddr, "SERVEMESH_TEST_STANDBY="+standby.apiAddr,
		"SERVEMESH_TEST_TOKEN_FILE="+tokenFile)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pytest: %v\n%s", err, out)
	}
	t.Logf("pytest:\n%s", lastLines(string(out), 5))
}
