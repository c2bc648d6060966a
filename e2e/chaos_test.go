//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	smapi "github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/catalog"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// chaosDuration is how long TestChaos runs: $SERVEMESH_CHAOS (make chaos
// sets minutes), 20 s in make test.
func chaosDuration(t *testing.T) time.Duration {
	if v := os.Getenv("SERVEMESH_CHAOS"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SERVEMESH_CHAOS=%q: %v", v, err)
		}
		return d
	}
	return 20 * time.Second
}

// chaosAgent is a node's agent with its Envoy, in the default mode (mTLS),
// restartable under the same node id, work folder and addresses.
type chaosAgent struct {
	id, address, dir string
	public           string
	args, env        []string
	child            *proc.Process
	log              *testutil.SyncBuffer
	logs             []string // the logs of its earlier incarnations
}

func (a *chaosAgent) start(t *testing.T) {
	t.Helper()
	if a.log != nil {
		a.logs = append(a.logs, a.log.String())
	}
	a.log = &testutil.SyncBuffer{}
	var err error
	if a.child, err = proc.Start(proc.Spec{Path: servemeshBin, Args: a.args, Env: a.env, Stderr: a.log}); err != nil {
		t.Fatal(err)
	}
}

// TestChaos mixes, at random and for a bounded time, under steady load
// through Envoy: operations and applies of random size through two
// controllers, kill -9 of the leading controller, of an agent (whose
// Envoy and replicas serve on, adopted by the next) and of a replica, SIGSTOP of Consul for a few seconds, and stray keys. At the end
// the stored state equals the model of every accepted operation, Envoy
// serves it, and every failed request has a documented cause.
func TestChaos(t *testing.T) {
	t.Parallel()
	d := chaosDuration(t)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SERVEMESH_CHAOS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("SERVEMESH_CHAOS_SEED=%q: %v; give the seed a run logged", v, err)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("chaos for %s, seed %d (SERVEMESH_CHAOS_SEED=%d replays its choices; their timing is the machine's)", d, seed, seed)
	consul := startConsul(t)
	ctls := []*ctlProc{startController(t, consul, "c1", []string{"--replace-after", "5s", "--drain-grace", "500ms"}),
		startController(t, consul, "c2", []string{"--replace-after", "5s", "--drain-grace", "500ms"})}
	ctls[0].waitLeading(20 * time.Second)
	var agents []*chaosAgent
	for i, addr := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		a := &chaosAgent{id: fmt.Sprintf("chaos-n%d", i+1), address: addr, dir: t.TempDir(), public: freeAddrOn(t, addr)}
		passThrough(t, a.dir)
		a.args = []string{"agent", "--insecure-consul", "--inbound", freeAddrOn(t, addr), "--node-id", a.id, "--address", addr,
			"--cpus", "4", "--memory-mb", "4096", "--xds", ctls[0].xdsAddr + "," + ctls[1].xdsAddr, "--public", a.public,
			"--mesh", freeAddr(t), "--work-dir", a.dir, "--drain-grace", "500ms", "--metrics-listen", freeAddr(t),
			"--allow-command", servemeshBin, "--concurrency", "1"}
		a.env = append(os.Environ(), "CONSUL_HTTP_ADDR="+consul.HTTPAddr, "SERVEMESH_ENVOY="+envoyBin)
		a.start(t)
		agents = append(agents, a)
	}
	t.Cleanup(func() {
		for _, a := range agents {
			_ = a.child.Stop(10 * time.Second)
			failOnRace(t, "agent "+a.id, strings.Join(a.logs, "")+a.log.String())
			if t.Failed() {
				t.Logf("agent %s log, every incarnation:\n%s%s", a.id, strings.Join(a.logs, ""), a.log.String())
				t.Logf("agent %s's Envoy, requests that did not get a 200 (up to 40):\n%s", a.id, failedRequests(a.dir, 40))
			}
			stopNodeLeftovers(t, a.id, a.dir, a.env)
		}
	})
	static := startReplicas(t, "static", 3)
	c := smapi.NewClient(ctls[0].apiAddr+","+ctls[1].apiAddr, "")
	c.FailoverWait = 30 * time.Second
	ctx := context.Background()
	want := chaosInitial(static.addrs)
	// Every node registered first, so that p's two replicas are placed on
	// two nodes: a fault kills one node at a time.
	consulClient, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the three agents to register their nodes", func() bool {
		nodes, err := catalog.Nodes(consulClient, nil)(ctx)
		return err == nil && len(nodes) == len(agents)
	})
	testutil.WaitFor(t, 30*time.Second, "the initial state to be accepted", func() bool { _, err := c.Apply(ctx, meshspec.SpecOf(want), smapi.ApplyOptions{}); return err == nil })
	if p, err := c.GetBackend(ctx, "p"); err != nil || len(nodesOfPlacements(p)) < 2 {
		t.Fatalf("p's replicas are not on two nodes: %v (err %v)", p.Placements, err)
	}
	// The load enters the first node, whose agent (and so its Envoy) is
	// never killed; its replicas are.
	entry := agents[0]
	testutil.WaitFor(t, 60*time.Second, "the entry node to serve /svc and /inner", func() bool {
		return do(httpClient(), "GET", "http://"+entry.public+"/svc", "").status == 200 &&
			do(httpClient(), "GET", "http://"+entry.public+"/inner", "").status == 200
	})

	ch := &chaos{t: t, rng: rng, c: c, want: want, static: static.addrs, ctls: ctls, agents: agents, consul: consul, start: time.Now()}
	traffic := startLoad("http://"+entry.public+"/svc", 2)
	mesh := startLoad("http://"+entry.public+"/inner", 2)
	deadline := time.Now().Add(d)
	for i := 0; time.Now().Before(deadline); i++ {
		if i%8 == 7 {
			ch.fault()
		} else {
			ch.operate()
		}
		time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)
	}
	ch.heal()
	close(traffic.stop)
	close(mesh.stop)
	traffic.wg.Wait()
	mesh.wg.Wait()

	ch.check(envoy.Admin{Socket: envoy.AdminSocketIn(entry.dir)})
	t.Logf("%d operations, faults: %v; requests through Envoy: %d to static replicas (%d failed), %d to the mesh's replicas (%d failed)",
		ch.ops, ch.faults, traffic.sent.Load(), traffic.failed.Load(), mesh.sent.Load(), mesh.failed.Load())
	if f := traffic.failed.Load(); f > 0 {
		// Load goes to static replicas that never die, through an Envoy that
		// never dies: no fault explains a failed request.
		t.Errorf("%d requests to static replicas failed with no documented cause, first: %v", f, traffic.first.Load())
	}
	// p always has a live replica (faults that kill one wait for it to be
	// replaced, and its replicas are on two nodes), a request that reaches
	// no replica is retried, and a replica whose check expired (Consul
	// stopped) is still called while none is healthy.
	if f := mesh.failed.Load(); f > 0 {
		t.Errorf("%d requests to the mesh's replicas failed with no documented cause, first: %v", f, mesh.first.Load())
	}
	if t.Failed() {
		ch.logTimeline(append(traffic.recorded(), mesh.recorded()...))
	}
}

// nodesOfPlacements returns the nodes b's placements are on.
func nodesOfPlacements(b meshspec.Backend) map[string]bool {
	out := map[string]bool{}
	for _, p := range b.Placements {
		out[p.Node] = true
	}
	return out
}

// note records an event of the run.
func (ch *chaos) note(format string, args ...any) {
	ch.events = append(ch.events, event{at: time.Now(), what: fmt.Sprintf(format, args...)})
}

// logTimeline logs the run's events and the failures given, in order.
func (ch *chaos) logTimeline(failures []event) {
	all := append([]event(nil), ch.events...)
	for _, f := range failures {
		all = append(all, event{at: f.at, what: "FAILED " + f.what})
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	var b strings.Builder
	for _, e := range all {
		fmt.Fprintf(&b, "  %7.3fs %s\n", e.at.Sub(ch.start).Seconds(), e.what)
	}
	ch.t.Logf("timeline (seconds from the start of the load):\n%s", b.String())
}

// chaosInitial is the state chaos starts from: a routed endpoint over three
// static backends (outside the mesh), and a routed endpoint of a process
// backend the agents run (inside it: across nodes over mTLS, or on the
// entry node itself).
func chaosInitial(addrs []string) *meshspec.Model {
	m := &meshspec.Model{}
	for i, a := range addrs {
		m.Backends = append(m.Backends, meshspec.Backend{Name: fmt.Sprintf("s%d", i), Replicas: []meshspec.Replica{{Address: a}}})
	}
	m.Backends = append(m.Backends, meshspec.Backend{Name: "p", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1},
		Process: &meshspec.ProcessSpec{Command: servemeshBin, Args: []string{"demo-replica", "--backend", "p", "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}})
	m.Endpoints = []meshspec.Endpoint{
		{Name: "svc", Route: "/svc", Traffic: map[string]float64{"s0": 0.5, "s1": 0.5}},
		{Name: "inner", Route: "/inner", Traffic: map[string]float64{"p": 1}},
	}
	return m
}

// workDirs are the agents' work folders.
func (ch *chaos) workDirs() []string {
	var out []string
	for _, a := range ch.agents {
		out = append(out, a.dir)
	}
	return out
}

type chaos struct {
	t      *testing.T
	rng    *rand.Rand
	c      *smapi.Client
	want   *meshspec.Model
	static []string
	ctls   []*ctlProc
	agents []*chaosAgent
	consul *testutil.Consul
	ops    int
	faults map[string]int
	// events are what chaos did and when, to set failures against.
	start  time.Time
	events []event
}

// accept sends op until it is accepted: every call is idempotent, so one
// whose answer was lost is simply sent again.
func (ch *chaos) accept(what string, op func() error) {
	ch.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := op()
		if err == nil {
			ch.ops++
			return
		}
		if time.Now().After(deadline) {
			ch.t.Fatalf("%s was never accepted: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// operate runs one random operation and records it in the expected state.
func (ch *chaos) operate() {
	ctx := context.Background()
	switch ch.rng.IntN(4) {
	case 0, 1: // shift svc's traffic among the static backends
		a, b := ch.rng.IntN(3), ch.rng.IntN(3)
		w := float64(ch.rng.IntN(11)) / 10
		traffic := map[string]float64{fmt.Sprintf("s%d", a): w}
		traffic[fmt.Sprintf("s%d", b)] += 1 - w
		for k, v := range traffic {
			if v == 0 {
				delete(traffic, k)
			}
		}
		ch.note("traffic set svc %v", traffic)
		ch.accept("traffic set", func() error { _, err := ch.c.SetTraffic(ctx, "svc", traffic); return err })
		ch.want.Endpoints[ch.find("svc")].Traffic = traffic
	case 2: // apply a random number of headless endpoints (0 to 400)
		next := meshspec.Clone(ch.want)
		next.Endpoints = next.Endpoints[:2]
		for i := range ch.rng.IntN(401) {
			next.Endpoints = append(next.Endpoints, meshspec.Endpoint{Name: fmt.Sprintf("x%d", i), Traffic: map[string]float64{"s2": 1}})
		}
		ch.note("apply %d endpoints", len(next.Endpoints))
		ch.accept("apply", func() error { _, err := ch.c.Apply(ctx, meshspec.SpecOf(next), smapi.ApplyOptions{}); return err })
		ch.want = next
	case 3: // scale the process backend
		r := 2 + ch.rng.IntN(2) // at least two: one may be killed at a time
		ch.note("scale p to %d", r)
		ch.accept("scale p", func() error {
			_, err := ch.c.UpdateBackend(ctx, "p", meshspec.BackendConfigPatch{NumReplicas: &r})
			return err
		})
		ch.want.Backends[ch.findBackend("p")].Config.NumReplicas = r
	}
}

func (ch *chaos) find(name string) int {
	for i, e := range ch.want.Endpoints {
		if e.Name == name {
			return i
		}
	}
	ch.t.Fatalf("no endpoint %s", name)
	return -1
}

func (ch *chaos) findBackend(name string) int {
	for i, b := range ch.want.Backends {
		if b.Name == name {
			return i
		}
	}
	ch.t.Fatalf("no backend %s", name)
	return -1
}

// fault injects one random fault; the faulty piece is brought back.
func (ch *chaos) fault() {
	if ch.faults == nil {
		ch.faults = map[string]int{}
	}
	switch kind := ch.rng.IntN(5); kind {
	case 0: // kill -9 a controller (the leader half the time), restart it
		victim := ch.ctls[ch.rng.IntN(2)]
		ch.note("kill controller %s", victim.id)
		victim.kill()
		time.Sleep(500 * time.Millisecond)
		victim.start()
		ch.faults["controller killed"]++
	case 1: // kill -9 an agent other than the entry node's (its Envoy and replicas serve on), restart it: it adopts them
		a := ch.agents[1+ch.rng.IntN(len(ch.agents)-1)]
		ch.waitReplicas() // one fault at a time: the last change has settled
		ch.note("kill agent %s", a.id)
		_ = a.child.Kill()
		time.Sleep(300 * time.Millisecond)
		a.start(ch.t)
		ch.note("restarted agent %s", a.id)
		ch.faults["agent killed"]++
		ch.waitReplicas()
		ch.note("p's replicas answer again")
	case 2: // kill -9 one replica of p
		ch.waitReplicas()
		pids := replicaPids("p", ch.workDirs()...)
		if len(pids) > 0 {
			pid := pids[ch.rng.IntN(len(pids))]
			ch.note("kill replica of p, pid %d", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			ch.faults["replica killed"]++
			ch.waitReplicas()
			ch.note("p's replicas answer again")
		}
	case 3: // stop Consul for 1 to 3 seconds
		pid := ch.consul.Pid()
		ch.note("stop Consul")
		_ = syscall.Kill(pid, syscall.SIGSTOP)
		time.Sleep(time.Duration(1000+ch.rng.IntN(2000)) * time.Millisecond)
		_ = syscall.Kill(pid, syscall.SIGCONT)
		ch.note("resume Consul")
		ch.faults["consul stopped"]++
	case 4: // a stray key under the state's prefix
		client, err := ch.consul.Client()
		if err == nil {
			key := "servemesh/" + []string{"backends/", "endpoints/stray" + strconv.Itoa(ch.rng.IntN(9)), "other/thing"}[ch.rng.IntN(3)]
			ch.note("stray key %s", key)
			_, _ = client.KV().Put(&api.KVPair{Key: key, Value: []byte("{")}, nil)
			ch.faults["stray key"]++
		}
	}
}

// waitReplicas waits until p has as many passing replicas as it should, on
// two nodes at least, each of them answering, and every node's Envoy routes to them (the entry node's view of p, each
// node's own inbound cluster), so a fault never finds every replica of p
// dead at once as the data plane sees it.
func (ch *chaos) waitReplicas() {
	client, err := ch.consul.Client()
	if err != nil {
		ch.t.Fatal(err)
	}
	want := ch.want.Backends[ch.findBackend("p")].Config.NumReplicas
	testutil.WaitFor(ch.t, 60*time.Second, "p's replicas to pass again and every Envoy to route to them", func() bool {
		e, _, err := client.Health().Service(wire.BackendService("p"), "", true, nil)
		if err != nil || len(e) < want {
			return false
		}
		perNode := map[string]float64{}
		for _, in := range e {
			perNode[in.Service.Meta[wire.MetaReplicaNode]]++
			// Its check passes until its TTL runs out: ask the replica
			// itself (all nodes share this machine's loopback).
			addr := net.JoinHostPort(in.Service.Address, strconv.Itoa(in.Service.Port))
			if do(httpClient(), "GET", "http://"+addr+"/", "").status != 200 {
				return false
			}
		}
		if len(perNode) < 2 {
			return false // a fault kills one node at a time; p must outlive it
		}
		entry := ch.agents[0]
		hosts := float64(len(perNode)) - min(perNode[entry.id], 1) + perNode[entry.id] // other nodes by inbound, the entry's replicas each
		if v, ok := readEnvoyStat(envoy.AdminSocketIn(entry.dir), "cluster.p.membership_healthy"); !ok || v != hosts {
			return false
		}
		for _, a := range ch.agents {
			if n := perNode[a.id]; n > 0 {
				if v, ok := readEnvoyStat(envoy.AdminSocketIn(a.dir), "cluster._inbound_p.membership_healthy"); !ok || v != n {
					return false
				}
			}
		}
		return true
	})
}

// heal brings every piece back and waits until a controller leads.
func (ch *chaos) heal() {
	for _, c := range ch.ctls {
		if c.exited() {
			c.start()
		}
	}
	for _, a := range ch.agents {
		if a.child.Exited() {
			a.start(ch.t)
		}
	}
	testutil.WaitFor(ch.t, 30*time.Second, "a controller to lead", func() bool {
		for _, c := range ch.ctls {
			if info, err := c.client("").Leader(context.Background()); err == nil && info.Leading {
				return true
			}
		}
		return false
	})
}

// check compares the stored state, the API's answers and Envoy's routes
// with the model of every accepted operation.
func (ch *chaos) check(admin envoy.Admin) {
	t := ch.t
	client, err := ch.consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	stored, _, err := store.NewConsul(client, "servemesh", slog.New(slog.DiscardHandler)).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := summary(stored), summary(ch.want); got != want {
		t.Fatalf("the stored state is not the model of the accepted operations:\n got  %s\n want %s", got, want)
	}
	// Envoy is connected to one of the two controllers, either may be it:
	// every controller publishes what is stored.
	inSync := func() bool {
		for _, c := range ch.ctls {
			for _, n := range nodesOf(c.apiAddr) {
				if n.Connected && n.InSync {
					return true
				}
			}
		}
		return false
	}
	if err := testutil.Until(30*time.Second, inSync); err != nil {
		// What each controller says of the nodes, to tell which one they
		// are on and why it is not in sync (make flake saw this once).
		for _, c := range ch.ctls {
			nodes, err := readNodes(c.apiAddr)
			t.Logf("controller at %s: nodes %+v, err %v", c.apiAddr, nodes, err)
		}
		t.Fatalf("timed out after 30s waiting for the node to be in sync with the controller it is connected to")
	}
	testutil.WaitFor(t, 30*time.Second, "Envoy to serve the stored routes", func() bool {
		return envoyPolicies(t, admin) == expectedPolicies(stored)
	})
}

// summary renders what the operations control: backends with their
// replica counts, endpoints with their traffic.
func summary(m *meshspec.Model) string {
	var parts []string
	for _, b := range m.Backends {
		parts = append(parts, fmt.Sprintf("backend %s replicas=%d num=%d", b.Name, len(b.Replicas), b.Config.NumReplicas))
	}
	for _, e := range m.Endpoints {
		parts = append(parts, "endpoint "+e.Name+" "+expectedPolicies(&meshspec.Model{Endpoints: []meshspec.Endpoint{e}}))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// envOf reads a process's environment.
func envOf(pid int) map[string]string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	out := map[string]string{}
	for _, kv := range strings.Split(string(b), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}

// replicaPids finds the demo replicas of backend that the agents working
// in workDirs run: by their command line (this suite's servemesh binary)
// and their working folder, which is under their agent's. Another test's
// backend of the same name, and another suite's running beside this one,
// are not theirs.
func replicaPids(backend string, workDirs ...string) []int {
	if len(workDirs) == 0 {
		panic("replicaPids: name the agents' work folders")
	}
	var out []int
	for _, pid := range processesOf(servemeshBin, workDirs...) {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if strings.HasPrefix(string(cmdline), servemeshBin+"\x00demo-replica\x00") && strings.Contains(string(cmdline), "\x00--backend\x00"+backend+"\x00") {
			out = append(out, pid)
		}
	}
	return out
}

// underAny reports whether path is inside one of dirs (their real paths).
func underAny(path string, dirs []string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool {
		real, err := filepath.EvalSymlinks(d)
		return err == nil && strings.HasPrefix(path, real+string(filepath.Separator))
	})
}
