//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// routeVersions returns the version of each route configuration Envoy holds.
func routeVersions(t *testing.T, n *node) map[string]string {
	t.Helper()
	dump, err := n.proc.Admin().ConfigDump(context.Background(), "dynamic_route_configs")
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Configs []struct {
			VersionInfo string `json:"version_info"`
			RouteConfig struct {
				Name string `json:"name"`
			} `json:"route_config"`
		} `json:"configs"`
	}
	if err := json.Unmarshal(dump, &parsed); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range parsed.Configs {
		out[c.RouteConfig.Name] = c.VersionInfo
	}
	return out
}

func TestControllerRestartChangesNothing(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "c1", []string{"--plaintext"})
	ctl.waitLeading(20 * time.Second)
	a, b := startReplicas(t, "a", 1), startReplicas(t, "b", 1)
	c := ctl.client("")
	ctx := context.Background()
	if _, err := c.Apply(ctx, meshspec.SpecOf(&meshspec.Model{
		Backends:  []meshspec.Backend{a.backendModel(), b.backendModel()},
		Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"a": 0.5, "b": 0.5}}},
	}), api.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	n := startEnvoy(t, "restart-node", ctl.xdsAddr, bootstrap.ProtocolSotW)
	waitNodeInSync(t, ctl.apiAddr)
	before, _ := c.ListEndpoints(ctx)
	versions := routeVersions(t, n)

	l := startLoad("http://"+n.public+"/svc", 4)
	time.Sleep(300 * time.Millisecond)
	ctl.kill()
	time.Sleep(500 * time.Millisecond)
	ctl.start()
	took := ctl.waitLeading(20 * time.Second)
	waitNodeInSync(t, ctl.apiAddr)
	time.Sleep(300 * time.Millisecond)
	l.finish(t)
	t.Logf("controller restarted and leading again %s after it started", took.Round(time.Millisecond))

	after, err := c.ListEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if store.Diff(&meshspec.Model{Endpoints: before}, &meshspec.Model{Endpoints: after}).Size() != 0 {
		t.Fatalf("state changed across a restart: %+v -> %+v", before, after)
	}
	if got := routeVersions(t, n); fmt.Sprint(got) != fmt.Sprint(versions) {
		t.Fatalf("Envoy's route versions changed across a restart: %v -> %v", versions, got)
	}
}

// TestCrashFuzz runs 300 random operations against a controller that exits
// right after a checkpoint with probability 0.1, restarted by a supervisor,
// with a client that retries. At the end the stored state, the API and
// Envoy's configuration must all equal the expected model.
func TestCrashFuzz(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "fuzz", []string{"--plaintext"}, "SERVEMESH_FAULT_CRASH_AFTER_CHECKPOINT=0.1")
	ctl.waitLeading(20 * time.Second)
	var crashes atomic.Int32
	supervise := make(chan struct{})
	supervised := make(chan struct{})
	go func() { // restart the controller whenever it exits
		defer close(supervised)
		for {
			select {
			case <-supervise:
				return
			case <-ctl.child.Done():
				crashes.Add(1)
				ctl.start()
			}
		}
	}()
	replicas := startReplicas(t, "pool", 2)
	n := startEnvoy(t, "fuzz-node", ctl.xdsAddr, bootstrap.ProtocolSotW)

	seed := uint64(time.Now().UnixNano())
	t.Logf("fuzz seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	fz := &fuzzer{t: t, c: ctl.client(""), rng: rng, want: &meshspec.Model{}, addrs: replicas.addrs}
	for i := range 300 {
		fz.step(i)
	}
	close(supervise)
	<-supervised
	if ctl.exited() {
		ctl.start()
	}
	ctl.waitLeading(20 * time.Second)
	t.Logf("%d operations accepted, %d refused as invalid, %d retries, %d controller crashes", fz.accepted, fz.refused, fz.retries, crashes.Load())
	if crashes.Load() == 0 {
		t.Fatal("the controller never crashed; fault injection did not run")
	}

	consulClient, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	stored, _, err := store.NewConsul(consulClient, "servemesh", slog.New(slog.DiscardHandler)).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d := store.Diff(fz.want, stored); d.Size() != 0 {
		t.Fatalf("Consul holds a different state than expected: %+v\naccepted operations:\n%s", d, strings.Join(fz.log, "\n"))
	}
	backends, err1 := fz.c.ListBackends(context.Background())
	endpoints, err2 := fz.c.ListEndpoints(context.Background())
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if d := store.Diff(fz.want, &meshspec.Model{Backends: backends, Endpoints: endpoints}); d.Size() != 0 {
		t.Fatalf("the API answers a different state than expected: %+v", d)
	}
	waitNodeInSync(t, ctl.apiAddr)
	if got, want := envoyPolicies(t, n.proc.Admin()), expectedPolicies(fz.want); got != want {
		t.Fatalf("Envoy's routes differ from the expected model:\n got  %s\n want %s", got, want)
	}
}

type fuzzer struct {
	t                          *testing.T
	c                          *api.Client
	rng                        *rand.Rand
	want                       *meshspec.Model
	addrs                      []string
	next                       int
	accepted, refused, retries int
	log                        []string // accepted operations, in order
}

// call retries op until the controller answers (it may be restarting); it
// reports whether the op was accepted (false: refused as invalid).
func (f *fuzzer) call(what string, op func() error) bool {
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := op()
		var apiErr *api.Error
		switch {
		case err == nil:
			f.accepted++
			f.log = append(f.log, fmt.Sprintf("#%d %s", f.accepted, what))
			return true
		case errors.As(err, &apiErr) && apiErr.Status >= 400 && apiErr.Status < 500:
			f.refused++
			return false
		case time.Now().After(deadline):
			f.t.Fatalf("%s: no answer within 60s: %v", what, err)
		}
		f.retries++
		time.Sleep(100 * time.Millisecond)
	}
}

func (f *fuzzer) step(i int) {
	ctx := context.Background()
	m := f.want
	pick := func(n int) int { return f.rng.IntN(n) }
	switch r := pick(100); {
	case r < 20 || len(m.Backends) < 2:
		b := meshspec.Backend{Name: fmt.Sprintf("b%d", f.next), Replicas: []meshspec.Replica{{Address: f.addrs[pick(len(f.addrs))]}}}
		f.next++
		if f.call("create backend "+b.Name, func() error { _, err := f.c.CreateBackend(ctx, meshspec.BackendSpecOf(b)); return err }) {
			m.Backends = append(m.Backends, b)
		}
	case r < 30:
		b := &m.Backends[pick(len(m.Backends))]
		mcq := 1 + pick(50)
		if f.call(fmt.Sprintf("update backend %s max_concurrent_queries=%d", b.Name, mcq), func() error {
			_, err := f.c.UpdateBackend(ctx, b.Name, meshspec.BackendConfigPatch{MaxConcurrentQueries: &mcq})
			return err
		}) {
			b.Config.MaxConcurrentQueries = mcq
		}
	case r < 45:
		name := fmt.Sprintf("e%d", f.next)
		f.next++
		e := meshspec.Endpoint{Name: name, Traffic: map[string]float64{m.Backends[pick(len(m.Backends))].Name: 1}}
		if pick(3) > 0 {
			e.Route = "/" + name
		}
		if f.call("create endpoint", func() error { _, err := f.c.CreateEndpoint(ctx, e); return err }) {
			m.Endpoints = append(m.Endpoints, e)
		}
	case r < 65 && len(m.Endpoints) > 0:
		e := &m.Endpoints[pick(len(m.Endpoints))]
		b1, b2 := m.Backends[pick(len(m.Backends))].Name, m.Backends[pick(len(m.Backends))].Name
		w := float64(pick(11)) / 10
		traffic := map[string]float64{b1: w}
		traffic[b2] += 1 - w
		if pick(10) == 0 { // deliberately invalid: must be refused
			traffic[b1] += 0.5
			if f.call("invalid traffic", func() error { _, err := f.c.SetTraffic(ctx, e.Name, traffic); return err }) {
				f.t.Fatalf("op %d: traffic summing to %v was accepted", i, 1.5)
			}
			return
		}
		if f.call(fmt.Sprintf("set traffic %s %v", e.Name, traffic), func() error { _, err := f.c.SetTraffic(ctx, e.Name, traffic); return err }) {
			e.Traffic = traffic
		}
	case r < 80 && len(m.Endpoints) > 0:
		e := &m.Endpoints[pick(len(m.Endpoints))]
		b := m.Backends[pick(len(m.Backends))].Name
		p := float64(pick(5)) / 4
		if f.call(fmt.Sprintf("set shadow %s %s=%v", e.Name, b, p), func() error { _, err := f.c.SetShadow(ctx, e.Name, b, p); return err }) {
			if p == 0 {
				delete(e.Shadows, b)
			} else {
				if e.Shadows == nil {
					e.Shadows = map[string]float64{}
				}
				e.Shadows[b] = p
			}
		}
	case r < 90 && len(m.Endpoints) > 0:
		j := pick(len(m.Endpoints))
		name := m.Endpoints[j].Name
		if f.call("delete endpoint "+name, func() error { _, err := f.c.DeleteEndpoint(ctx, name); return err }) {
			m.Endpoints = append(m.Endpoints[:j], m.Endpoints[j+1:]...)
		}
	default:
		j := pick(len(m.Backends))
		name := m.Backends[j].Name
		used := false
		for _, e := range m.Endpoints {
			_, inTraffic := e.Traffic[name]
			_, inShadows := e.Shadows[name]
			used = used || inTraffic || inShadows
		}
		accepted := f.call("delete backend "+name, func() error { _, err := f.c.DeleteBackend(ctx, name); return err })
		if accepted == used {
			f.t.Fatalf("op %d: deleting backend %s (used: %v) was accepted=%v", i, name, used, accepted)
		}
		if accepted {
			m.Backends = append(m.Backends[:j], m.Backends[j+1:]...)
		}
	}
}

// expectedPolicies renders each endpoint's weights and shadows, as the mesh
// route configuration should hold them, in one comparable string.
func expectedPolicies(m *meshspec.Model) string {
	var lines []string
	for _, e := range m.Endpoints {
		var parts []string
		for _, b := range meshspec.SortedKeys(e.Traffic) {
			if e.Traffic[b] > 0 {
				parts = append(parts, fmt.Sprintf("%s=%d", b, int(e.Traffic[b]*1e6+0.5)))
			}
		}
		for _, b := range meshspec.SortedKeys(e.Shadows) {
			if e.Shadows[b] > 0 {
				parts = append(parts, fmt.Sprintf("mirror:%s=%d", b, int(e.Shadows[b]*1e6+0.5)))
			}
		}
		lines = append(lines, e.Name+"{"+strings.Join(parts, ",")+"}")
	}
	sort.Strings(lines)
	return strings.Join(lines, " ")
}

// envoyPolicies reads the same from Envoy's mesh route configuration.
func envoyPolicies(t *testing.T, admin envoy.Admin) string {
	t.Helper()
	dump, err := admin.ConfigDump(context.Background(), "dynamic_route_configs")
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Configs []struct {
			RouteConfig struct {
				Name         string `json:"name"`
				VirtualHosts []struct {
					Name   string `json:"name"`
					Routes []struct {
						Route *struct {
							Cluster          string `json:"cluster"`
							WeightedClusters struct {
								Clusters []struct {
									Name   string `json:"name"`
									Weight int    `json:"weight"`
								} `json:"clusters"`
							} `json:"weighted_clusters"`
							Mirrors []struct {
								Cluster         string `json:"cluster"`
								RuntimeFraction struct {
									DefaultValue struct {
										Numerator int `json:"numerator"`
									} `json:"default_value"`
								} `json:"runtime_fraction"`
							} `json:"request_mirror_policies"`
						} `json:"route"`
					} `json:"routes"`
				} `json:"virtual_hosts"`
			} `json:"route_config"`
		} `json:"configs"`
	}
	if err := json.Unmarshal(dump, &parsed); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, c := range parsed.Configs {
		if !strings.HasPrefix(c.RouteConfig.Name, wire.MeshRouteName("")) {
			continue
		}
		for _, vh := range c.RouteConfig.VirtualHosts {
			r := vh.Routes[0].Route
			weights, mirrors := map[string]int{}, map[string]int{}
			if r.Cluster != "" {
				weights[r.Cluster] = 1000000
			}
			for _, wc := range r.WeightedClusters.Clusters {
				weights[wc.Name] = wc.Weight
			}
			for _, m := range r.Mirrors {
				mirrors[m.Cluster] = m.RuntimeFraction.DefaultValue.Numerator
			}
			// Ordered by backend name, as expectedPolicies orders them.
			var parts []string
			for _, b := range meshspec.SortedKeys(weights) {
				parts = append(parts, fmt.Sprintf("%s=%d", b, weights[b]))
			}
			for _, b := range meshspec.SortedKeys(mirrors) {
				parts = append(parts, fmt.Sprintf("mirror:%s=%d", b, mirrors[b]))
			}
			lines = append(lines, vh.Name+"{"+strings.Join(parts, ",")+"}")
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, " ")
}
