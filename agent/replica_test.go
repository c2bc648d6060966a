package agent

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestReplicaLogsRotate: a replica that writes 5 MiB, a MiB at a time,
// while its log is rotated between its writes as the run loop rotates it,
// leaves its current log and two rotated ones, none past what it wrote
// between two checks (logs used to grow forever). The replica waits for
// each check before its next write (a marker file each way), so how busy
// the machine is does not decide how much lands between two checks.
func TestReplicaLogsRotate(t *testing.T) {
	a := testAgent(t)
	gate := t.TempDir()
	script := `for i in 1 2 3 4 5; do head -c 1048576 /dev/zero; touch "$0/wrote.$i"; ` +
		`while [ ! -e "$0/go.$i" ]; do sleep 0.01; done; done`
	r := &replica{a: a, backend: "b", tag: "b#000001", log: a.log,
		spec:   meshspec.ProcessSpec{Command: "/bin/sh", Args: []string{"-c", script, gate}},
		output: replicaLog{path: filepath.Join(a.workDir, "b-000001.log"), maxBytes: 1 << 19, backups: 2}}
	r.port.Store(1)
	child, err := r.startProcess()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Kill() })
	for i := 1; i <= 5; i++ {
		wrote := filepath.Join(gate, "wrote."+strconv.Itoa(i))
		testutil.WaitFor(t, 30*time.Second, wrote, func() bool { _, err := os.Stat(wrote); return err == nil })
		if err := r.output.rotate(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(gate, "go."+strconv.Itoa(i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(a.workDir, "b-000001.log*"))
	if len(files) != 3 {
		t.Fatalf("log files %v; want the log and two rotated ones", files)
	}
	for _, f := range files {
		info, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if info.Size() > 1<<20 {
			t.Errorf("%s is %d bytes; rotated at half a MiB after each write of a MiB, it holds one write at most", f, info.Size())
		}
	}
	if info, err := os.Stat(r.output.path); err != nil || info.Size() != 0 {
		t.Errorf("the log after its last rotation: %v, %v; want it truncated to nothing", info, err)
	}
}

// TestRotatedLogKeepsTheWriter: a process holding its log open writes on
// into it, from its start, after the agent rotates it (copy and truncate),
// and the rotated copy holds what it wrote before.
func TestRotatedLogKeepsTheWriter(t *testing.T) {
	l := replicaLog{path: filepath.Join(t.TempDir(), "r.log"), maxBytes: 4, backups: 2}
	f, err := l.open()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	_, _ = f.WriteString("before rotation\n")
	if err := l.rotate(); err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("after\n")
	now, _ := os.ReadFile(l.path)
	old, _ := os.ReadFile(l.backup(1))
	if string(now) != "after\n" || string(old) != "before rotation\n" {
		t.Fatalf("log %q, rotated %q", now, old)
	}
}

// testAgent is an agent for running replicas directly, with its work dir.
func testAgent(t *testing.T) *Agent {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // a replica run as nobody passes through to its own folder
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &Agent{node: wire.NodeInfo{ID: "n1", Address: "127.0.0.1"}, listenHost: "127.0.0.1", workDir: dir, logMaxMB: 1,
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), views: &nodeview.Latest{}, state: &ReplicaState{}}
}

// runOnce runs one replica of spec to its end and returns what it wrote.
func runOnce(t *testing.T, a *Agent, spec meshspec.ProcessSpec, port int) string {
	t.Helper()
	return runReplica(t, a, "b", spec, port)
}

// runReplica runs one replica of backend's spec to its end and returns
// what it wrote.
func runReplica(t *testing.T, a *Agent, backend string, spec meshspec.ProcessSpec, port int) string {
	t.Helper()
	logPath := filepath.Join(a.workDir, backend+"-once.log")
	r := &replica{a: a, backend: backend, tag: backend + "#000001", log: a.log, spec: spec,
		output: replicaLog{path: logPath, maxBytes: 1 << 20}}
	r.port.Store(int32(port))
	child, err := r.startProcess()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
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
	got := runOnce(t, testAgent(t), meshspec.ProcessSpec{Command: "/usr/bin/env",
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

// TestReplicasAreToldTheirMeshListener: a replica's environment names
// its node's mesh listener, where it calls the mesh's endpoints (the
// Python runtime's handles); none when the node has no mesh listener.
func TestReplicasAreToldTheirMeshListener(t *testing.T) {
	a := testAgent(t)
	if got := runOnce(t, a, meshspec.ProcessSpec{Command: "/usr/bin/env"}, 4321); strings.Contains(got, wire.MeshListenerEnv) {
		t.Errorf("a node without a mesh listener named one:\n%s", got)
	}
	a.meshListener = "127.0.0.1:15001"
	if got := runOnce(t, a, meshspec.ProcessSpec{Command: "/usr/bin/env"}, 4321); !strings.Contains(got, wire.MeshListenerEnv+"=127.0.0.1:15001\n") {
		t.Errorf("the replica's environment lacks its mesh listener:\n%s", got)
	}
}

// TestReplicasAreToldTheMeshsCollector: while the mesh traces, a
// replica's environment names its collector and the backend as its
// service, in the OpenTelemetry SDK's variables, unless the backend's own
// env says otherwise (issue 37: users had to copy the collector into
// every backend's env for the Python runtime's spans).
func TestReplicasAreToldTheMeshsCollector(t *testing.T) {
	traced := &meshspec.Model{Mesh: &meshspec.Mesh{Tracing: &meshspec.Tracing{Collector: "127.0.0.9:4317"}}}
	got := tracingEnv(traced, "summarizer", map[string]string{"MODEL": "v3"})
	want := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.9:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "summarizer"}
	if !maps.Equal(got, want) {
		t.Errorf("a traced mesh's replica gets %v; want %v", got, want)
	}
	for _, own := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"} {
		if got := tracingEnv(traced, "summarizer", map[string]string{own: "x"}); got != nil {
			t.Errorf("a backend setting %s also gets %v; want its own settings alone", own, got)
		}
	}
	for _, m := range []*meshspec.Model{nil, {}, {Mesh: &meshspec.Mesh{}}} {
		if got := tracingEnv(m, "summarizer", nil); got != nil {
			t.Errorf("a mesh that traces nothing (%+v) gives its replicas %v", m, got)
		}
	}
	// Through a replica's real environment: the backend's settings win.
	a := testAgent(t)
	a.views.Set(nodeview.New(traced, a.node.ID))
	out := runOnce(t, a, meshspec.ProcessSpec{Command: "/usr/bin/env", Env: map[string]string{"OTEL_SERVICE_NAME": "mine"}}, 4321)
	for _, w := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.9:4317\n", "OTEL_SERVICE_NAME=mine\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("the replica's environment lacks %q:\n%s", w, out)
		}
	}
}

// TestReplicasRunUnprivileged: an agent running as root runs each
// backend's replicas as a user and group of their own, with no
// supplementary group, unless told otherwise (they ran as root, then all
// as nobody: issue 34, one replica read another backend's secrets from
// /proc/<pid>/environ and planted files in its folder).
func TestReplicasRunUnprivileged(t *testing.T) {
	cred, uids, err := replicaUsers("", UIDRange{})
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		if cred != nil || uids.Count != 0 {
			t.Fatalf("an unprivileged agent changes its replicas' user to %+v, %v", cred, uids)
		}
		if _, _, err := replicaUsers("", UIDRange{First: 5000, Count: 10}); err == nil || !strings.Contains(err.Error(), "root") {
			t.Fatalf("--replica-uids without root: %v", err)
		}
		return
	}
	if cred != nil || uids != DefaultUIDs {
		t.Fatalf("a root agent runs replicas as %+v, %v; want a user per backend from %v", cred, uids, DefaultUIDs)
	}
	if _, err := replicaUser("no-such-user-xyz"); err == nil || !strings.Contains(err.Error(), "--run-as") {
		t.Fatalf("an unknown user: %v", err)
	}
	if _, _, err := replicaUsers("nobody", DefaultUIDs); err == nil {
		t.Fatal("--run-as and --replica-uids together were taken")
	}
	a := testAgent(t)
	a.uids = UIDRange{First: 1_000_050_000, Count: 2}
	if a.users, err = loadBackendUsers(a.uids, a.workDir); err != nil {
		t.Fatal(err)
	}
	// Exactly the backend's own group: none of the agent's supplementary
	// groups (here adm and disk) is kept.
	if err := syscall.Setgroups([]int{4, 6}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Setgroups(nil) }()
	ids := map[string]string{}
	for _, backend := range []string{"b", "c"} {
		ids[backend] = strings.TrimSpace(runReplica(t, a, backend, meshspec.ProcessSpec{Command: "/bin/sh", Args: []string{"-c", "id -u; id -G"}}, 1))
	}
	if ids["b"] != "1000050000\n1000050000" || ids["c"] != "1000050001\n1000050001" {
		t.Fatalf("backends b and c ran as %q and %q; want users 1000050000 and 1000050001, each with its own group only", ids["b"], ids["c"])
	}
	// The next agent gives each backend the same user (its folder and the
	// replica it adopts are that user's), and a full range is said so.
	next, err := loadBackendUsers(a.uids, a.workDir)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := next.credential("c"); err != nil || c.Uid != 1_000_050_001 {
		t.Fatalf("backend c's user after a restart: %+v, %v", c, err)
	}
	if _, err := next.credential("d"); err == nil || !strings.Contains(err.Error(), "larger range") {
		t.Fatalf("a third backend in a range of two: %v", err)
	}
	// One backend cannot read another's environment or enter its folder.
	out, err := exec.CommandContext(context.Background(), "/usr/bin/setpriv", "--reuid=1000050001", "--regid=1000050001", "--clear-groups",
		"/bin/ls", filepath.Join(a.workDir, wire.ReplicaServiceID("b#000001"))).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Fatalf("backend c's user listed backend b's folder: %v %s", err, out)
	}
}

// TestReplicaStartsInAFolderOfItsOwn: a replica used to start in the
// agent's working folder and be told SERVEMESH_AGENT_DIR; now it starts in
// a folder only its user may enter, and nothing in its environment names
// the agent's work folder.
func TestReplicaStartsInAFolderOfItsOwn(t *testing.T) {
	a := testAgent(t)
	if os.Geteuid() == 0 {
		a.runAs = &syscall.Credential{Uid: 65534, Gid: 65534}
	}
	out := runOnce(t, a, meshspec.ProcessSpec{Command: "/bin/sh", Args: []string{"-c", "pwd; env"}}, 1)
	want := filepath.Join(a.workDir, wire.ReplicaServiceID("b#000001"))
	first, env, _ := strings.Cut(out, "\n")
	if first != want {
		t.Fatalf("the replica started in %q, want %q", first, want)
	}
	for _, kv := range strings.Split(env, "\n") {
		if strings.Contains(kv, a.workDir) && !strings.HasPrefix(kv, "PWD=") { // the shell's own
			t.Fatalf("the replica's environment names the agent's work folder: %s", kv)
		}
	}
	fi, err := os.Stat(want)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the replica's folder: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	if a.runAs != nil {
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != a.runAs.Uid {
			t.Fatalf("the replica's folder belongs to uid %d, want the replica's %d", st.Uid, a.runAs.Uid)
		}
	}
}

// TestReachable: an agent whose work folder its replicas' user cannot pass
// through says so at start, instead of every replica failing to start.
func TestReachable(t *testing.T) {
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	closed := filepath.Join(t.TempDir(), "closed", "work")
	if err := os.MkdirAll(closed, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(closed), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := reachable(closed, nobody); err == nil || !strings.Contains(err.Error(), "may not pass through "+filepath.Dir(closed)) {
		t.Fatalf("a work folder below a 0700 folder: %v", err)
	}
	if err := reachable(closed, nil); err != nil {
		t.Fatalf("the agent's own user: %v", err)
	}
	if err := reachable(testAgent(t).workDir, nobody); err != nil {
		t.Fatalf("a work folder whose parents are 0755: %v", err)
	}
}

// TestMayRun: an allowed pattern's '*' matched "..", a symlink under an
// allowed folder led anywhere, and loader variables ran other code: the
// node refuses each.
func TestMayRun(t *testing.T) {
	dir := t.TempDir()
	serve := filepath.Join(dir, "models", "serve")
	if err := os.MkdirAll(filepath.Dir(serve), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(serve, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	shell := filepath.Join(dir, "models", "shell")
	if err := os.Symlink("/bin/sh", shell); err != nil {
		t.Fatal(err)
	}
	a := testAgent(t)
	a.node.AllowedCommands = []string{filepath.Join(dir, "*", "*")}
	for _, tc := range []struct {
		spec meshspec.ProcessSpec
		want string
	}{
		{meshspec.ProcessSpec{Command: serve}, ""},
		{meshspec.ProcessSpec{Command: serve, Env: map[string]string{"MODEL": "v1"}}, ""},
		{meshspec.ProcessSpec{Command: dir + "/models/../models/serve"}, "not allowed"},
		{meshspec.ProcessSpec{Command: dir + "/x/../../../bin/sh"}, "not allowed"},
		{meshspec.ProcessSpec{Command: shell}, `leads to "/`},
		{meshspec.ProcessSpec{Command: serve, Env: map[string]string{"LD_PRELOAD": "/tmp/x.so"}}, "LD_PRELOAD"},
		{meshspec.ProcessSpec{Command: serve, Env: map[string]string{"PYTHONPATH": "/tmp"}}, "PYTHONPATH"},
	} {
		err := a.mayRun(tc.spec)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("mayRun(%+v) = %v, want %q", tc.spec, err, tc.want)
		}
	}
}

// TestAReplicaWhosePortIsTakenMoves: a replica whose port another socket
// holds (a listener here; an outgoing connection's local port does the
// same) gets a free port before its process starts, and one whose port is
// free keeps it (a replica once restarted for ever on a taken port).
func TestAReplicaWhosePortIsTakenMoves(t *testing.T) {
	a := testAgent(t)
	ctx := context.Background()
	var lc net.ListenConfig
	held, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Close() }()
	taken := held.Addr().(*net.TCPAddr).Port
	r := a.newReplica("b", "b#000001", meshspec.ProcessSpec{}, false, taken)
	from, err := r.moveIfTaken(ctx)
	if err != nil || from != taken || r.portNow() == taken || r.portNow() == 0 {
		t.Fatalf("moved from %d (err %v) to %d; want from the taken %d to another", from, err, r.portNow(), taken)
	}
	if err := proc.CheckFree(ctx, "the new port", r.address()); err != nil {
		t.Fatalf("the replica moved to a port that is not free: %v", err)
	}
	kept := r.portNow()
	if from, err := r.moveIfTaken(ctx); from != 0 || err != nil || r.portNow() != kept {
		t.Fatalf("a replica on a free port moved from %d to %d (err %v)", from, r.portNow(), err)
	}
}
