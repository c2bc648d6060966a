package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/servemesh/servemesh/controlplane/catalog"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
)

func processState() *meshspec.Model {
	return &meshspec.Model{Backends: []meshspec.Backend{
		{Name: "run", Process: &meshspec.ProcessSpec{Command: "/srv/x"}, Config: meshspec.BackendConfig{NumReplicas: 2,
			Autoscaling: &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 3, TargetInFlight: 1}}, Placements: []meshspec.Placement{
			{Tag: "run#000001", Node: "n1", State: meshspec.Running},
			{Tag: "run#000002", Node: "n2", State: meshspec.Draining},
			{Tag: "run#000003", Node: "n3", State: meshspec.Running},
		}},
		{Name: "ext", External: &meshspec.ExternalSpec{Service: "legacy"}},
		{Name: "static", Replicas: []meshspec.Replica{{Address: "127.0.0.1:1"}}},
	}}
}

// withAgents adds to instances the agent registration of nodes n1 to n3,
// each on Consul node c1 to c3, with inbound listener fmt.Sprintf(inbound,
// i) unless inbound is "".
func withAgents(instances map[string][]catalog.Instance, inbound string) map[string][]catalog.Instance {
	for i := 1; i <= 3; i++ {
		reg := catalog.Instance{ID: fmt.Sprintf("servemesh-agent-n%d", i), Node: fmt.Sprintf("n%d", i), ConsulNode: fmt.Sprintf("c%d", i)}
		if inbound != "" {
			reg.Inbound = fmt.Sprintf(inbound, i)
		}
		instances[fmt.Sprintf("servemesh-node-n%d", i)] = []catalog.Instance{reg}
	}
	return instances
}

func TestView(t *testing.T) {
	m := processState()
	view, dropped := Replicas(m, withAgents(map[string][]catalog.Instance{
		"servemesh-backend-run": {
			{ID: "a", Address: "127.0.0.2:1000", Tag: "run#000001", Passing: true, Node: "n1", ConsulNode: "c1"},
			{ID: "b", Address: "127.0.0.3:1000", Tag: "run#000002", Passing: true, Node: "n2", ConsulNode: "c2"},
			{ID: "c", Address: "127.0.0.4:1000", Tag: "run#000003", Passing: false, Node: "n3", ConsulNode: "c3"},
			{ID: "d", Address: "127.0.0.5:1000", Tag: "run#ffffff", Passing: true, Node: "n1", ConsulNode: "c1"}, // not placed
		},
		"legacy": {
			{ID: "l", Address: "10.0.0.1:80", Passing: true},
			{ID: "dns", Address: "legacy.internal:80", Passing: true}, // a DNS name the operator did not allow
			{ID: "junk", Address: "not an address", Passing: true},    // dropped alone
			{ID: "twice", Address: "10.0.0.1:80", Passing: true},      // same address: dropped alone
			{ID: "admin", Address: "127.0.0.1:15000", Passing: true},  // on the node: refused unless allowed
			{ID: "meta", Address: "169.254.169.254:80", Passing: true},
		},
	}, ""), Rules{})
	if dp, err := ir.Lower(m, view, ir.Options{}); err != nil || len(dp.Backends) != 3 {
		t.Fatalf("the stored state with these replicas must lower to an IR of its three backends: %v", err)
	}
	want := []meshspec.Replica{
		{Address: "127.0.0.2:1000", Health: meshspec.HealthHealthy, Node: "n1"},
		{Address: "127.0.0.3:1000", Health: meshspec.HealthDraining, Node: "n2"},
		{Address: "127.0.0.4:1000", Health: meshspec.HealthUnhealthy, Node: "n3"},
	}
	if got := view["run"]; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("process backend replicas %+v, want %+v", got, want)
	}
	if got := view["ext"]; len(got) != 1 || got[0].Address != "10.0.0.1:80" {
		t.Fatalf("external backend replicas %+v", got)
	}
	if len(dropped) != 5 || dropped[0].Instance != "dns" || !strings.Contains(dropped[0].Reason, "--allow-replica-name legacy.internal") ||
		dropped[1].Instance != "junk" || !strings.Contains(dropped[1].Reason, "not an IP:port or host:port") ||
		dropped[2].Instance != "twice" || dropped[2].Backend != "ext" ||
		dropped[3].Instance != "admin" || !strings.Contains(dropped[3].Reason, "--allow-replica-cidr") || dropped[4].Instance != "meta" {
		t.Fatalf("dropped %+v, want the name, the unreadable, the duplicate, the loopback and the link-local instance", dropped)
	}
	allowed, dropped := Replicas(m, map[string][]catalog.Instance{"legacy": {{ID: "admin", Address: "127.0.0.1:9001", Passing: true}}},
		Rules{Addresses: meshspec.AddressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	if len(dropped) != 0 || len(allowed["ext"]) != 1 {
		t.Fatalf("with loopback allowed, an external instance there is served: %+v, dropped %+v", allowed["ext"], dropped)
	}
	if len(view["static"]) != 1 || m.Backends[0].Replicas != nil || m.Backends[0].Process == nil || len(m.Backends[0].Placements) != 3 {
		t.Fatal("static replicas lost, or the input state was modified")
	}
	if len(view) != 3 {
		t.Fatalf("replicas of %d backends, want every served backend's: %v", len(view), view)
	}
	if s, want := Services(m), []string{"servemesh-backend-run", "legacy", "servemesh-node-n1", "servemesh-node-n2", "servemesh-node-n3"}; !slices.Equal(s, want) {
		t.Fatalf("services %v, want %v", s, want)
	}
}

// TestViewIsTheIR: View is the IR of the merged view, with how nodes reach
// each backend decided: a process backend's replicas through their nodes'
// inbound listeners with mTLS, at their addresses without; an external
// backend's instances at theirs. load_aware is served (picked) only where
// there is an inbound listener for the picker: in a plaintext mesh the
// backend is served without it, as the controller's status says, and the
// view is not refused.
func TestViewIsTheIR(t *testing.T) {
	for _, mtls := range []bool{true, false} {
		m := processState()
		m.Backends[0].Config.LoadAware = &meshspec.LoadAware{}
		inbound := ""
		if mtls {
			inbound = "10.0.0.%d:21000"
		}
		in := catalog.Instance{ID: "a", Address: "127.0.0.2:1000", Tag: "run#000001", Passing: true, Node: "n1", ConsulNode: "c1"}
		if mtls {
			in.Inbound = "10.0.0.1:21000"
		}
		dp, _, err := View(m, withAgents(map[string][]catalog.Instance{
			"servemesh-backend-run": {in},
			"legacy":                {{ID: "l", Address: "10.0.0.1:80", Passing: true}},
		}, inbound), Rules{MTLS: mtls})
		if err != nil {
			t.Fatalf("mtls=%v: %v", mtls, err)
		}
		run, _ := dp.Backend("run")
		ext, _ := dp.Backend("ext")
		wantReach := ir.ReachAddress
		if mtls {
			wantReach = ir.ReachInbound
		}
		if run.Reach != wantReach || run.Picked != mtls || len(run.Replicas) != 1 || run.Replicas[0].Health != ir.Healthy {
			t.Errorf("mtls=%v: process backend %+v, want reach %s, picked %v, one healthy replica", mtls, run, wantReach, mtls)
		}
		if ext.Reach != ir.ReachAddress || len(ext.Replicas) != 1 || ext.Replicas[0].Inbound != "" {
			t.Errorf("mtls=%v: external backend %+v, want its instance at its address", mtls, ext)
		}
	}
}

// TestViewOfALoadAwareBackendWithNoReplicaYet: a load-aware process
// backend whose replicas are not registered yet (just created, scaled to
// zero, all crashed) has no replica in the view; the view is served, not
// refused as if users had written load_aware on a backend of listed
// replicas (which held every other change back while it lasted: the
// e2e engine tests' first --wait failed so).
func TestViewOfALoadAwareBackendWithNoReplicaYet(t *testing.T) {
	m := processState()
	m.Backends[0].Config.LoadAware = &meshspec.LoadAware{PromptAffinity: true}
	dp, _, err := View(m, withAgents(map[string][]catalog.Instance{}, "10.0.0.%d:21000"), Rules{MTLS: true})
	if err != nil {
		t.Fatalf("the view of a load-aware backend with no replica yet: %v; want it served", err)
	}
	if run, ok := dp.Backend("run"); !ok || !run.Picked || len(run.Replicas) != 0 {
		t.Fatalf("backend run in the view: %+v, %v; want it picked, with no replica", run, ok)
	}
}

// TestViewServesOnlyWhatNodesMayClaim: any node's Consul token may register
// instances of a backend's service, claiming any node; such an instance
// used to be served (other nodes sent it traffic over mTLS). Now an
// instance is served only as the one replica of its placement, on the
// placement's node, registered on the Consul node of that node's agent
// registration with its inbound listener.
// TestViewUnknownHealth: a replica whose check only expired (its agent or
// Consul stalled) is of unknown health, not unhealthy, unless it drains.
func TestViewUnknownHealth(t *testing.T) {
	view, _ := Replicas(processState(), withAgents(map[string][]catalog.Instance{
		"servemesh-backend-run": {
			{ID: "a", Address: "127.0.0.2:1000", Tag: "run#000001", Expired: true, Node: "n1", ConsulNode: "c1"},
			{ID: "b", Address: "127.0.0.3:1000", Tag: "run#000002", Expired: true, Node: "n2", ConsulNode: "c2"},
			{ID: "c", Address: "127.0.0.4:1000", Tag: "run#000003", Node: "n3", ConsulNode: "c3"},
		},
	}, ""), Rules{})
	var got []meshspec.Health
	for _, r := range view["run"] {
		got = append(got, r.Health)
	}
	if want := []meshspec.Health{meshspec.HealthUnknown, meshspec.HealthDraining, meshspec.HealthUnhealthy}; !slices.Equal(got, want) {
		t.Fatalf("health %v, want %v", got, want)
	}
}

func TestViewServesOnlyWhatNodesMayClaim(t *testing.T) {
	m := processState()
	genuine := catalog.Instance{ID: "a", Address: "127.0.0.1:1000", Tag: "run#000001", Passing: true, Node: "n1", Inbound: "10.0.0.1:21000", ConsulNode: "c1"}
	for name, tc := range map[string]struct {
		fake   catalog.Instance
		reason string
	}{
		"another node's placement": {catalog.Instance{ID: "f", Address: "127.0.0.1:2000", Tag: "run#000003", Passing: true, Node: "n2",
			Inbound: "10.0.0.2:21000", ConsulNode: "c2"}, `placed on node "n3"`},
		"the placement's node, from another Consul node": {catalog.Instance{ID: "f", Address: "127.0.0.1:2000", Tag: "run#000003", Passing: true,
			Node: "n3", Inbound: "10.0.0.2:21000", ConsulNode: "c2"}, `does not match`},
		"the placement's node and Consul node, another inbound": {catalog.Instance{ID: "f", Address: "127.0.0.1:2000", Tag: "run#000003",
			Passing: true, Node: "n3", Inbound: "10.0.0.2:21000", ConsulNode: "c3"}, `does not match`},
		"a second registration of a replica": {catalog.Instance{ID: "z", Address: "127.0.0.1:2000", Tag: "run#000001", Passing: true,
			Node: "n1", Inbound: "10.0.0.1:21000", ConsulNode: "c1"}, "registered twice"},
		"a node without an agent": {catalog.Instance{ID: "f", Address: "127.0.0.1:2000", Tag: "run#000004", Passing: true, Node: "n4",
			Inbound: "10.0.0.4:21000", ConsulNode: "c4"}, "no agent registration"},
	} {
		state := meshspec.Clone(m)
		state.Backends[0].Placements = append(state.Backends[0].Placements, meshspec.Placement{Tag: "run#000004", Node: "n4", State: meshspec.Running})
		view, dropped := Replicas(state, withAgents(map[string][]catalog.Instance{"servemesh-backend-run": {genuine, tc.fake}}, "10.0.0.%d:21000"), Rules{MTLS: true})
		if got := view["run"]; len(got) != 1 || got[0].Address != genuine.Address || got[0].Node != "n1" {
			t.Errorf("%s: served %+v, want the genuine replica alone", name, got)
		}
		if len(dropped) != 1 || dropped[0].Instance != tc.fake.ID || !strings.Contains(dropped[0].Reason, tc.reason) {
			t.Errorf("%s: dropped %+v, want the fake, because %q", name, dropped, tc.reason)
		}
	}
}

// TestViewMTLS: with mesh mTLS, replicas keep their node and its inbound
// listener; the same loopback address on two nodes is two replicas; a
// replica whose node has no inbound listener is dropped with the reason.
func TestViewMTLS(t *testing.T) {
	m := processState()
	view, dropped := Replicas(m, withAgents(map[string][]catalog.Instance{
		"servemesh-backend-run": {
			{ID: "a", Address: "127.0.0.1:1000", Tag: "run#000001", Passing: true, Node: "n1", Inbound: "10.0.0.1:21000", ConsulNode: "c1"},
			{ID: "b", Address: "127.0.0.1:1000", Tag: "run#000002", Passing: true, Node: "n2", Inbound: "10.0.0.2:21000", ConsulNode: "c2"},
			{ID: "c", Address: "10.0.0.3:1000", Tag: "run#000003", Passing: true, Node: "n3", ConsulNode: "c3"},
		},
		"legacy": {{ID: "l", Address: "10.0.0.9:80", Passing: true, Node: "x", Inbound: "10.0.0.9:21000"}},
	}, "10.0.0.%d:21000"), Rules{MTLS: true})
	if _, err := ir.Lower(m, view, ir.Options{MTLS: true}); err != nil {
		t.Fatalf("the stored state with these replicas must lower to an IR: %v", err)
	}
	got := view["run"]
	if len(got) != 2 || got[0].Inbound != "10.0.0.1:21000" || got[0].Node != "n1" || got[1].Inbound != "10.0.0.2:21000" {
		t.Fatalf("process backend replicas %+v, want both loopback replicas with their nodes' inbound listeners", got)
	}
	if len(dropped) != 1 || dropped[0].Instance != "c" || !strings.Contains(dropped[0].Reason, `node "n3" announces no inbound listener`) {
		t.Fatalf("dropped %+v, want the replica of the node without mesh mTLS", dropped)
	}
	if ext := view["ext"]; len(ext) != 1 || ext[0].Inbound != "" || ext[0].Node != "" {
		t.Fatalf("an external instance is reached directly, whatever its meta says: %+v", ext)
	}
}

// fakeInstances is a health view the test changes by hand.
type fakeInstances struct {
	mu      sync.Mutex
	synced  []string
	current map[string][]catalog.Instance
	changed chan struct{}
	taken   map[string]bool // changed since TakeChanged last took them
}

func (f *fakeInstances) Sync(services []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.synced = services
}

// Snapshot returns a copy, as the catalog's Watcher does: the publisher
// reads it while the test sets instances.
func (f *fakeInstances) Snapshot() map[string][]catalog.Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.current)
}

func (f *fakeInstances) Instances(services []string) map[string][]catalog.Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]catalog.Instance{}
	for _, s := range services {
		if is, ok := f.current[s]; ok {
			out[s] = is
		}
	}
	return out
}

func (f *fakeInstances) Changed() <-chan struct{} { return f.changed }

func (f *fakeInstances) TakeChanged() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Sorted(maps.Keys(f.taken))
	clear(f.taken)
	return out
}

func (f *fakeInstances) set(service string, in ...catalog.Instance) {
	f.mu.Lock()
	if f.current == nil {
		f.current = map[string][]catalog.Instance{}
	}
	f.current[service] = in
	if f.taken == nil {
		f.taken = map[string]bool{}
	}
	f.taken[service] = true
	f.mu.Unlock()
	select {
	case f.changed <- struct{}{}:
	default: // a change is pending already
	}
}

// sink records the IRs it is given, refusing them while refuse is set.
type sink struct {
	mu     sync.Mutex
	views  []*ir.DataPlane
	refuse error
}

func (s *sink) SetDataPlane(m *ir.DataPlane) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse != nil {
		return s.refuse
	}
	s.views = append(s.views, m)
	return nil
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.views)
}

func (s *sink) last() *ir.DataPlane {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.views[len(s.views)-1]
}

func newPublisher(t *testing.T) (*Publisher, *fakeInstances, *sink, *prometheus.Registry) {
	t.Helper()
	in := &fakeInstances{changed: make(chan struct{}, 1)}
	out := &sink{}
	reg := prometheus.NewRegistry()
	p := New(Options{Sink: out, Instances: in, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: reg})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = p.Run(ctx) }()
	return p, in, out, reg
}

func TestPublisherFollowsStateAndHealth(t *testing.T) {
	p, in, out, _ := newPublisher(t)
	if err := p.Publish(processState(), 7, meshspec.WholeState); err != nil {
		t.Fatal(err)
	}
	if run, _ := out.last().Backend("run"); out.count() != 1 || len(run.Replicas) != 0 {
		t.Fatalf("first view: %d views", out.count())
	}
	in.mu.Lock()
	synced := in.synced
	in.mu.Unlock()
	if want := []string{"servemesh-backend-run", "legacy", "servemesh-node-n1", "servemesh-node-n2", "servemesh-node-n3"}; !slices.Equal(synced, want) {
		t.Fatalf("watched services %v, want %v: the process and the external backend's, and the agents of the placements' nodes", synced, want)
	}
	in.set("servemesh-node-n1", catalog.Instance{ID: "n1", Node: "n1", ConsulNode: "c1"})
	in.set("servemesh-backend-run", catalog.Instance{ID: "a", Address: "127.0.0.2:1000", Tag: "run#000001", Passing: true, Node: "n1", ConsulNode: "c1"})
	// Each change of the catalog may be its own view (the node's, then its
	// replica's) or one: the last view has the replica either way.
	testutil.WaitFor(t, 5*time.Second, "a view with the new replica", func() bool {
		run, _ := out.last().Backend("run")
		return out.count() >= 2 && len(run.Replicas) == 1
	})
	// Every view, the health-driven ones too, carries the revision of the
	// state it was made of: what the API's wait compares.
	if got := out.last().Revision; got != 7 {
		t.Errorf("the health-driven view's revision: %d, want 7, the published state's", got)
	}
}

// TestPublisherReportsRefusedViews: a view the data plane refuses, on either
// path, is an error the caller sees (Publish), kept in Err and counted,
// until a later view is accepted.
func TestPublisherReportsRefusedViews(t *testing.T) {
	p, in, out, reg := newPublisher(t)
	out.refuse = errors.New("invalid model")
	if err := p.Publish(processState(), 7, meshspec.WholeState); err == nil || !strings.Contains(err.Error(), "invalid model") {
		t.Fatalf("Publish returned %v, want the sink's refusal", err)
	}
	in.set("servemesh-backend-run", catalog.Instance{ID: "a", Address: "127.0.0.2:1000", Tag: "run#000001", Passing: true})
	testutil.WaitFor(t, 5*time.Second, "the health-driven refusal to be counted", func() bool {
		return promtest.ToFloat64(p.failures) == 2
	})
	if p.Err() == nil {
		t.Fatal("Err is nil after a refused view")
	}
	if n, err := promtest.GatherAndCount(reg, "servemesh_dataplane_view_refusals_total"); err != nil || n != 1 {
		t.Fatalf("refusal metric not exported: %d series, %v", n, err)
	}
	out.mu.Lock()
	out.refuse = nil
	out.mu.Unlock()
	if err := p.Publish(processState(), 7, meshspec.WholeState); err != nil || p.Err() != nil {
		t.Fatalf("an accepted view must clear the error: %v, %v", err, p.Err())
	}
}

// TestPublisherRefusesAnInvalidState: a stored state that fails
// validation (another writer stored it) is refused once, when published:
// the data plane keeps following the last valid state, health changes
// included, and Err says why until a valid state is published.
func TestPublisherRefusesAnInvalidState(t *testing.T) {
	p, in, out, _ := newPublisher(t)
	if err := p.Publish(processState(), 7, meshspec.WholeState); err != nil {
		t.Fatal(err)
	}
	bad := processState()
	bad.Endpoints = []meshspec.Endpoint{{Name: "e", Route: "/e", Traffic: map[string]float64{"run": 0.5}}}
	if err := p.Publish(bad, 8, meshspec.WholeState); err == nil || !strings.Contains(err.Error(), "sum to 1") || !strings.Contains(err.Error(), "revision 8") {
		t.Fatalf("Publish of an invalid state: %v; want its validation error, naming its revision", err)
	}
	in.set("servemesh-node-n1", catalog.Instance{ID: "n1", Node: "n1", ConsulNode: "c1"})
	in.set("servemesh-backend-run", catalog.Instance{ID: "a", Address: "127.0.0.2:1000", Tag: "run#000001", Passing: true, Node: "n1", ConsulNode: "c1"})
	testutil.WaitFor(t, 5*time.Second, "a view of the last valid state with the new replica", func() bool {
		run, _ := out.last().Backend("run")
		return len(run.Replicas) == 1
	})
	if last := out.last(); last.Revision != 7 || len(last.Endpoints) != 0 {
		t.Fatalf("the view after the invalid state: revision %d, %d endpoints; want the last valid state's (7, none)", last.Revision, len(last.Endpoints))
	}
	if err := p.Err(); err == nil || !strings.Contains(err.Error(), "invalid") {
		t.Fatalf("Err after a health change: %v; want the invalid state still reported", err)
	}
	if err := p.Publish(processState(), 9, meshspec.WholeState); err != nil || p.Err() != nil {
		t.Fatalf("a valid state must clear the error: %v, %v", err, p.Err())
	}
}

// TestRefusedViewIsRetried: a view the data plane refused is offered again
// without waiting for the next change, so a passing refusal heals itself.
func TestRefusedViewIsRetried(t *testing.T) {
	p, _, out, _ := newPublisher(t)
	out.mu.Lock()
	out.refuse = errors.New("not now")
	out.mu.Unlock()
	if err := p.Publish(processState(), 7, meshspec.WholeState); err == nil {
		t.Fatal("the refusal was not returned")
	}
	out.mu.Lock()
	out.refuse = nil
	out.mu.Unlock()
	deadline := time.Now().Add(3 * RetryEvery)
	for p.Err() != nil || out.count() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a refused view was not offered again")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestViewResolvesAllowedNames: an allowed DNS name reaches the data plane
// as the addresses it resolves to, each checked as an IP literal would be,
// so a name that resolves (or is later pointed) at loopback or the metadata
// service gets no traffic (issue 34). The view never waits for DNS.
func TestViewResolvesAllowedNames(t *testing.T) {
	var mu sync.Mutex
	answers := map[string][]netip.Addr{"legacy.internal": {netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("127.0.0.1")}}
	names := NewResolver(func(_ context.Context, host string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(answers[host]), nil
	}, 10*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = names.Run(ctx) }()
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "static", Replicas: []meshspec.Replica{{Address: "legacy.internal:8080"}, {Address: "10.0.0.1:80"}}}}}
	rules := Rules{Addresses: meshspec.AddressPolicy{Names: []string{".internal"}}, Names: names}
	view, dropped := Replicas(m, nil, rules)
	if got := view["static"]; len(got) != 1 || len(dropped) != 1 || !strings.Contains(dropped[0].Reason, "resolving legacy.internal") {
		t.Fatalf("before the name is resolved: replicas %+v, dropped %+v", got, dropped)
	}
	select {
	case <-names.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("no change signalled once the name was resolved")
	}
	view, dropped = Replicas(m, nil, rules)
	if got := view["static"]; len(got) != 2 || got[0].Address != "10.0.0.9:8080" || got[1].Address != "10.0.0.1:80" {
		t.Fatalf("replicas %+v, want the name's public address and the literal", got)
	}
	if len(dropped) != 1 || !strings.Contains(dropped[0].Reason, "resolves to 127.0.0.1") || !strings.Contains(dropped[0].Reason, "on loopback") {
		t.Fatalf("dropped %+v, want the loopback address refused", dropped)
	}
	mu.Lock()
	answers["legacy.internal"] = []netip.Addr{netip.MustParseAddr("169.254.169.254")} // rebinding
	mu.Unlock()
	testutil.WaitFor(t, 5*time.Second, "the new answer to be used", func() bool {
		view, dropped = Replicas(m, nil, rules)
		return len(view["static"]) == 1 && len(dropped) == 1 && strings.Contains(dropped[0].Reason, "link-local")
	})
	// A name stored before names needed the operator's leave gets no
	// traffic until it is given.
	rules.Addresses.Names = nil
	if view, dropped = Replicas(m, nil, rules); len(view["static"]) != 1 || len(dropped) != 1 || !strings.Contains(dropped[0].Reason, meshspec.NameFlag) {
		t.Fatalf("a name no longer allowed: replicas %+v, dropped %+v", view["static"], dropped)
	}
}

// TestPublisherCarriesTheChange: each IR handed over names what changed
// since the last one the sink took (ir.Delta): nothing named after the
// first, which is whole; the backends and endpoints a state's change
// touched; the backend whose service the catalog changed; both changes
// when the IR between was refused. Each is the IR lowered whole.
func TestPublisherCarriesTheChange(t *testing.T) {
	p, in, out, _ := newPublisher(t)
	state := processState()
	if err := p.Publish(state, 1, meshspec.WholeState); err != nil {
		t.Fatal(err)
	}
	if got := out.last().Changes; got.Follows(0) || got != nil && !got.All {
		t.Fatalf("the first IR's changes: %+v, want none named", got)
	}
	wantLike := func(what string, backends, endpoints []string) {
		t.Helper()
		out.mu.Lock()
		prev, dp := out.views[len(out.views)-2], out.views[len(out.views)-1]
		out.mu.Unlock()
		if !dp.Changes.Follows(prev.Seq) {
			t.Fatalf("%s: the IR names no change since the last one taken (%d): %+v", what, prev.Seq, dp.Changes)
		}
		if got := dp.Changes.SortedBackends(); !slices.Equal(got, backends) {
			t.Fatalf("%s: backends named %v, want %v", what, got, backends)
		}
		if got := dp.Changes.SortedEndpoints(); !slices.Equal(got, endpoints) {
			t.Fatalf("%s: endpoints named %v, want %v", what, got, endpoints)
		}
		whole, _, err := View(state, in.Snapshot(), Rules{})
		if err != nil {
			t.Fatal(err)
		}
		got := *dp
		got.Seq, got.Changes, whole.Revision = 0, nil, got.Revision
		if !reflect.DeepEqual(&got, whole) {
			t.Fatalf("%s: the IR lowered where the change names:\n%+v\nwant, lowered whole:\n%+v", what, got, *whole)
		}
	}
	state = meshspec.Clone(state)
	state.Endpoints = append(state.Endpoints, meshspec.Endpoint{Name: "api", Route: "/api", Traffic: map[string]float64{"static": 1}})
	if err := p.Publish(state, 2, meshspec.Touched{Endpoints: []string{"api"}}); err != nil {
		t.Fatal(err)
	}
	wantLike("an endpoint added", nil, []string{"api"})

	views := out.count()
	in.set("servemesh-node-n1", catalog.Instance{ID: "n1", Node: "n1", ConsulNode: "c1"})
	testutil.WaitFor(t, 5*time.Second, "an IR after the node's registration", func() bool { return out.count() > views })
	wantLike("a node's registration", []string{"run"}, nil)

	out.mu.Lock()
	out.refuse = errors.New("refused")
	out.mu.Unlock()
	state = meshspec.Clone(state)
	state.Backends[2].Replicas[0].Address = "127.0.0.1:2"
	if err := p.Publish(state, 3, meshspec.Touched{Backends: []string{"static"}}); err == nil {
		t.Fatal("the sink refused the IR, and Publish says nothing")
	}
	out.mu.Lock()
	out.refuse = nil
	out.mu.Unlock()
	state = meshspec.Clone(state)
	state.Endpoints[0].Traffic = map[string]float64{"static": 0.5, "ext": 0.5}
	if err := p.Publish(state, 4, meshspec.Touched{Endpoints: []string{"api"}}); err != nil {
		t.Fatal(err)
	}
	wantLike("a change after a refused one", []string{"static"}, []string{"api"})
}
