//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestContainment: whoever holds a little (a write token, a replica) cannot
// take more, through the real controller, agents, Envoy and Consul, in the
// default mode (mTLS, two nodes). Each subtest is a finding of issue 14
// that succeeded before.
func TestContainment(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	execToken, writeToken := writeToken(t, "exec-secret"), writeToken(t, "write-secret")
	ctl := startController(t, consul, "ctl", []string{"--token-file", execToken, "--write-token-file", writeToken,
		"--allow-replica-cidr", "192.0.2.0/24", "--allow-replica-name", "vm"}) // loopback is not allowed: the default
	ctl.waitLeading(20 * time.Second)
	nodes := []*mtlsNode{startMTLSNode(t, consul, "k1", "127.0.0.2", ctl.xdsAddr), startMTLSNode(t, consul, "k2", "127.0.0.3", ctl.xdsAddr, "--envoy-max-connections", "40")}
	ctx := context.Background()
	execC := ctl.client("exec-secret")
	spec := &meshspec.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--backend", "m", "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}
	testutil.WaitFor(t, 20*time.Second, "backend m to be placed on both nodes", func() bool {
		_, err := execC.CreateBackend(ctx, meshspec.BackendSpec{Name: "m", Process: spec, Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3}})
		return err == nil
	})
	if _, err := execC.CreateEndpoint(ctx, meshspec.Endpoint{Name: "m", Route: "/m", Traffic: map[string]float64{"m": 1}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 60*time.Second, "/m served through k1", func() bool {
		return do(httpClient(), http.MethodGet, "http://"+nodes[0].public+"/m", "").status == http.StatusOK
	})
	writer := []string{"SERVEMESH_SERVER=" + ctl.apiAddr, "SERVEMESH_TOKEN_FILE=" + writeToken}

	t.Run("a write token changes no command", func(t *testing.T) {
		// Finding 1: the exec check compared a 32-bit hash, outside the
		// write lock. Any change of the spec, here only its environment,
		// needs the exec scope. (Loader variables such as LD_PRELOAD are
		// refused for everyone: see the model's validation.)
		evil := *spec
		evil.Env = map[string]string{"MODEL_URL": "http://evil.example/weights"}
		file := writeMesh(t, &meshspec.Model{Backends: []meshspec.Backend{{Name: "m", Process: &evil, Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3}}},
			Endpoints: []meshspec.Endpoint{{Name: "m", Route: "/m", Traffic: map[string]float64{"m": 1}}}})
		for _, dry := range []string{"--dry-run=true", "--dry-run=false"} {
			expectCLI(t, writer, 1, "exec scope", "apply", "-f", file, dry)
		}
		got, err := execC.GetBackend(ctx, "m")
		if err != nil || len(got.Process.Env) != 0 {
			t.Fatalf("the stored spec changed: %+v, %v", got.Process, err)
		}
		// What runs no new command is the write token's to change.
		expectCLI(t, writer, 0, "", "backend", "update", "m", "--max-concurrent-queries", "50")
	})

	t.Run("a write token points no route at the node", func(t *testing.T) {
		// Finding 2: a static replica at Envoy's admin, Consul or the
		// metadata service was served on a public route.
		_, consulPort, _ := net.SplitHostPort(consul.HTTPAddr)
		for _, addr := range []string{"127.0.0.1:" + consulPort, "169.254.169.254:80", "0.0.0.0:" + consulPort, "[::1]:" + consulPort,
			"[fd00:ec2::254]:80", "100.100.100.200:80"} {
			expectCLI(t, writer, 1, "--allow-replica-cidr", "backend", "create", "evil", "--replica", addr)
		}
		// Issue 34: DNS names went round the check. A name is refused
		// unless the operator allows it...
		for _, addr := range []string{"localhost:" + consulPort, "localhost4:" + consulPort, "ip6-localhost:" + consulPort,
			"runsc:" + consulPort, "metadata.google.internal:80", "127.0.0.1.nip.io:" + consulPort} {
			expectCLI(t, writer, 1, "--allow-replica-name", "backend", "create", "evil", "--replica", addr)
		}
		if _, err := execC.GetBackend(ctx, "evil"); err == nil {
			t.Fatal("a refused backend was stored")
		}
		// ...and an allowed name (vm, which this machine's hosts file points
		// at 127.0.0.1) is resolved by the controller and each address
		// checked: Envoy never gets the name, and the route reaches no
		// loopback server.
		expectCLI(t, writer, 0, "", "backend", "create", "named", "--replica", "vm:"+consulPort)
		expectCLI(t, writer, 0, "", "endpoint", "create", "named", "--route", "/v1/agent", "--backend", "named")
		readEnv := []string{"SERVEMESH_SERVER=" + ctl.apiAddr, "SERVEMESH_TOKEN_FILE=" + execToken}
		testutil.WaitFor(t, 15*time.Second, "status to report the name's refused address", func() bool {
			_, out, _ := cli(t, readEnv, "status")
			return strings.Contains(out, "vm resolves to 127.0.0.1")
		})
		testutil.WaitFor(t, 15*time.Second, "the named route to be served (to no replica)", func() bool {
			return do(httpClient(), http.MethodGet, "http://"+nodes[0].public+"/v1/agent/self", "").status == http.StatusServiceUnavailable
		})
		// An external service's instance on loopback is dropped, and
		// status says why: registrations in Consul are users' input too.
		client, err := consul.Client()
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(consulPort)
		if err := client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{ID: "kv-1", Name: "kv", Address: "127.0.0.1", Port: port,
			Check: &consulapi.AgentServiceCheck{TTL: "1h", Status: consulapi.HealthPassing}}); err != nil {
			t.Fatal(err)
		}
		expectCLI(t, writer, 0, "", "backend", "create", "kv", "--external", "kv")
		expectCLI(t, writer, 0, "", "endpoint", "create", "kv", "--route", "/v1/kv", "--methods", "GET,PUT", "--backend", "kv")
		execEnv := []string{"SERVEMESH_SERVER=" + ctl.apiAddr, "SERVEMESH_TOKEN_FILE=" + execToken}
		testutil.WaitFor(t, 15*time.Second, "status to report the dropped instance", func() bool {
			_, out, _ := cli(t, execEnv, "status")
			return strings.Contains(out, "kv-1") && strings.Contains(out, "--allow-replica-cidr")
		})
		testutil.WaitFor(t, 15*time.Second, "the route to be served (to no replica)", func() bool {
			return do(httpClient(), http.MethodGet, "http://"+nodes[0].public+"/v1/kv/x", "").status == http.StatusServiceUnavailable
		})
		r := do(httpClient(), http.MethodPut, "http://"+nodes[0].public+"/v1/kv/servemesh/owned", "x")
		if r.status == http.StatusOK {
			t.Fatalf("a public route wrote Consul's KV: %+v", r)
		}
		if kv, _, _ := client.KV().Get("servemesh/owned", nil); kv != nil {
			t.Fatal("a public route wrote Consul's KV")
		}
	})

	t.Run("a replica cannot reach its node's Envoy", func(t *testing.T) {
		// Finding 3: Envoy's admin API listened on 127.0.0.1 without
		// authentication; a replica raised the log level (headers went to a
		// world-readable envoy.log) and stopped Envoy with /quitquitquit.
		for _, n := range nodes {
			work := filepath.Dir(n.secrets)
			boot, err := os.ReadFile(filepath.Join(work, "bootstrap.yaml"))
			if err != nil || !strings.Contains(string(boot), "pipe:") || strings.Contains(string(boot), "port_value: 19000") {
				t.Fatalf("node %s: the admin API is not on a Unix socket: %v\n%s", n.id, err, boot)
			}
			if body, err := (envoy.Admin{Socket: n.admin}).Get(ctx, "/ready"); err != nil || !strings.Contains(string(body), "LIVE") {
				t.Fatalf("node %s: the agent's user cannot reach the admin socket: %q %v", n.id, body, err)
			}
			// The same curl as the agent's user reaches it (the positive
			// control); as nobody, a replica's user, it cannot connect.
			if out, err := exec.CommandContext(ctx, "curl", "-sS", "--unix-socket", n.admin, "http://envoy/ready").CombinedOutput(); err != nil || !strings.Contains(string(out), "LIVE") {
				t.Fatalf("node %s: curl as the agent's user: %v %s", n.id, err, out)
			}
			out, err := asNobody(t, "curl", "-sS", "--unix-socket", n.admin, "-X", "POST", "http://envoy/quitquitquit")
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 7 { // curl's "failed to connect"
				t.Fatalf("node %s: nobody (a replica's user) reached the admin socket: %v %s", n.id, err, out)
			}
			for _, private := range []string{"envoy.log", "access.log"} { // issue 34: the access log was 0644
				if fi, err := os.Stat(filepath.Join(work, private)); err != nil || fi.Mode().Perm() != 0o600 {
					t.Fatalf("node %s: %s: %v, mode %v; want 0600", n.id, private, err, fi.Mode().Perm())
				}
			}
			// The replica started in a folder of its own, not the agent's.
			folders, err := filepath.Glob(filepath.Join(work, "replicas", "m-*[^g]")) // not the .log
			if err != nil || len(folders) != 1 {
				t.Fatalf("node %s: replica folders %v, %v; want one", n.id, folders, err)
			}
			fi, err := os.Stat(folders[0])
			if err != nil || !fi.IsDir() {
				t.Fatalf("node %s: the replica's folder: %v", n.id, err)
			}
			if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o700 || st.Uid == uint32(os.Geteuid()) {
				t.Fatalf("node %s: the replica's folder has mode %v, owner %d; want 0700, the replica's user", n.id, fi.Mode().Perm(), st.Uid)
			}
		}
		if got := do(httpClient(), http.MethodGet, "http://"+nodes[0].public+"/m", ""); got.status != http.StatusOK {
			t.Fatalf("/m after the probes: %+v", got)
		}
	})

	t.Run("a replica reaches none of its node's Envoy's sockets", func(t *testing.T) {
		// Issue 58, H1: Envoy's hot restart sockets were in the abstract
		// namespace, which file modes do not guard: a replica's user took
		// the public listener's socket, stopped every listener and made
		// Envoy exit. Every Unix socket the node's Envoy has bound must be
		// a file that nobody (a replica's user) cannot connect to, and
		// which the agent's user can (the positive control).
		for _, n := range nodes {
			pid := envoyPidOf(t, filepath.Dir(n.secrets))
			socks := boundUnixSockets(t, pid)
			cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)) // a relative path is Envoy's folder's
			if err != nil {
				t.Fatal(err)
			}
			if len(socks) < 2 { // the admin API and hot restart at least
				t.Fatalf("node %s: Envoy (pid %d) has bound %v; want its admin and hot restart sockets", n.id, pid, socks)
			}
			for _, sock := range socks {
				if strings.HasPrefix(sock.path, "@") {
					t.Errorf("node %s: Envoy listens on the abstract socket %s, which any local user can reach", n.id, sock.path)
					continue
				}
				if !filepath.IsAbs(sock.path) {
					sock.path = filepath.Join(cwd, sock.path)
				}
				if out, err := connectUnix(ctx, nil, sock); err != nil {
					t.Errorf("node %s: the agent's user cannot connect to %s: %v %s", n.id, sock.path, err, out)
				}
				if out, err := connectUnix(ctx, &syscall.Credential{Uid: 65534, Gid: 65534}, sock); err == nil || !strings.Contains(out, "PermissionError") {
					t.Errorf("node %s: nobody (a replica's user) connecting to %s: %v %s; want permission denied", n.id, sock.path, err, out)
				}
			}
		}
	})

	t.Run("no client of a route reconfigures its replicas", func(t *testing.T) {
		// Issue 34: /-/reconfigure on the replica's serving port took any
		// POST, and a route of "/" forwards every path: a public client
		// rewrote the backend's user_config. Now the replica takes a config
		// only with the secret its agent passed it.
		expectCLI(t, writer, 0, "", "endpoint", "create", "everything", "--route", "/", "--methods", "GET,POST", "--backend", "m")
		url := "http://" + nodes[0].public + "/-/reconfigure"
		var status int
		var text string
		testutil.WaitFor(t, 15*time.Second, "the route of / to be served", func() bool {
			status, _, _, text, _ = postModel(httpClient(), url, `{"delay_ms": 5000}`)
			return status != http.StatusNotFound
		})
		if status != http.StatusForbidden || !strings.Contains(text, "agent may reconfigure") {
			t.Fatalf("a public POST to /-/reconfigure: %d %q; want 403", status, text)
		}
		expectCLI(t, writer, 0, "", "endpoint", "delete", "everything")
	})

	t.Run("a client cannot make a node's Envoy hold unbounded connections", func(t *testing.T) {
		// Issue 34: the public listener had no limits and no overload
		// manager (200 idle connections took Envoy from 63 to 273 MiB). k2
		// runs with --envoy-max-connections 40: of 80 connections, those past
		// the limit are closed at once; once they are gone it serves again.
		conns := openIdle(t, nodes[1].public, 80)
		closed := closedOf(conns)
		closeAll(conns)
		if closed < 30 {
			t.Fatalf("%d of 80 connections were closed; want those past the limit of 40 (at least 30)", closed)
		}
		testutil.WaitFor(t, 10*time.Second, "k2 to serve once the connections are gone", func() bool {
			return do(httpClient(), http.MethodGet, "http://"+nodes[1].public+"/m", "").status == http.StatusOK
		})
	})
	t.Run("idle public connections leave the mesh and inbound listeners serving", func(t *testing.T) {
		// Issue 58, M5: k2's listeners shared its one limit of 40
		// connections, so 80 idle public connections cut the node off
		// from its mesh listener (its replicas' calls) and its inbound one
		// (other nodes' calls). Each listener has a share of its own now.
		held := openIdle(t, nodes[1].public, 80)
		defer closeAll(held)
		if closed := closedOf(held); closed < 40 {
			t.Fatalf("%d of 80 idle public connections were closed; want at least 40 (the public listener full)", closed)
		}
		fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
		if r := do(fresh, http.MethodGet, "http://"+nodes[1].mesh+"/", "m"); r.status != http.StatusOK || r.backend != "m" {
			t.Errorf("a new connection to k2's mesh listener while its public one is full: %s; want m's answer", r)
		}
		client, err := consul.Client()
		if err != nil {
			t.Fatal(err)
		}
		peer, err := connect.Fetch(ctx, client, wire.NodeService("probe"))
		if err != nil {
			t.Fatal(err)
		}
		inbound := inboundClient(peer, peer.Roots, wire.BackendSNI("m"), identityPrefix(t, peer)+wire.BackendService("m"))
		if r := do(inbound, http.MethodGet, "https://"+nodes[1].inbound+"/", ""); r.status != http.StatusOK || r.backend != "m" {
			t.Errorf("a new connection to k2's inbound listener, as a node, while its public one is full: %s; want m's answer", r)
		}
	})
}

// openIdle opens n connections to addr and sends nothing on them.
func openIdle(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(context.Background(), "tcp", addr)
		if err != nil {
			closeAll(conns)
			t.Fatalf("connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	return conns
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		_ = c.Close()
	}
}

// closedOf returns how many of conns the server closed within a second of
// now (a limit closes a connection past it at once).
func closedOf(conns []net.Conn) int {
	closed := 0
	time.Sleep(time.Second)
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			closed++
		}
	}
	return closed
}

// asNobody runs a command as nobody, a replica's user, and returns what it
// printed.
func asNobody(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is needed for this test: %v", name, err)
	}
	out := &testutil.SyncBuffer{}
	p, err := proc.Start(proc.Spec{Path: path, Args: args, Stdout: out, Stderr: out,
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534}})
	if err != nil {
		return "", err
	}
	err = p.Wait()
	return out.String(), err
}

// unixSocket is a Unix socket a process has bound: its path ("@" first
// for the abstract namespace) and type (syscall.SOCK_STREAM, SOCK_DGRAM).
type unixSocket struct {
	path string
	typ  int
}

// envoyPidOf is the pid of the Envoy started with the bootstrap in work.
func envoyPidOf(t *testing.T, work string) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "envoy" && slices.Contains(args, filepath.Join(work, "bootstrap.yaml")) {
			pid, _ := strconv.Atoi(e.Name())
			return pid
		}
	}
	t.Fatalf("no Envoy runs with the bootstrap in %s", work)
	return 0
}

// boundUnixSockets are the Unix sockets process pid holds that have an
// address (bound ones: a connecting client's has none).
func boundUnixSockets(t *testing.T, pid int) []unixSocket {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	table, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	var out []unixSocket
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line) // Num RefCount Protocol Flags Type St Inode [Path]
		if len(f) < 8 || !inodes[f[6]] {
			continue
		}
		typ, _ := strconv.ParseInt(f[4], 16, 32)
		out = append(out, unixSocket{path: f[7], typ: int(typ)})
	}
	return out
}

// connectUnix connects to sock as cred's user (this process's when nil)
// and closes at once, sending nothing; it returns what the attempt printed.
func connectUnix(ctx context.Context, cred *syscall.Credential, sock unixSocket) (string, error) {
	// Debian's Python: nobody may run it (unlike a user's own Pythons).
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", "-c", `import socket, sys
s = socket.socket(socket.AF_UNIX, int(sys.argv[2]))
s.connect(sys.argv[1])
s.close()
print("connected")`, sock.path, strconv.Itoa(sock.typ))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// writeMesh writes m as a config file for `servemesh apply -f`.
func writeMesh(t *testing.T, m *meshspec.Model) string {
	t.Helper()
	b, err := meshspec.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), fmt.Sprintf("mesh-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAnAgentsStatusTokenReadsNoLog: issue 58, M2. The controller sent
// the agents' one shared status token, over plain HTTP, to whatever
// status address a node registered (a node's Consul token is enough to
// register one), and the captured token read a real agent's logs. Now the
// controller calls an agent that takes TLS over mTLS, sending no token,
// and an agent serves logs only to the controller's certificate: the
// token, still sent to a node that does not say it takes TLS (a previous
// release's agent), reads no log.
func TestAnAgentsStatusTokenReadsNoLog(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	token := writeToken(t, "agents-status-secret")
	ctl := startController(t, consul, "ctl", []string{"--agent-token-file", token})
	ctl.waitLeading(20 * time.Second)
	node := startMTLSNode(t, consul, "s1", "127.0.0.2", ctl.xdsAddr, "--status-token-file", token)
	env := []string{"SERVEMESH_SERVER=" + ctl.apiAddr}
	testutil.WaitFor(t, 30*time.Second, "the controller to read s1's Envoy log", func() bool {
		code, out, _ := cli(t, env, "logs", "--node", "s1", "--tail", "3")
		return code == 0 && strings.TrimSpace(out) != ""
	})

	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	for _, tlsToo := range []bool{false, true} {
		id := map[bool]string{false: "rogue-plain", true: "rogue-tls"}[tlsToo]
		first := rogueStatusListener(t, client, id, tlsToo)
		var got []byte
		select {
		case got = <-first:
		case <-time.After(20 * time.Second):
			t.Fatalf("the controller did not call %s's status address within 20 s", id)
		}
		if !tlsToo {
			captured, ok := bearerOf(got)
			if !ok {
				t.Fatalf("the controller's call to %s, which says it takes plain HTTP: %q; want the agents' token (a previous release's agent needs it)", id, got)
			}
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+node.metr+wire.LogsPath+"?envoy=true&tail=5", nil)
			req.Header.Set("Authorization", "Bearer "+captured)
			if r := doRequest(httpClient(), req); r.status != http.StatusForbidden {
				t.Errorf("s1's logs with the token captured at %s: %s; want 403", id, r)
			}
			continue
		}
		if len(got) == 0 || got[0] != 0x16 || bytes.Contains(got, []byte("agents-status-secret")) {
			t.Errorf("the controller's call to %s, which says it takes TLS: %q; want a TLS handshake and no token", id, got)
		}
	}
}

// rogueStatusListener registers node id in Consul, as a node's token could,
// with a status address of a listener of its own, and returns what the
// first caller of that address sends within a second.
func rogueStatusListener(t *testing.T, client *consulapi.Client, id string, statusTLS bool) <-chan []byte {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	first := make(chan []byte, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		b, _ := io.ReadAll(io.LimitReader(c, 4096))
		first <- b
	}()
	n := wire.NodeInfo{ID: id, Address: "127.0.0.9", CPUs: 1, MemoryMB: 64, StatusAddr: lis.Addr().String(), StatusTLS: statusTLS,
		Version: wire.Version, Protocol: wire.Protocol}
	if err := client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{ID: wire.AgentServiceID(id), Name: wire.NodeService(id),
		Tags: []string{wire.AgentTag}, Address: n.Address, Meta: n.Meta(),
		Check: &consulapi.AgentServiceCheck{CheckID: wire.AgentServiceID(id), TTL: "10m", Status: consulapi.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
	return first
}

// bearerOf returns the bearer token of an HTTP request's bytes.
func bearerOf(request []byte) (string, bool) {
	for _, line := range strings.Split(string(request), "\r\n") {
		if v, ok := strings.CutPrefix(line, "Authorization: Bearer "); ok {
			return v, true
		}
	}
	return "", false
}
