package agent

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/wire"
)

// TestReplicaLogsRotate: a replica that writes 5 MiB leaves at most its
// current log and two rotated ones, each at most the cap (logs used to grow
// forever).
func TestReplicaLogsRotate(t *testing.T) {
	a := testAgent(t)
	dir := a.workDir
	r := &replica{a: a, backend: "b", tag: "b#000001", port: 1, log: a.log,
		spec:   model.ProcessSpec{Command: "/usr/bin/head", Args: []string{"-c", "5242880", "/dev/zero"}},
		output: &lumberjack.Logger{Filename: filepath.Join(dir, "b-000001.log"), MaxSize: 1, MaxBackups: 2}}
	child, err := r.startProcess()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
	_ = r.output.Close()
	var files []string
	deadline := time.Now().Add(5 * time.Second) // lumberjack removes old files in the background
	for files, _ = filepath.Glob(filepath.Join(dir, "b-000001*.log")); len(files) > 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		files, _ = filepath.Glob(filepath.Join(dir, "b-000001*.log"))
	}
	var total int64
	for _, f := range files {
		info, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if info.Size() > 1<<20 {
			t.Errorf("%s is %d bytes, over the 1 MiB cap", f, info.Size())
		}
		total += info.Size()
	}
	if len(files) < 2 || len(files) > 3 || total > 3<<20 {
		t.Fatalf("%d log files, %d bytes in all; want the log and at most two rotated ones", len(files), total)
	}
}

// testAgent is an agent for running replicas directly, with its work dir.
func testAgent(t *testing.T) *Agent {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil { // a replica run as nobody reads nothing here, but may need to enter it
		t.Fatal(err)
	}
	return &Agent{node: wire.NodeInfo{ID: "n1", Address: "127.0.0.1"}, listenHost: "127.0.0.1", workDir: dir, logMaxMB: 1,
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// runOnce runs one replica of spec to its end and returns what it wrote.
func runOnce(t *testing.T, a *Agent, spec model.ProcessSpec, port int) string {
	t.Helper()
	logPath := filepath.Join(a.workDir, "once.log")
	r := &replica{a: a, backend: "b", tag: "b#000001", port: port, log: a.log, spec: spec,
		output: &lumberjack.Logger{Filename: logPath, MaxSize: 1}}
	child, err := r.startProcess()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
	_ = r.output.Close()
	out, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestReplicaEnvironmentHoldsNoAgentSecret: a replica's environment holds
// what its backend set and servemesh's variables, nothing of the agent's
// (every replica used to inherit CONSUL_HTTP_TOKEN).
func TestReplicaEnvironmentHoldsNoAgentSecret(t *testing.T) {
	t.Setenv("CONSUL_HTTP_TOKEN", "agent-secret-token")
	t.Setenv("SOME_AGENT_SETTING", "x")
	got := runOnce(t, testAgent(t), model.ProcessSpec{Command: "/usr/bin/env",
		Env: map[string]string{"MODEL": "v3", "ADDR": "${HOST}:${PORT}", "LITERAL": "$other"}}, 4321)
	for _, want := range []string{"MODEL=v3", "ADDR=127.0.0.1:4321", "LITERAL=${other}", "PORT=4321", "SERVEMESH_REPLICA_TAG=b#000001", "PATH="} {
		if !strings.Contains(got, want+"\n") && !strings.Contains(got, want) {
			t.Errorf("the replica's environment lacks %s:\n%s", want, got)
		}
	}
	for _, leaked := range []string{"CONSUL_HTTP_TOKEN", "agent-secret-token", "SOME_AGENT_SETTING"} {
		if strings.Contains(got, leaked) {
			t.Errorf("the agent's %s reached the replica:\n%s", leaked, got)
		}
	}
}

// TestReplicasRunUnprivileged: an agent running as root runs its replicas
// as nobody unless told otherwise (they ran as root).
func TestReplicasRunUnprivileged(t *testing.T) {
	cred, err := replicaUser("")
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		if cred != nil {
			t.Fatalf("an unprivileged agent changes its replicas' user to %d", cred.Uid)
		}
		return
	}
	if cred == nil || cred.Uid == 0 {
		t.Fatalf("a root agent runs replicas as %+v; want nobody", cred)
	}
	if _, err := replicaUser("no-such-user-xyz"); err == nil || !strings.Contains(err.Error(), "--run-as") {
		t.Fatalf("an unknown user: %v", err)
	}
	a := testAgent(t)
	a.runAs = cred
	out := runOnce(t, a, model.ProcessSpec{Command: "/usr/bin/id", Args: []string{"-u"}}, 1)
	if got := strings.TrimSpace(out); got != strconv.Itoa(int(cred.Uid)) {
		t.Fatalf("the replica ran as uid %q, want %d (nobody)", got, cred.Uid)
	}
	// Exactly nobody's groups: none of the agent's supplementary groups
	// (here adm and disk) is kept.
	if err := syscall.Setgroups([]int{4, 6}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Setgroups(nil) }()
	a.workDir = t.TempDir()
	_ = os.Chmod(a.workDir, 0o755)
	out = runOnce(t, a, model.ProcessSpec{Command: "/usr/bin/id", Args: []string{"-G"}}, 1)
	want, err := exec.Command("/usr/bin/id", "-G", "nobody").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(out); !slices.Equal(got, strings.Fields(string(want))) {
		t.Fatalf("the replica runs with groups %v, want nobody's %v", got, strings.Fields(string(want)))
	}
}
