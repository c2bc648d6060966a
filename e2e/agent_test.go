//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
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

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// agentProc is a `servemesh agent` subprocess with its own Envoy, on its own
// loopback address: one node.
type agentProc struct {
	id, address               string
	public, mesh, admin, metr string
	workDir                   string
	args, env                 []string
	bin                       string // the servemesh binary; servemeshBin when empty
	child                     *proc.Process
	stderr                    *testutil.SyncBuffer
}

func startAgent(t *testing.T, consul *testutil.Consul, id, address, xds string, cpus int, extraEnv ...string) *agentProc {
	t.Helper()
	return startAgentArgs(t, consul, id, address, xds, cpus, nil, extraEnv...)
}

// startAgentArgs is startAgent with more command-line arguments.
func startAgentArgs(t *testing.T, consul *testutil.Consul, id, address, xds string, cpus int, extraArgs []string, extraEnv ...string) *agentProc {
	t.Helper()
	return startAgentBin(t, consul, "", id, address, xds, cpus, extraArgs, extraEnv...)
}

// startAgentBin is startAgentArgs with another servemesh binary (an older
// release); "" is the one under test.
func startAgentBin(t *testing.T, consul *testutil.Consul, bin, id, address, xds string, cpus int, extraArgs []string, extraEnv ...string) *agentProc {
	t.Helper()
	workDir := t.TempDir()
	if i := slices.Index(extraArgs, "--work-dir"); i >= 0 && i+1 < len(extraArgs) {
		workDir = extraArgs[i+1]
	}
	passThrough(t, workDir)
	a := &agentProc{id: id, address: address, public: freeAddrOn(t, address),
		mesh: freeAddr(t), admin: envoy.AdminSocketIn(workDir), metr: freeAddr(t), stderr: &testutil.SyncBuffer{}}
	// The default mode (mTLS, its inbound listener on its address) unless
	// the test chooses --plaintext, on a Consul without ACLs unless it says
	// --insecure-consul=false: a later flag wins.
	args := []string{"agent", "--insecure-consul", "--inbound", freeAddrOn(t, address), "--node-id", id, "--address", address,
		"--cpus", strconv.Itoa(cpus), "--memory-mb", "4096", "--xds", xds, "--public", a.public, "--mesh", a.mesh,
		"--metrics-listen", a.metr, "--work-dir", workDir, "--drain-grace", "1s", "--envoy-log-level", "info",
		"--allow-command", servemeshBin}
	args = append(args, extraArgs...)
	a.workDir, a.args, a.bin = workDir, args, bin
	a.env = append(append(os.Environ(), "CONSUL_HTTP_ADDR="+consul.HTTPAddr, "SERVEMESH_ENVOY="+envoyBin), extraEnv...)
	a.start(t)
	t.Cleanup(func() {
		_ = a.child.Stop(15 * time.Second)
		failOnRace(t, "agent "+id, a.stderr.String())
		if t.Failed() {
			t.Logf("agent %s log:\n%s", id, a.stderr.String())
			t.Logf("agent %s's Envoy, requests that did not get a 200, or were flagged (up to 40):\n%s", id, failedRequests(a.workDir, 40))
			t.Logf("agent %s's Envoy, its warnings and errors (up to 40):\n%s", id, envoyWarnings(a.workDir, 40))
			t.Logf("agent %s's replicas, the last lines of each one's log:\n%s", id, replicaLogTails(a.workDir, 8))
			t.Logf("agent %s's Envoy, its codec and connection errors (non-zero):\n%s", id, envoyCodecErrors(a.admin))
		}
		stopNodeLeftovers(t, a.id, a.workDir, a.env)
	})
	testutil.WaitFor(t, 30*time.Second, "agent "+id+"'s Envoy", func() bool {
		return strings.Contains(a.stderr.String(), "envoy ready")
	})
	return a
}

// start starts the agent's process (again, after a stop: with the same
// arguments, so it adopts what the last one left).
func (a *agentProc) start(t *testing.T) {
	t.Helper()
	var err error
	a.child, err = proc.Start(proc.Spec{Path: orServemesh(a.bin), Args: a.args, Env: a.env, Stderr: a.stderr})
	if err != nil {
		t.Fatal(err)
	}
}

// killNode kills the node as a power loss would: its agent, its Envoy and
// its replicas, at once, leaving their registrations in Consul. The
// Envoy's and the replicas' processes are found from the agent's records
// (their process groups are killed).
func (a *agentProc) killNode(t *testing.T) {
	t.Helper()
	_ = a.child.Kill()
	records, _ := filepath.Glob(filepath.Join(a.workDir, "replicas", "running", "*.json"))
	records = append(records, filepath.Join(a.workDir, "envoy-process.json"))
	for _, f := range records {
		var rec struct {
			Process struct{ Pid int } `json:"process"`
		}
		if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &rec) == nil && rec.Process.Pid > 1 {
			_ = syscall.Kill(-rec.Process.Pid, syscall.SIGKILL)
		}
	}
}

// stopNodeLeftovers kills what a stopped agent left running (its Envoy and
// replicas serve on when it stops), with the product's own command.
func stopNodeLeftovers(t *testing.T, id, workDir string, env []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, servemeshBin, "agent", "--stop-all", "--stop-grace", "0", "--node-id", id, "--work-dir", workDir)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("servemesh agent --stop-all for node %s: %v: %s", id, err, out)
	}
}

func placements(t *testing.T, c *api.Client, backend string) []meshspec.Placement {
	t.Helper()
	b, err := c.GetBackend(context.Background(), backend)
	if err != nil {
		t.Fatal(err)
	}
	return b.Placements
}

func runningOn(ps []meshspec.Placement) map[string]string {
	out := map[string]string{}
	for _, p := range ps {
		if p.State == meshspec.Running {
			out[p.Tag] = p.Node
		}
	}
	return out
}

// restarts reads servemesh_agent_replica_restarts_total for a replica; a
// replica not yet restarted has no series, and found is false.
func restarts(t *testing.T, a *agentProc, tag string) (n float64, found bool) {
	t.Helper()
	return scrapeMetric(t, a.metr, "servemesh_agent_replica_restarts_total", "replica", tag)
}

func TestAgentsRunPlacedReplicasAcrossNodes(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "ctl", []string{"--replace-after", "4s", "--drain-grace", "1s"})
	ctl.waitLeading(20 * time.Second)
	var nodes []*agentProc
	for i, addr := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		nodes = append(nodes, startAgent(t, consul, fmt.Sprintf("n%d", i+1), addr, ctl.xdsAddr, 3))
	}
	c := ctl.client("")
	ctx := context.Background()
	demo := func(name string, replicas int) meshspec.Backend {
		return meshspec.Backend{Name: name, Config: meshspec.BackendConfig{NumReplicas: replicas, CPUs: 1},
			Process: &meshspec.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--backend", name, "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}}
	}
	testutil.WaitFor(t, 10*time.Second, "three live nodes", func() bool {
		_, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(demo("a", 3)))
		return err == nil
	})
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpecOf(demo("b", 2))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "svc", Route: "/svc", Traffic: map[string]float64{"a": 0.5, "b": 0.5}}); err != nil {
		t.Fatal(err)
	}
	aNodes := map[string]bool{}
	for _, node := range runningOn(placements(t, c, "a")) {
		aNodes[node] = true
	}
	if len(aNodes) != 3 {
		t.Fatalf("3 replicas of a on %d nodes, want spread over 3", len(aNodes))
	}
	consulClient, _ := consul.Client()
	testutil.WaitFor(t, 20*time.Second, "5 passing replicas in Consul's catalog", func() bool {
		ea, _, _ := consulClient.Health().Service(wire.BackendService("a"), "", true, nil)
		eb, _, _ := consulClient.Health().Service(wire.BackendService("b"), "", true, nil)
		return len(ea) == 3 && len(eb) == 2
	})

	t.Run("any node's Envoy reaches replicas on every node", func(t *testing.T) {
		tags := runningOn(placements(t, c, "a"))
		for k, v := range runningOn(placements(t, c, "b")) {
			tags[k] = v
		}
		for _, n := range nodes {
			seen := map[string]bool{}
			client := &http.Client{Timeout: 5 * time.Second}
			testutil.WaitFor(t, 20*time.Second, "node "+n.id+" to reach replicas on all three nodes", func() bool {
				tag, err := replicaOf(client, "http://"+n.public+"/svc")
				if err == nil {
					seen[tags[tag]] = true
				}
				return len(seen) == 3
			})
		}
		counts := sendMany(t, "http://"+nodes[0].public+"/svc", 2000)
		checkShare(t, "a (weight 0.5) through n1's Envoy", counts["a"], 2000, 0.5)
	})

	t.Run("each agent reports the config its Envoy holds, which is the current one", func(t *testing.T) {
		status := mustNodes(t, ctl.apiAddr)
		for _, n := range nodes {
			var expected map[string]string
			for _, s := range status {
				if s.ID == n.id {
					expected = s.Expected
				}
			}
			if expected == nil {
				t.Fatalf("node %s has no expected config in the controller's status %+v", n.id, status)
			}
			testutil.WaitFor(t, 15*time.Second, n.id+"'s Envoy to hold the controller's current config", func() bool {
				resp, err := http.Get("http://" + n.metr + "/v1/envoy") //nolint:noctx // test helper
				if err != nil {
					return false
				}
				defer func() { _ = resp.Body.Close() }()
				var v struct {
					Clusters  string            `json:"clusters"`
					Listeners string            `json:"listeners"`
					Routes    map[string]string `json:"routes"`
					Connected bool              `json:"connected"`
				}
				if json.NewDecoder(resp.Body).Decode(&v) != nil {
					return false
				}
				// Over delta xDS (the agents' default) a route configuration's
				// version is its own, not the controller's version of every
				// route: the routes are checked by name.
				return v.Connected && v.Clusters == expected["clusters"] && v.Listeners == expected["listeners"] &&
					v.Routes[wire.PublicRouteName(wire.PublicRouteKey("/svc"))] != "" && v.Routes[wire.MeshRouteName("svc")] != ""
			})
		}
	})

	t.Run("too many replicas: Ray Serve's error, nothing started", func(t *testing.T) {
		before := placements(t, c, "b")
		ten := 10
		_, err := c.UpdateBackend(ctx, "b", meshspec.BackendConfigPatch{NumReplicas: &ten})
		if err == nil || !strings.Contains(err.Error(), `cannot scale backend "b" to 10 replicas: servemesh tried to add 8 replicas but the nodes' free resources only allow 4 to be added`) {
			t.Fatalf("got %v", err)
		}
		if after := placements(t, c, "b"); len(after) != len(before) {
			t.Fatalf("placements changed from %d to %d", len(before), len(after))
		}
	})

	t.Run("kill -9 a replica: restarted, no client error", func(t *testing.T) {
		victim, addr, tag := passingReplica(t, consulClient, "a")
		owner := nodes[0]
		for _, n := range nodes {
			if n.id == victim.Meta["servemesh_node"] {
				owner = n
			}
		}
		l := startLoad("http://"+nodes[1].public+"/svc", 4)
		time.Sleep(300 * time.Millisecond)
		pid := mustPid(t, addr)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 20*time.Second, "the replica to be restarted", func() bool { n, found := restarts(t, owner, tag); return found && n >= 1 })
		client := &http.Client{Timeout: 5 * time.Second}
		testutil.WaitFor(t, 20*time.Second, "the restarted replica to serve again", func() bool {
			got, _ := replicaOf(client, "http://"+nodes[1].public+"/svc")
			return got == tag && mustPid(t, addr) != pid
		})
		l.finish(t)
	})

	t.Run("a replica whose port is taken while it is down moves to another and serves", func(t *testing.T) {
		victim, addr, tag := passingReplica(t, consulClient, "a")
		pid := mustPid(t, addr)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Its port is free once it is dead; the agent starts it again no
		// sooner than its 200 ms backoff: take the port before that, as an
		// outgoing connection or another program may.
		var held net.Listener
		var lc net.ListenConfig
		var err error
		for deadline := time.Now().Add(2 * time.Second); held == nil; time.Sleep(5 * time.Millisecond) {
			if held, err = lc.Listen(context.Background(), "tcp", addr); err != nil && time.Now().After(deadline) {
				t.Fatalf("the killed replica's port %s did not come free: %v", addr, err)
			}
		}
		defer func() { _ = held.Close() }()
		testutil.WaitFor(t, 30*time.Second, "the replica to pass its checks again at another port", func() bool {
			e, _, _ := consulClient.Health().Service(wire.BackendService("a"), tag, true, nil)
			return len(e) == 1 && e[0].Service.Port != victim.Port
		})
		client := &http.Client{Timeout: 5 * time.Second}
		testutil.WaitFor(t, 20*time.Second, "the moved replica to serve through the mesh", func() bool {
			got, _ := replicaOf(client, "http://"+nodes[1].public+"/svc")
			return got == tag
		})
	})

	t.Run("scale down 4 to 1 under load: zero failed requests", func(t *testing.T) {
		four, one := 4, 1
		if _, err := c.UpdateBackend(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &four}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 20*time.Second, "4 passing replicas of a", func() bool {
			e, _, _ := consulClient.Health().Service(wire.BackendService("a"), "", true, nil)
			return len(e) == 4
		})
		l := startLoad("http://"+nodes[2].public+"/svc", 4)
		time.Sleep(300 * time.Millisecond)
		if _, err := c.UpdateBackend(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &one}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 20*time.Second, "a to be down to 1 replica in Consul and in the placements", func() bool {
			e, _, _ := consulClient.Health().Service(wire.BackendService("a"), "", false, nil)
			return len(e) == 1 && len(placements(t, c, "a")) == 1
		})
		time.Sleep(300 * time.Millisecond)
		l.finish(t)
	})

	t.Run("a new process spec rolls out by apply, zero failed requests", func(t *testing.T) {
		backends, err := c.ListBackends(ctx)
		if err != nil {
			t.Fatal(err)
		}
		endpoints, err := c.ListEndpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		file := &meshspec.Model{Endpoints: endpoints}
		old := map[string]bool{}
		for _, b := range backends {
			if b.Name == "b" {
				for _, p := range b.Placements {
					old[p.Tag] = true
				}
				b.Process.Env = map[string]string{"MODEL_VERSION": "2"}
			}
			b.Placements = nil
			file.Backends = append(file.Backends, b)
		}
		l := startLoad("http://"+nodes[1].public+"/svc", 4)
		time.Sleep(300 * time.Millisecond)
		res, err := c.Apply(ctx, meshspec.SpecOf(file), api.ApplyOptions{})
		if err != nil || len(res.Changes) != 1 || res.Changes[0] != "update backend b" {
			t.Fatalf("apply: %+v %v", res, err)
		}
		testutil.WaitFor(t, 30*time.Second, "b's replicas to be replaced by new ones", func() bool {
			ps := placements(t, c, "b")
			if len(ps) != 2 {
				return false
			}
			for _, p := range ps {
				if old[p.Tag] || p.State != meshspec.Running {
					return false
				}
			}
			e, _, _ := consulClient.Health().Service(wire.BackendService("b"), "", true, nil)
			return len(e) == 2
		})
		time.Sleep(300 * time.Millisecond)
		l.finish(t)
	})

	t.Run("a stopped agent's replicas go critical and are replaced", func(t *testing.T) {
		three := 3
		if _, err := c.UpdateBackend(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &three}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 20*time.Second, "3 passing replicas of a", func() bool {
			e, _, _ := consulClient.Health().Service(wire.BackendService("a"), "", true, nil)
			return len(e) == 3
		})
		dead := nodes[2]
		l := startLoad("http://"+nodes[0].public+"/svc", 4)
		time.Sleep(300 * time.Millisecond)
		dead.killNode(t) // the agent, its Envoy and its replicas
		testutil.WaitFor(t, 20*time.Second, "the dead node's replicas to go critical", func() bool {
			checks, _, _ := consulClient.Health().Checks(wire.BackendService("a"), nil)
			for _, ch := range checks {
				if ch.Status == "critical" {
					return true
				}
			}
			return false
		})
		testutil.WaitFor(t, 30*time.Second, "replacements on the other nodes", func() bool {
			for _, node := range runningOn(placements(t, c, "a")) {
				if node == dead.id {
					return false
				}
			}
			e, _, _ := consulClient.Health().Service(wire.BackendService("a"), "", true, nil)
			return len(runningOn(placements(t, c, "a"))) == 3 && len(e) == 3
		})
		time.Sleep(500 * time.Millisecond)
		l.finish(t)
	})
}

// passingReplica is a passing replica of backend in Consul's catalog,
// with its address and tag.
func passingReplica(t *testing.T, client *consulapi.Client, backend string) (svc *consulapi.AgentService, addr, tag string) {
	t.Helper()
	entries, _, err := client.Health().Service(wire.BackendService(backend), "", true, nil)
	if err != nil || len(entries) == 0 {
		t.Fatalf("no passing replica of %s: %v", backend, err)
	}
	svc = entries[0].Service
	return svc, fmt.Sprintf("%s:%d", svc.Address, svc.Port), svc.Meta["replica_tag"]
}

func mustPid(t *testing.T, addr string) int {
	t.Helper()
	pid := testutil.PidListening(addr)
	if pid == 0 {
		t.Fatalf("no process listens on %s", addr)
	}
	return pid
}

// TestCommandsNodesDoNotAllowAreRefused: an agent runs only the commands its
// operator allowed; a backend whose command no node allows is refused at
// placement, naming the command and the node (anyone who could call the
// API used to run any command on every node).
func TestCommandsNodesDoNotAllowAreRefused(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "ctl", nil)
	ctl.waitLeading(20 * time.Second)
	startAgent(t, consul, "allow-node", "127.0.0.2", ctl.xdsAddr, 4)
	env := []string{"SERVEMESH_SERVER=" + ctl.apiAddr}
	testutil.WaitFor(t, 15*time.Second, "the node to register", func() bool {
		code, _, _ := cli(t, env, "backend", "create", "probe", "--command", servemeshBin, "--arg", "demo-replica",
			"--arg", "--backend", "--arg", "probe", "--arg", "--listen=${HOST}:${PORT}", "--num-replicas", "1")
		return code == 0
	})
	expectCLI(t, env, 1, `no node allows command "/bin/sh" (nodes: allow-node); start their agents with --allow-command "/bin/sh"`,
		"backend", "create", "shell", "--command", "/bin/sh", "--arg", "-c", "--arg", "id", "--num-replicas", "1")
	expectCLI(t, env, 1, `backend "shell" is not registered`, "backend", "get", "shell")
}

// envoyCodecErrors are the non-zero counters of the Envoy at admin that say
// why a connection or stream was cut (HTTP/2 codec errors and resets,
// protocol errors, connections destroyed with requests active), or why
// they could not be read.
func envoyCodecErrors(admin string) string {
	body, err := envoy.Admin{Socket: admin}.Get(context.Background(),
		"/stats?type=Counters&filter="+url.QueryEscape(`(http2\.|protocol_error|cx_destroy_.*with_active_rq|rx_reset|tx_reset|cx_drain_close)`))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range strings.Split(string(body), "\n") {
		if _, v, ok := strings.Cut(line, ": "); ok && strings.TrimSpace(v) != "0" {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return listed(out, len(out))
}

// envoyWarnings are the last max lines at warning level or above of the
// Envoy log in an agent's work folder, every epoch's.
func envoyWarnings(workDir string, max int) string {
	data, err := os.ReadFile(filepath.Join(workDir, envoy.LogFile))
	if err != nil {
		return err.Error()
	}
	var out []string
	for line := range strings.Lines(string(data)) {
		if strings.Contains(line, "][warning][") || strings.Contains(line, "][error][") || strings.Contains(line, "][critical][") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return listed(out, max)
}

// replicaLogTails are the last lines lines of the log of each replica in
// an agent's work folder: why one that exited did.
func replicaLogTails(workDir string, lines int) string {
	logs, _ := filepath.Glob(filepath.Join(workDir, "replicas", wire.ReplicaServiceID("*#*")+".log"))
	var out []string
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		all := strings.Split(strings.TrimSpace(string(data)), "\n")
		out = append(out, filepath.Base(path)+":")
		for _, l := range all[max(0, len(all)-lines):] {
			out = append(out, "  "+l)
		}
	}
	return listed(out, len(out))
}

// failedRequests are up to max lines of the access log in an agent's work
// folder (its rotated one first) whose status is not 200: on a failure,
// which Envoy answered what, with its response flags.
func failedRequests(workDir string, max int) string {
	var out []string
	for _, name := range []string{wire.AccessLogFile + ".1", wire.AccessLogFile} {
		data, err := os.ReadFile(filepath.Join(workDir, name))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			var entry struct {
				Status any    `json:"status"` // a number, as Envoy's JSON format types it
				Flags  string `json:"flags"`
			}
			// Not a 200, or a 200 Envoy flagged (a stream cut: UC, DC, UPE...).
			if json.Unmarshal([]byte(line), &entry) == nil && (fmt.Sprint(entry.Status) != "200" || (entry.Flags != "" && entry.Flags != "-")) {
				out = append(out, strings.TrimSpace(line))
			}
		}
	}
	return listed(out, max)
}

// listed is the last max of lines, one a line, or "(none)".
func listed(lines []string, max int) string {
	if len(lines) > max {
		lines = lines[len(lines)-max:]
	}
	if len(lines) == 0 {
		return "(none)"
	}
	return strings.Join(lines, "\n")
}
