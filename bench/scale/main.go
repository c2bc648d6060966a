// Package main measures servemesh's control plane at scale, in the default
// mode (mTLS): the real controller and Consul, a few real nodes (agents
// with their Envoys) and many simulated ones (simNode: ADS clients in this
// process with their own Connect identities, which subscribe to every
// kind, ACK, and record when each version arrives), for a mesh of N
// endpoints of 3 backends (of 3 static replicas) each.
//
// For each mesh size it reports:
//   - the time from an accepted `traffic set` (the API answered) to every
//     simulated node having the new routes: p50 and p99 over -changes
//     changes made one after the other (the real nodes are checked to
//     follow each, from the controller's status, not timed);
//   - the bytes the simulated nodes were sent per change, summed;
//   - the controller's RSS and CPU at rest, and under a change every
//     -interval for -load.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

func main() {
	sizes := flag.String("endpoints", "1000,10000", "mesh sizes, in endpoints (3 backends of 3 replicas each)")
	var o options
	flag.IntVar(&o.nodes, "nodes", 100, "simulated nodes")
	flag.IntVar(&o.meshOnly, "mesh-only-nodes", 0, "how many of the simulated nodes are mesh-only (--public none: no public listener, so no public route table)")
	flag.IntVar(&o.reach, "reach", 0, "how many endpoints each mesh-only simulated node reaches (--reachable-endpoints: the changed one and others spread over the mesh); 0: every endpoint")
	flag.BoolVar(&o.onDemand, "on-demand", false, "the simulated nodes' clusters come on demand (--clusters on-demand): each names the clusters of the endpoint the bench changes, as an Envoy does once requests went there (delta only)")
	flag.IntVar(&o.realNodes, "real-nodes", 2, "real nodes: agents with their Envoys")
	realArgs := flag.String("real-node-args", "", "more arguments for the real nodes' agents, space-separated (say, \"--clusters on-demand\")")
	flag.BoolVar(&o.restartReal, "restart-real-node", false, "once the mesh is loaded, restart the first real node's agent and Envoy and report the time until it is in sync and its Envoy's memory")
	flag.IntVar(&o.changes, "changes", 100, "traffic sets timed, one after the other")
	flag.DurationVar(&o.interval, "interval", 100*time.Millisecond, "the pace of the changes under load")
	flag.DurationVar(&o.loadFor, "load", 10*time.Second, "how long the changes under load last")
	flag.StringVar(&o.memoryLimit, "controller-memory-limit", "", "the controller's GOMEMLIMIT (Go's soft memory limit, such as 1GiB): its heap is collected harder as it nears it; default none")
	flag.StringVar(&o.cpuProfile, "cpu-profile", "", "save the controller's CPU profile over the changes under load to this file (<file>-<endpoints>-<protocol>)")
	flag.StringVar(&o.heapProfile, "heap-profile", "", "save the controller's heap profiles to this file, one per mesh size and protocol: at rest (<file>-<endpoints>-<protocol>) and halfway through the load (<file>-<endpoints>-<protocol>-load)")
	protocols := flag.String("protocols", "delta", "the simulated nodes' xDS variants, each run in turn: delta (the nodes' default), sotw, or both")
	flag.Parse()
	o.realArgs = strings.Fields(*realArgs)
	counts, err := benchenv.Counts("endpoints", *sizes, math.MaxInt32)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(2)
	}
	if o.reach < 0 {
		fmt.Fprintf(os.Stderr, "scale: -reach %d: want 0 (every endpoint) or more\n", o.reach)
		os.Exit(2)
	}
	if o.onDemand && *protocols != "delta" {
		fmt.Fprintln(os.Stderr, "scale: -on-demand needs -protocols delta: Envoy asks for clusters by name on delta streams alone")
		os.Exit(2)
	}
	if o.meshOnly < 0 || o.meshOnly > o.nodes {
		fmt.Fprintf(os.Stderr, "scale: -mesh-only-nodes %d: want 0 to -nodes (%d)\n", o.meshOnly, o.nodes)
		os.Exit(2)
	}
	reach := "every endpoint"
	if o.reach > 0 {
		reach = fmt.Sprintf("%d endpoints", o.reach)
	}
	if o.onDemand {
		reach += ", clusters on demand"
	}
	fmt.Printf("%d simulated nodes (%d of them mesh-only, reaching %s) and %d real ones, mTLS; %d changes timed one after the other; then a change every %s for %s\n\n",
		o.nodes, o.meshOnly, reach, o.realNodes, o.changes, o.interval, o.loadFor)
	fmt.Println("| endpoints | xDS | change to every node, p50 / p99 | bytes to the simulated nodes per change | controller RSS at rest / under load | controller CPU at rest / under load |")
	fmt.Println("|---:|---|---:|---:|---:|---:|")
	for _, n := range counts {
		for _, p := range strings.Split(*protocols, ",") {
			if p != "delta" && p != "sotw" {
				fmt.Fprintf(os.Stderr, "scale: -protocols: %q is neither delta nor sotw\n", p)
				os.Exit(2)
			}
			o.endpoints, o.protocol = n, p
			if err := run(o); err != nil {
				fmt.Fprintln(os.Stderr, "scale:", err)
				os.Exit(1)
			}
		}
	}
}

// options are one run's: the mesh's size, the nodes, the changes.
type options struct {
	endpoints, nodes, meshOnly, reach, realNodes, changes int
	interval, loadFor                                     time.Duration
	protocol, heapProfile, cpuProfile, memoryLimit        string
	realArgs                                              []string
	restartReal, onDemand                                 bool
}

func run(o options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	be, err := benchenv.Start(ctx, "scale")
	if err != nil {
		return err
	}
	defer be.Close()
	cpus := make([]string, o.realNodes)
	for i := range cpus {
		cpus[i] = "4"
	}
	mesh, err := be.StartMesh(benchenv.MeshOptions{Work: filepath.Join(be.Dir, "mesh"), NodeCPUs: cpus, AgentArgs: o.realArgs,
		ControllerArgs: []string{"--allow-replica-cidr", "10.0.0.0/8", "--debug-profiles"}, ControllerEnv: memoryLimit(o.memoryLimit)})
	if err != nil {
		return err
	}
	defer mesh.Stop()
	m := modelgen.Model(o.endpoints, 3, 3)
	if err := testutil.Until(60*time.Second, func() bool {
		_, err := mesh.Client.Apply(ctx, meshspec.SpecOf(m), api.ApplyOptions{})
		return err == nil
	}); err != nil {
		return fmt.Errorf("apply %d endpoints: %w", o.endpoints, err)
	}
	reaches := make([]simReach, o.nodes)
	for i := range reaches {
		reaches[i] = reachOf(m, i, i < o.nodes-o.meshOnly, o.reach)
		if o.onDemand {
			reaches[i] = onDemandReach(m, reaches[i])
		}
	}
	sims, err := startSims(ctx, be, simConfig{xds: mesh.XDSAddr, delta: o.protocol == "delta"}, reaches)
	if err != nil {
		return err
	}
	if err := allHaveRoutes(ctx, sims, mesh.Client, mesh.APIAddr, o.realNodes); err != nil {
		return err
	}
	if o.restartReal && o.realNodes > 0 {
		if err := restartReal(ctx, mesh, o.realNodes); err != nil {
			return err
		}
	}
	pid := mesh.Controller.Pid()
	time.Sleep(5 * time.Second) // let the initial pushes settle
	rest := measure(pid, 10*time.Second, func() {})
	if o.heapProfile != "" {
		if err := saveProfile(ctx, mesh.APIAddr, "heap", fmt.Sprintf("%s-%d-%s", o.heapProfile, o.endpoints, o.protocol)); err != nil {
			return err
		}
	}
	lat, bytes, err := timedChanges(ctx, mesh.Client, sims, o.realNodes, o.changes)
	if err != nil {
		return err
	}
	profiled := make(chan error, 1)
	if o.cpuProfile != "" {
		go func() {
			profiled <- saveProfile(ctx, mesh.APIAddr, fmt.Sprintf("profile?seconds=%d", max(1, int(o.loadFor.Seconds()))),
				fmt.Sprintf("%s-%d-%s", o.cpuProfile, o.endpoints, o.protocol))
		}()
	} else {
		profiled <- nil
	}
	heapUnderLoad := make(chan error, 1)
	if o.heapProfile != "" {
		go func() {
			time.Sleep(o.loadFor / 2)
			heapUnderLoad <- saveProfile(ctx, mesh.APIAddr, "heap", fmt.Sprintf("%s-%d-%s-load", o.heapProfile, o.endpoints, o.protocol))
		}()
	} else {
		heapUnderLoad <- nil
	}
	loaded := measure(pid, o.loadFor, func() { changeEvery(ctx, mesh.Client, o.interval, o.loadFor) })
	if err := errors.Join(<-profiled, <-heapUnderLoad); err != nil {
		return err
	}
	fmt.Printf("| %d | %s | %s / %s | %s | %.0f / %.0f MiB | %.0f%% / %.0f%% of a core |\n", o.endpoints, o.protocol, benchenv.Millis(benchenv.Percentile(lat, 50)), benchenv.Millis(benchenv.Percentile(lat, 99)),
		kib(bytes/int64(o.changes)), rest.rss, loaded.rss, 100*rest.cpu, 100*loaded.cpu)
	return nil
}

// memoryLimit is the controller's environment for a GOMEMLIMIT of limit
// ("": none).
func memoryLimit(limit string) []string {
	if limit == "" {
		return nil
	}
	return []string{"GOMEMLIMIT=" + limit}
}

// reachOf is what simulated node i serves and asks for: a public node,
// or a mesh-only one reaching every endpoint (reach 0) or reach of them:
// ep-0, which the bench changes, and others spread over the mesh.
func reachOf(m *meshspec.Model, i int, public bool, reach int) simReach {
	r := simReach{public: public}
	endpoints := m.Endpoints
	if !public && reach > 0 {
		r.reachable = []string{m.Endpoints[0].Name}
		endpoints = []meshspec.Endpoint{m.Endpoints[0]}
		for k := 1; k < reach && k < len(m.Endpoints); k++ {
			e := m.Endpoints[1+(i*(reach-1)+k-1)%(len(m.Endpoints)-1)]
			r.reachable = append(r.reachable, e.Name)
			endpoints = append(endpoints, e)
		}
		slices.Sort(r.reachable)
		r.reachable = slices.Compact(r.reachable)
	}
	backends := map[string]bool{}
	for _, e := range endpoints {
		for b := range e.Traffic {
			backends[wire.ClusterName(b)] = true
		}
		for b := range e.Shadows {
			backends[wire.ClusterName(b)] = true
		}
	}
	if r.reachable == nil || public { // every cluster: every backend's, the unused ones too
		for _, b := range m.Backends {
			backends[wire.ClusterName(b.Name)] = true
		}
	}
	r.assignments = meshspec.SortedKeys(backends)
	return r
}

// onDemandReach is r for a node whose clusters come on demand and which
// has sent requests to ep-0, the endpoint the bench changes: it names
// ep-0's clusters, and asks for their assignments alone and, without a
// public listener, for ep-0's mesh routes alone.
func onDemandReach(m *meshspec.Model, r simReach) simReach {
	backends := map[string]bool{}
	for b := range m.Endpoints[0].Traffic {
		backends[wire.ClusterName(b)] = true
	}
	r.onDemand, r.clusters = true, meshspec.SortedKeys(backends)
	r.assignments = r.clusters
	if !r.public {
		r.routes = []string{wire.MeshRouteName(m.Endpoints[0].Name)}
	}
	return r
}

// startSims fetches each simulated node's identity from Consul and
// connects it, one per reach.
func startSims(ctx context.Context, be *benchenv.Env, cfg simConfig, reaches []simReach) ([]*simNode, error) {
	n := len(reaches)
	client, err := be.Consul.Client()
	if err != nil {
		return nil, err
	}
	sims := make([]*simNode, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			id := fmt.Sprintf("sim-%04d", i)
			bundle, err := connect.Fetch(ctx, client, wire.NodeService(id))
			if err == nil {
				sims[i], err = dialSim(ctx, cfg, id, bundle, reaches[i])
			}
			if err != nil {
				errs <- fmt.Errorf("simulated node %s: %w", id, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return sims, <-errs
}

// allHaveRoutes waits until every simulated node has routes and every real
// one is in sync.
func allHaveRoutes(ctx context.Context, sims []*simNode, c *api.Client, apiAddr string, realNodes int) error {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for _, s := range sims {
		if _, err := s.waitRoutes(wctx, ""); err != nil {
			return err
		}
	}
	if err := testutil.Until(5*time.Minute, func() bool { return realInSync(ctx, c, realNodes) }); err != nil {
		return fmt.Errorf("the real nodes: %w: %s", err, xdsNodes(ctx, apiAddr))
	}
	return nil
}

// xdsNodes is what the controller says of the real nodes' xDS streams
// (versions acknowledged and expected), for an error.
func xdsNodes(ctx context.Context, apiAddr string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+apiAddr+"/v1/xds/nodes", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	var nodes []json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&nodes); err != nil {
		return err.Error()
	}
	var out []string
	for _, n := range nodes {
		if !strings.Contains(string(n), `"sim-`) {
			out = append(out, string(n))
		}
	}
	return strings.Join(out, "\n")
}

// realInSync reports whether the real nodes have the latest config.
func realInSync(ctx context.Context, c *api.Client, realNodes int) bool {
	s, err := c.Status(ctx)
	if err != nil {
		return false
	}
	n := 0
	for _, node := range s.Nodes {
		if strings.HasPrefix(node.ID, "sim-") {
			continue
		}
		if !node.InSync {
			return false
		}
		n++
	}
	return n == realNodes
}

// timedChanges flips the first endpoint's weights changes times, each
// once every node has the last, and returns how long each took to reach
// the last node, and the bytes the simulated nodes were sent in all.
func timedChanges(ctx context.Context, c *api.Client, sims []*simNode, realNodes, changes int) ([]time.Duration, int64, error) {
	var lat []time.Duration
	before := sentBytes(sims)
	for i := range changes {
		had := make([]string, len(sims))
		for j, s := range sims {
			had[j], _ = s.routesVersion()
		}
		if _, err := c.SetTraffic(ctx, "ep-0", flip(i)); err != nil {
			return nil, 0, err
		}
		accepted := time.Now()
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		last := accepted
		for j, s := range sims {
			at, err := s.waitRoutes(wctx, had[j])
			if err != nil {
				cancel()
				return nil, 0, err
			}
			if at.After(last) {
				last = at
			}
		}
		cancel()
		if err := testutil.Until(time.Minute, func() bool { return realInSync(ctx, c, realNodes) }); err != nil {
			return nil, 0, errors.New("the real nodes did not follow a change")
		}
		lat = append(lat, last.Sub(accepted)) // the real nodes' sync is checked, not timed (their status is polled)
	}
	return lat, sentBytes(sims) - before, nil
}

// restartReal restarts the first real node's agent, which stops its Envoy
// with it (the bench's agents stop theirs on exit), so a new Envoy loads
// the whole mesh; it prints how long until every real node is in sync
// again, and what that Envoy then holds and allocates (its admin API's
// /memory and /clusters).
func restartReal(ctx context.Context, mesh *benchenv.Mesh, realNodes int) error {
	start := time.Now()
	if err := mesh.RestartAgent(0); err != nil {
		return err
	}
	time.Sleep(time.Second) // the controller sees the old streams close
	if err := testutil.Until(5*time.Minute, func() bool { return realInSync(ctx, mesh.Client, realNodes) }); err != nil {
		return fmt.Errorf("the restarted real node: %w: %s", err, xdsNodes(ctx, mesh.APIAddr))
	}
	ready := time.Since(start)
	admin := envoy.Admin{Socket: envoy.AdminSocketIn(mesh.WorkDirs[0])}
	mem, err := admin.Get(ctx, "/memory")
	if err != nil {
		return fmt.Errorf("the restarted node's Envoy: %w", err)
	}
	var m struct {
		Allocated string `json:"allocated"`
		HeapSize  string `json:"heap_size"`
	}
	if err := json.Unmarshal(mem, &m); err != nil {
		return fmt.Errorf("the restarted node's Envoy /memory: %w", err)
	}
	clusters, err := admin.Get(ctx, "/clusters?format=json")
	if err != nil {
		return fmt.Errorf("the restarted node's Envoy: %w", err)
	}
	var cs struct {
		Statuses []json.RawMessage `json:"cluster_statuses"`
	}
	if err := json.Unmarshal(clusters, &cs); err != nil {
		return fmt.Errorf("the restarted node's Envoy /clusters: %w", err)
	}
	alloc, _ := strconv.ParseFloat(m.Allocated, 64)
	heap, _ := strconv.ParseFloat(m.HeapSize, 64)
	fmt.Printf("restarted real node (%s): in sync %.1f s after its agent started; its Envoy holds %d clusters, allocates %.0f MiB (heap %.0f MiB)\n",
		strings.Join(mesh.AgentArgs(0), " "), ready.Seconds(), len(cs.Statuses), alloc/(1<<20), heap/(1<<20))
	return nil
}

func flip(i int) map[string]float64 {
	w := 0.25 + 0.5*float64(i%2)
	return map[string]float64{"ep-0-v0": w, "ep-0-v1": 1 - w}
}

func sentBytes(sims []*simNode) int64 {
	var n int64
	for _, s := range sims {
		n += s.bytes.Load()
	}
	return n
}

// changeEvery flips the first endpoint's weights every interval for d,
// without waiting for the nodes.
func changeEvery(ctx context.Context, c *api.Client, interval, d time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		_, _ = c.SetTraffic(ctx, "ep-0", flip(i))
		<-t.C
	}
}

type usage struct{ rss, cpu float64 }

// measure runs work while it samples the process's RSS (the highest seen)
// and CPU (a share of one core over d).
func measure(pid int, d time.Duration, work func()) usage {
	done := make(chan struct{})
	go func() { work(); close(done) }()
	cpu0, start := testutil.CPUSeconds(pid), time.Now()
	var peak float64
	for time.Since(start) < d {
		peak = max(peak, testutil.RSSMiB(pid))
		time.Sleep(200 * time.Millisecond)
	}
	<-done
	return usage{rss: peak, cpu: (testutil.CPUSeconds(pid) - cpu0) / time.Since(start).Seconds()}
}

// saveHeapProfile saves the controller's heap profile (the API listener
// on loopback, without tokens, serves it) to file.
// saveProfile saves the controller's pprof profile (heap, or profile
// for CPU, with its query) to file.
func saveProfile(ctx context.Context, apiAddr, profile, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+apiAddr+"/debug/pprof/"+profile, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s profile: %w", profile, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s profile: HTTP %d", profile, resp.StatusCode)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return fmt.Errorf("%s profile: %w", profile, err)
	}
	return f.Close()
}

func kib(n int64) string { return fmt.Sprintf("%.0f KiB", float64(n)/1024) }
