//go:build e2e

package e2e

import (
	"testing"
	"time"
)

// TestLoadAwareIsRefusedInAPlaintextMesh: load_aware needs each node's
// picker on its inbound listener, which a mesh without mTLS has not. It
// used to be accepted there and do nothing; now the controller refuses it,
// naming the field and the fix, and stores nothing; the same backend
// without it is created.
func TestLoadAwareIsRefusedInAPlaintextMesh(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "ctl", []string{"--plaintext"})
	ctl.waitLeading(20 * time.Second)
	startAgentArgs(t, consul, "plain-node", "127.0.0.2", ctl.xdsAddr, 2, []string{"--plaintext"})
	env := []string{"SERVEMESH_SERVER=" + ctl.apiAddr}
	create := []string{"backend", "create", "llm", "--command", servemeshBin, "--arg", "demo-replica", "--arg", "--backend", "--arg", "llm",
		"--arg", "--listen=${HOST}:${PORT}", "--num-replicas", "1"}
	expectCLI(t, env, 1, `backend "llm" config.load_aware`, append(create, "--load-aware")...)
	expectCLI(t, env, 1, "remove load_aware, or run the controller and agents with mTLS (without --plaintext)", append(create, "--load-aware")...)
	expectCLI(t, env, 1, `backend "llm" is not registered`, "backend", "get", "llm")
	expectCLI(t, env, 0, "llm", create...)
}
